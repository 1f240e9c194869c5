"""The scheduler benchmark's policy rows, and the flags that make each row's `SchedulerConfig`.

Both parts of benchmarks/scheduler/bench.py (scheduler/real.py on real engines,
scheduler/cluster.py in simulation) run the same rows with the same scheduler flags: `POLICIES`
names the fields that make each policy, `add_scheduler_args` declares the rest, `sched_config`
puts them together, and `default_label` is the row `SchedulerConfig()`'s defaults make (the
issue's targets are checked on it). Nothing here runs a policy. Tested in
tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import argparse
from typing import Any

from rstar2cli.scheduler.scheduler import SchedulerConfig

# The tail engines' KV budget in the `kv-tail` row (a fraction of an engine's KV): the best of
# 0.3 and 0.5 in 1/8-scale runs (neither beat `kv-predicted`).
TAIL_KV_FRACTION = 0.3

# label -> the SchedulerConfig fields that make the policy (the rest come from the command line)
POLICIES: dict[str, dict[str, Any]] = {
    "kv-full": dict(policy="kv", kv_mode="full", admission="data"),
    "kv-per_turn": dict(policy="kv", kv_mode="per_turn", admission="data"),
    "kv-incremental": dict(policy="kv", kv_mode="incremental", admission="data"),
    "kv-predicted": dict(policy="kv", kv_mode="incremental", admission="predicted"),
    "kv-tail": dict(
        policy="kv", kv_mode="incremental", admission="predicted", tail_kv_fraction=TAIL_KV_FRACTION
    ),
    "static": dict(policy="static", kv_mode="full"),
    "least-requests": dict(policy="least-requests", kv_mode="full"),
}


def selected(args: argparse.Namespace) -> list[str]:
    """The rows `--policies` names, in its order (labels not in `POLICIES` are dropped); all by
    default."""
    if not args.policies:
        return list(POLICIES)
    return [name for name in args.policies.split(",") if name in POLICIES]


def default_label() -> str:
    """The row that `SchedulerConfig()`'s defaults make (the targets are checked on it)."""
    default = SchedulerConfig()
    for name, fields in POLICIES.items():
        if all(getattr(default, k) == v for k, v in fields.items()) and (
            "tail_kv_fraction" in fields or default.tail_kv_fraction is None
        ):
            return name
    raise AssertionError("no benchmark row runs SchedulerConfig's defaults")


def sched_config(args: argparse.Namespace, name: str, max_active: int | None) -> SchedulerConfig:
    """The scheduler settings of row `name`, from the command line (both parts)."""
    return SchedulerConfig(
        **POLICIES[name],
        step_tokens=args.step_tokens,
        max_active_per_engine=max_active,
        migrate_after_s=args.migrate_after_s,
        drain_balance=args.drain_balance,
        kv_overcommit=args.kv_overcommit,
    )


def add_scheduler_args(ap: argparse.ArgumentParser) -> None:
    """The flags `sched_config` reads (part (b) sets `step_tokens` from `--sim-step-tokens`)."""
    ap.add_argument("--step-tokens", type=int, default=256, help="kv per_turn/incremental step (a)")
    ap.add_argument("--policies", default=None, help="comma list of labels to run (default: all)")
    ap.add_argument(
        "--migrate-after-s",
        type=float,
        default=SchedulerConfig.migrate_after_s,
        help="kv incremental (a, b)",
    )
    ap.add_argument(
        "--drain-balance",
        type=lambda v: None if v == "none" else float(v),
        default=SchedulerConfig.drain_balance,
        help="kv incremental (a, b): the drain's move threshold; 'none' turns the moves off",
    )
    ap.add_argument(
        "--kv-overcommit",
        type=float,
        default=SchedulerConfig.kv_overcommit,
        help="kv per_turn/incremental (a, b): the ledger's budget as a multiple of the KV",
    )
