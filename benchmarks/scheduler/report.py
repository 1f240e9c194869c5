"""The scheduler benchmark's tables, the issue's targets and part (b)'s JSON.

Part (b) (benchmarks/scheduler/cluster.py) sets each simulated row against the bounds of
`sim.bounds` (`print_header`, `print_rows`), sums it up across workload seeds
(`print_across_seeds`), checks the issue's targets (`TARGETS`) on the default policy
(`SchedulerConfig()`'s) and the other incremental rows, each printed as met or NOT met, says
whether target 1 is within reach of any schedule (`print_reach`), and with `--json FILE` writes
all of it as one JSON object (`write_json`). `print_table` prints both parts' tables. It runs
nothing; the records it reads are `cluster.run_sim`'s. Exercised by the part (b)
runs in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.sim.bounds import Bounds
from benchmarks.sim.result import SimResult
from benchmarks.sim.workload import GPUS, Cost

TARGETS = {
    "max_bound_ratio": 1.15,  # makespan / max(work bound, critical path), at most
    "min_least_requests_ratio": 1.25,  # least-requests' makespan / ours, at least
    "max_migration_overhead_share": 0.02,  # re-prefill for moves / all engine work, at most
    "min_length_spearman": 0.6,  # predicted vs true lengths, at least
}
# the rows the targets are checked on (the default is one of them)
CANDIDATES = ("kv-incremental", "kv-predicted", "kv-tail")


def print_header(args: argparse.Namespace, cost: Cost, seed: int, bounds: Bounds) -> None:
    """The setting of one seed's rows and the bounds they are set against."""
    print(
        f"\n(b) simulated: {args.sim_engines} engines, one per {GPUS[args.sim_gpu].name}, "
        f"Qwen3-14B bf16; {args.sim_prompts} prompts x {args.sim_samples} rollouts (workload seed "
        f"{seed}), responses up to {args.sim_max_response} tokens; KV {args.sim_kv_tokens} "
        f"tokens/engine ({args.sim_kv_source}); max_num_seqs {args.sim_max_seqs}; kv step "
        f"{args.step_tokens} tokens; drain balance {args.drain_balance}; kv over-commit "
        f"{args.kv_overcommit}; prompt order {args.sim_order}"
    )
    print(
        f"cost ({args.sim_cost_source}): step = {cost.a_s * 1e3:.2f} ms + {cost.b_s * 1e6:.1f} us x "
        f"batch + {cost.c_s * 1e9:.1f} ns x context tokens; prefill {cost.p_s * 1e6:.1f} us/token"
    )
    if cost.max_draft:
        drafts = {b: cost.draft(b, b * 4096) for b in (1, 8, 32, 64, 256)}
        print(
            f"speculative decoding on every engine: each draft token accepted with probability "
            f"{cost.acceptance}, up to {cost.max_draft} a step at batches up to "
            f"{cost.spec_max_batch}; drafts per batch at 4K context each: {drafts}; the bounds "
            f"below are computed with it"
        )
    _print_bounds(cost, bounds)


def _print_bounds(cost: Cost, bounds: Bounds) -> None:
    work_lb, path_lb, batching_lb = bounds.work_s, bounds.critical_path_s, bounds.batching_s
    floor_s, floor_tokens = bounds.step_floor_s, bounds.step_floor_tokens
    full_load_s = bounds.full_load_path_s
    print(
        f"work bound (total work / total capacity) {work_lb:.1f} s; critical path (the slowest "
        f"trajectory alone on an engine: batch 1, its tool calls waited) {path_lb:.1f} s; max "
        f"{max(work_lb, path_lb):.1f} s"
    )
    if batching_lb is None:
        print(
            "batching bound: not computed with speculative decoding (a step makes several tokens)"
        )
    else:
        print(
            f"batching bound (sim.bounds.batching_bound_s: each trajectory waits out every step "
            f"it shares, and the steps it cannot share pay the fixed cost): {batching_lb:.1f} s = "
            f"{batching_lb / max(work_lb, path_lb):.3f} x max bound; no schedule goes below "
            f"{max(work_lb, path_lb, batching_lb):.1f} s"
        )
    print(
        f"step floor (estimate, not a bound; sim.bounds.step_floor_s): {floor_s:.1f} s = "
        f"{floor_tokens} decode steps x {cost.a_s * 1e3:.2f} ms on every engine "
        f"({bounds.num_step_floor} trajectories decode >= {floor_tokens} tokens, >= 1 per "
        f"engine) + each engine's share of the per-token work"
    )
    print(
        f"full-load path (not a bound; sim.bounds.full_load_path_s): {full_load_s:.1f} s = "
        f"{full_load_s / max(work_lb, path_lb):.3f} x max bound: the slowest trajectory on an "
        f"engine held at the work bound's batch and KV"
    )


def print_rows(records: list[dict[str, Any]], results: dict[str, SimResult]) -> None:
    """One seed's rows against the bounds, then where each row's time goes."""

    def fmt(x: float | None, spec: str, suffix: str = "") -> str:
        return "-" if x is None else f"{x:{spec}}{suffix}"

    header = ["policy", "makespan s", "x max bd", "x best bd", "x floor", "start bd s"]
    header += ["idle frac", "batch"]
    header += ["preempt", "KV mean", "moves", "move work", "rho", "static/x", "least-req/x"]
    table = []
    for rec in records:
        bound = max(rec["work_bound_s"], rec["critical_path_s"])
        table.append(
            [
                rec["policy"],
                f"{rec['makespan_s']:.1f}",
                f"{rec['makespan_s'] / bound:.3f}",
                f"{rec['makespan_s'] / best_bound_s(rec):.3f}",
                f"{rec['makespan_s'] / rec['step_floor_s']:.3f}",
                f"{rec['start_bound_s']:.1f}",
                f"{rec['idle_fraction']:.3f}",
                f"{rec['mean_batch']:.1f}",
                str(rec["num_preemptions"]),
                f"{rec['mean_kv_use']:.2f}",
                str(rec["num_migrations"]),
                f"{100 * rec['migration_overhead_share']:.2f}%",
                fmt(rec["length_spearman"], ".3f"),
                fmt(rec["static_ratio"], ".2f", "x"),
                fmt(rec["least_requests_ratio"], ".2f", "x"),
            ]
        )
    print_table(header, table)
    print(
        "best bd: max(work bd, crit path, batching bd); start bd: had each trajectory run alone "
        "from when it started; batch: tokens made an engine step; move work: re-prefill on the "
        "engine a trajectory moved to, as a share of all engine work; rho: Spearman of the "
        "predicted and true response lengths of each prompt's samples still unfinished when its "
        "first sample finished"
    )
    print(
        "\nwhere the time goes: when 50/90/99% of trajectories were done; the share of the makespan"
        "\nafter 90%; the last trajectory to finish: when it started and its own batch-1 time;"
        "\nper tenth of the makespan: busy fraction of engine time, mean batch while busy, and KV"
        "\nheld by running requests as a share of all engines' KV (the work bound assumes 1.00)"
    )
    header = ["policy", "t50/t90/t99 s", "after t90", "last: start/own s", "busy by tenth"]
    header += ["batch by tenth", "KV by tenth"]
    table = [
        [
            name,
            "/".join(f"{r.done_at(f):.0f}" for f in (0.5, 0.9, 0.99)),
            f"{1 - r.done_at(0.9) / r.makespan_s:.0%}",
            f"{r.last_start_s:.0f}/{r.last_own_s:.0f}",
            " ".join(f"{x:.2f}" for x in r.busy_by_tenth),
            " ".join(f"{x:.0f}" for x in r.batch_by_tenth),
            " ".join(f"{x:.2f}" for x in r.kv_by_tenth),
        ]
        for name, r in results.items()
    ]
    print_table(header, table)


def print_across_seeds(records: list[dict[str, Any]], seeds: list[int]) -> None:
    """Makespans per seed; ratios of the mean makespans, then the lowest and highest per seed."""
    by = {(r["policy"], r["seed"]): r["makespan_s"] for r in records}
    names = list(dict.fromkeys(r["policy"] for r in records))
    mean = {n: sum(by[n, x] for x in seeds) / len(seeds) for n in names}
    print(
        f"\n(b) across workload seeds {','.join(map(str, seeds))}: makespan s per seed; the ratios "
        "are of the mean makespans, then the lowest and highest per-seed ratio"
    )

    def ratios(n: str, base: str) -> str:
        if base not in mean:
            return "-"
        per_seed = [by[base, x] / by[n, x] for x in seeds]
        return f"{mean[base] / mean[n]:.2f}x ({min(per_seed):.2f}-{max(per_seed):.2f})"

    header = ["policy", *(f"seed {x}" for x in seeds), "mean s", "static/x", "least-req/x"]
    table = [
        [n, *(f"{by[n, x]:.1f}" for x in seeds), f"{mean[n]:.1f}"]
        + [ratios(n, "static"), ratios(n, "least-requests")]
        for n in names
    ]
    print_table(header, table)


def check_targets(records: list[dict[str, Any]], default: str) -> list[dict[str, Any]]:
    """The issue's targets on each candidate row and seed: value, target, met."""
    out = []
    for rec in records:
        if rec["policy"] not in (*CANDIDATES, default):
            continue
        bound = max(rec["work_bound_s"], rec["critical_path_s"])
        values = {
            "max_bound_ratio": rec["makespan_s"] / bound,
            "min_least_requests_ratio": rec["least_requests_ratio"],
            "max_migration_overhead_share": rec["migration_overhead_share"],
            "min_length_spearman": rec["length_spearman"],
        }
        for target, value in values.items():
            limit = TARGETS[target]
            met = value is not None and (
                value <= limit if target.startswith("max") else value >= limit
            )
            out.append(
                {
                    "policy": rec["policy"],
                    "seed": rec["seed"],
                    "target": target,
                    "value": value,
                    "limit": limit,
                    "met": met,
                }
            )
    return out


def print_targets(checks: list[dict[str, Any]], default: str) -> None:
    print(
        f"\n(b) the issue's targets, per seed (default policy: {default}); a value that could not "
        "be measured (its baseline not run) counts as not met"
    )
    names = {
        "max_bound_ratio": "makespan / max(work bd, crit path) <= 1.15",
        "min_least_requests_ratio": "least-requests / makespan >= 1.25",
        "max_migration_overhead_share": "move re-prefill / all work <= 2%",
        "min_length_spearman": "Spearman(predicted, true length) >= 0.6",
    }
    header = ["policy", "target", "values per seed", "met"]
    table = []
    for policy in dict.fromkeys(c["policy"] for c in checks):
        for target, text in names.items():
            rows = [c for c in checks if c["policy"] == policy and c["target"] == target]
            values = " ".join("-" if c["value"] is None else f"{c['value']:.3f}" for c in rows)
            met = "met" if all(c["met"] for c in rows) else "NOT met"
            label = f"{policy} (default)" if policy == default else policy
            table.append([label, text, values, met])
    print_table(header, table)


def best_bound_s(rec: dict[str, Any]) -> float:
    """The most any of the three bounds says: no schedule of this workload finishes before it."""
    return max(rec["work_bound_s"], rec["critical_path_s"], rec["batching_bound_s"] or 0.0)


def print_reach(records: list[dict[str, Any]], default: str) -> None:
    """Whether target 1 can be met at all: best bound / max(work bound, critical path) per seed."""
    rows = [r for r in records if r["policy"] == default and r["batching_bound_s"] is not None]
    if not rows:
        return
    limit = TARGETS["max_bound_ratio"]
    reach = {
        r["seed"]: best_bound_s(r) / max(r["work_bound_s"], r["critical_path_s"]) for r in rows
    }
    gap = [r["makespan_s"] / best_bound_s(r) for r in rows]
    out = [str(seed) for seed, x in reach.items() if x > limit]
    verdict = "not ruled out by the bounds"
    if len(out) == len(rows):
        verdict = "out of reach of every schedule on every seed"
    elif out:
        verdict = f"out of reach of every schedule on seed(s) {','.join(out)}"
    print(
        f"\ntarget 1 against the batching bound: per seed, no schedule goes below "
        f"{' '.join(f'{x:.3f}' for x in reach.values())} x max(work bd, crit path), so <= {limit} "
        f"is {verdict}; {default} takes "
        f"{' '.join(f'{x:.3f}' for x in gap)} x the best bound"
    )


def write_json(
    path: Path,
    *,
    args: argparse.Namespace,
    cost: Cost,
    records: list[dict[str, Any]],
    checks: list[dict[str, Any]],
    partial: dict[str, Any] | None,
    default: str,
) -> None:
    """Part (b) as one JSON object: the setting, the definitions, every row, target and step."""
    doc = {
        "gpu": GPUS[args.sim_gpu].name,
        "engines": args.sim_engines,
        "prompts": args.sim_prompts,
        "samples": args.sim_samples,
        "max_response_tokens": args.sim_max_response,
        "kv_tokens_per_engine": args.sim_kv_tokens,
        "max_num_seqs": args.sim_max_seqs,
        "prompt_order": args.sim_order,
        "cost": vars(cost),
        "default_policy": default,
        "definitions": {
            "work_bound_s": "total work / total capacity: every token at the cheapest per-token "
            "cost the KV and max_num_seqs allow, every prompt and tool answer prefilled once, "
            "no engine idle (with cost.max_draft > 0: speculating as an engine at that batch "
            "would)",
            "critical_path_s": "the slowest trajectory alone on an engine: prompt and tool "
            "answers prefilled, every token decoded at batch 1 (speculating as an engine at "
            "batch 1 would, with cost.max_draft > 0), every tool call waited in full",
            "batching_bound_s": "a lower bound (null with speculative decoding): the least T at "
            "which every trajectory can make its decode steps, waiting out each step it shares, "
            "and all engines can run the fixed cost of the steps that takes plus every token's "
            "per-token work and every prefill (sim.bounds.batching_bound_s)",
            "step_floor_s": "estimate, not a bound: the num_engines-th longest decode count x "
            "the fixed step cost, plus each engine's share of the per-token work",
            "full_load_path_s": "not a bound: the slowest trajectory's time when each of its "
            "decode steps costs what a step at the work bound's batch and KV does",
            "start_bound_s": "had every trajectory of this run run alone from when it started",
            "least_requests_ratio": "least-requests' makespan / this makespan",
            "migration_overhead_share": "time re-prefilling contexts on the engines trajectories "
            "moved to / all engines' busy time",
            "length_spearman": "Spearman rank correlation of predicted and true response lengths "
            "over each prompt's samples still unfinished when its first sample finished",
        },
        "targets": TARGETS,
        "runs": records,
        "target_checks": checks,
        "partial_rollout": partial,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {path}")


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Right-aligned columns under a dashed rule (both parts' tables)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=False))

    print(line(header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
