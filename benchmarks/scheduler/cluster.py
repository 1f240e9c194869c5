"""Part (b) of benchmarks/scheduler/bench.py: the simulated cluster.

Per workload seed, every selected policy (`sim.policies.POLICIES`) runs through the simulator
(`sim.model.simulate`, the real `Scheduler` inside); each row is set against (`sim.bounds`):
- the work bound (`lower_bound_s`): total work / total capacity, every token at the cheapest
  per-token cost the KV and `max_num_seqs` allow, no engine ever idle;
- the critical path (`lower_bound_s`): the slowest trajectory alone on an engine, from its first
  prefill to its last token: prompt and tool answers prefilled, every token decoded at batch 1,
  every tool call's latency waited in full;
- the batching bound (`batching_bound_s`), which makes the two pay for each other: a trajectory
  waits out every step it is in, so one that must finish by T can share its steps only so much,
  and the fixed cost of the steps it cannot share comes out of the engines' capacity. Where it
  exceeds 1.15 x max(work bound, critical path), target 1 is out of reach of every schedule;
- the step floor (`step_floor_s`, an estimate, not a bound);
- the full-load path (`full_load_path_s`, not a bound): the slowest trajectory's time on an
  engine held at the work bound's load. Above the work bound it says the two bounds pull against
  each other: an engine full enough for the work bound decodes its longest trajectories too
  slowly to finish by then, and one run lighter for them gives up throughput;
- the start-limited bound of its own run (`SimResult.start_bound_s`): had every trajectory run
  alone from the moment this policy started it. The time above it was lost to sharing engines;
  the time between it and the bounds, to starting late.
Then the issue's targets for the default policy (`SchedulerConfig()`'s) and the other
incremental rows; partial rollout (`sim.partial_rollout`), which trains on tokens up to a step
old and is therefore reported apart; and, with `--json FILE`, all of it as one JSON object. The
tables, targets and JSON are benchmarks/scheduler/report.py's. Tested at 1/32 scale in
tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from benchmarks.scheduler.report import (
    check_targets,
    print_across_seeds,
    print_header,
    print_reach,
    print_rows,
    print_table,
    print_targets,
    write_json,
)
from benchmarks.sim.bounds import Bounds, workload_bounds
from benchmarks.sim.model import simulate
from benchmarks.sim.partial_rollout import simulate_partial
from benchmarks.sim.policies import default_label, sched_config, selected
from benchmarks.sim.result import SimResult, mean_batch
from benchmarks.sim.workload import (
    GPUS,
    ORDERS,
    Cost,
    SimTraj,
    gpu_cost,
    gpu_kv_tokens,
    make_workload,
    order_groups,
)

# the rows `--sim-oracle` repeats with every true length known (hindsight, never a target row)
ORACLE_ROWS = ("kv-predicted", "kv-tail")
# and kv-incremental with its trajectories started by hindsight (`sim.hindsight.PeakAdmission`),
# told each trajectory's true length or only its prompt's mean
PEAK_ROWS = {"trajectory": "kv-peak (oracle)", "prompt": "kv-peak (prompt oracle)"}


def add_args(ap: argparse.ArgumentParser) -> None:
    """Part (b)'s flags."""
    ap.add_argument(
        "--cost", default=None, help="a,b,c,p for (b) instead of the GPU's spec-sheet model"
    )
    ap.add_argument(
        "--sim-gpu", choices=["mi300x", "h100"], default="mi300x", help="modeled GPU (b)"
    )
    ap.add_argument("--sim-engines", type=int, default=64)
    ap.add_argument("--sim-prompts", type=int, default=512)
    ap.add_argument("--sim-samples", type=int, default=32)
    ap.add_argument("--sim-max-response", type=int, default=8192)
    ap.add_argument(
        "--sim-kv-tokens", type=int, default=None, help="per engine (b); default: from the GPU"
    )
    ap.add_argument("--sim-max-seqs", type=int, default=256)
    ap.add_argument(
        "--sim-seeds",
        default="0,1,2",
        help="workload seeds for (b), comma list: one simulation of every policy per seed, then "
        "a summary across them (the ratios between policies move by several %% between seeds)",
    )
    ap.add_argument(
        "--sim-order",
        choices=ORDERS,
        default="data",
        help="prompt groups' order for (b): data, or with hindsight the hardest first or the "
        "easiest quarter last (what predicting lengths from a prompt's siblings could buy)",
    )
    ap.add_argument(
        "--sim-oracle",
        action="store_true",
        help="(b): also run kv-predicted and kv-tail told every trajectory's true length, and "
        "kv-incremental with its starts made by hindsight (`sim.hindsight`), told each "
        "trajectory's true length or its prompt's mean (what length prediction would buy; not "
        "checked as targets)",
    )
    ap.add_argument(
        "--sim-step-tokens", type=int, default=1024, help="kv per_turn/incremental step (b)"
    )
    ap.add_argument(
        "--sim-partial",
        type=lambda v: None if v == "none" else float(v),
        default=0.25,
        help="(b): partial rollout's over-provision (0.25: a quarter more prompt groups than a "
        "step needs), reported apart; 'none' skips it",
    )
    ap.add_argument(
        "--sim-spec",
        default=None,
        metavar="ACCEPTANCE[,MAX_DRAFT[,MAX_BATCH]]",
        help="(b): speculative decoding on every engine of every row, as `--speculative` runs "
        "it: each draft token accepted with this probability once the ones before it were, up "
        "to MAX_DRAFT (default 4) drafts a step at batches up to MAX_BATCH (default 32; "
        "`rstar2 rollout --speculative`'s), as many as pay there "
        "(sim.workload.Cost.draft); the bounds are computed with it too. `rstar2 rollout "
        "--speculative` prints the acceptance it measured. Default: none",
    )
    ap.add_argument("--json", default=None, help="(b, or a with --part a): JSON of every number")


def run(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """Part (b): the cost and KV from the flags, then `run_sims`; `error` reports a bad flag."""
    gpu = GPUS[args.sim_gpu]
    if args.cost:
        a_s, b_s, c_s, p_s = map(float, args.cost.split(","))
        cost, args.sim_cost_source = Cost(a_s=a_s, b_s=b_s, c_s=c_s, p_s=p_s), "--cost"
    else:
        cost, args.sim_cost_source = gpu_cost(gpu), f"{gpu.name} spec sheet, sim.workload"
    if args.sim_spec:
        acceptance, max_draft, max_batch = [*args.sim_spec.split(","), "", ""][:3]
        try:
            cost = replace(
                cost,
                acceptance=float(acceptance),
                max_draft=int(max_draft or 4),
                spec_max_batch=int(max_batch or cost.spec_max_batch),
            )
        except ValueError as e:
            error(f"--sim-spec {args.sim_spec}: {e}")
    args.sim_kv_source = "--sim-kv-tokens"
    if args.sim_kv_tokens is None:
        args.sim_kv_tokens = gpu_kv_tokens(gpu)
        args.sim_kv_source = "0.8 of GPU memory - weights - 4 GB, 160 KiB/token"
    args.step_tokens = args.sim_step_tokens
    run_sims(args, cost)


def run_sims(args: argparse.Namespace, cost: Cost) -> None:
    """Every seed, the summary across seeds, the targets, partial rollout, JSON."""
    seeds = [int(x) for x in args.sim_seeds.split(",")]
    records: list[dict[str, Any]] = []
    for seed in seeds:
        print(f"\n== (b) workload seed {seed}", flush=True)
        records += run_sim(args, cost=cost, seed=seed)
    if len(seeds) > 1:
        print_across_seeds(records, seeds)
    default = default_label()
    checks = check_targets(records, default)
    print_targets(checks, default)
    print_reach(records, default)
    partial = None
    if args.sim_partial:
        partial = run_partial(args, cost=cost, seeds=seeds, records=records, default=default)
    if args.json:
        write_json(
            Path(args.json),
            args=args,
            cost=cost,
            records=records,
            checks=checks,
            partial=partial,
            default=default,
        )


def run_sim(args: argparse.Namespace, cost: Cost, seed: int) -> list[dict[str, Any]]:
    """Simulate every selected policy on one workload; print the tables; one record per row."""
    work = make_workload(
        num_prompts=args.sim_prompts,
        num_samples=args.sim_samples,
        max_response=args.sim_max_response,
        seed=seed,
    )
    work = order_groups(
        work, num_samples=args.sim_samples, order=args.sim_order, max_response=args.sim_max_response
    )
    bounds = workload_bounds(
        work,
        num_engines=args.sim_engines,
        capacity_tokens=args.sim_kv_tokens,
        max_response=args.sim_max_response,
        cost=cost,
        max_num_seqs=args.sim_max_seqs,
    )
    results = _simulate_rows(args, cost=cost, work=work)
    records = [
        _record(seed=seed, name=name, r=r, bounds=bounds, results=results)
        for name, r in results.items()
    ]
    print_header(args, cost=cost, seed=seed, bounds=bounds)
    print_rows(records, results)
    return records


def _simulate_rows(
    args: argparse.Namespace, cost: Cost, work: list[SimTraj]
) -> dict[str, SimResult]:
    """Every selected row on `work` (with `--sim-oracle`, the hindsight rows too), by label."""
    runs: list[tuple[str, str, dict[str, Any]]] = [(name, name, {}) for name in selected(args)]
    if args.sim_oracle:  # what-if rows: the same policies told every true length
        runs += [(f"{n} (oracle)", n, {"oracle": True}) for n in ORACLE_ROWS if n in selected(args)]
        runs += [(row, "kv-incremental", {"peak_oracle": k}) for k, row in PEAK_ROWS.items()]
    results = {}
    for label, name, hindsight in runs:
        start = time.perf_counter()
        results[label] = simulate(
            work,
            sched_config(args, name=name, max_active=args.sim_max_seqs),
            num_engines=args.sim_engines,
            capacity_tokens=args.sim_kv_tokens,
            max_response=args.sim_max_response,
            cost=cost,
            max_num_seqs=args.sim_max_seqs,
            **hindsight,
        )
        wall_s = time.perf_counter() - start
        print(
            f"  simulated {label}: {results[label].makespan_s:.1f} s ({wall_s:.0f} s wall)",
            flush=True,
        )
    return results


def _record(
    seed: int, name: str, r: SimResult, bounds: Bounds, results: dict[str, SimResult]
) -> dict[str, Any]:
    """Row `name`'s numbers as they go to the tables and the JSON."""

    def ratio(base: str) -> float | None:
        return results[base].makespan_s / r.makespan_s if base in results else None

    return {
        "seed": seed,
        "policy": name,
        "makespan_s": r.makespan_s,
        "work_bound_s": bounds.work_s,
        "critical_path_s": bounds.critical_path_s,
        "batching_bound_s": bounds.batching_s,
        "step_floor_s": bounds.step_floor_s,
        "full_load_path_s": bounds.full_load_path_s,
        "start_bound_s": r.start_bound_s,
        "least_requests_ratio": ratio("least-requests"),
        "static_ratio": ratio("static"),
        "migration_overhead_share": r.migration_overhead_share,
        "num_migrations": r.num_migrations,
        "num_preemptions": r.num_preemptions,
        "idle_fraction": r.idle_fraction,
        "engine_steps": r.num_steps,
        "mean_batch": mean_batch(r),
        "mean_kv_use": r.mean_kv_use,
        "length_spearman": r.length_spearman,
        "num_predicted": r.num_predicted,
    }


def run_partial(
    args: argparse.Namespace,
    cost: Cost,
    seeds: list[int],
    records: list[dict[str, Any]],
    default: str,
) -> dict[str, Any]:
    """Partial rollout with the default policy: steps whose fresh prompts are those of workload
    seeds `seeds` in turn, against the whole-batch makespan of each seed."""
    steps = simulate_partial(
        num_prompts=args.sim_prompts,
        num_samples=args.sim_samples,
        max_response=args.sim_max_response,
        seed=seeds[0],
        num_steps=len(seeds),
        over_provision=args.sim_partial,
        config=sched_config(args, name=default, max_active=args.sim_max_seqs),
        num_engines=args.sim_engines,
        capacity_tokens=args.sim_kv_tokens,
        cost=cost,
        max_num_seqs=args.sim_max_seqs,
    )
    whole = {r["seed"]: r["makespan_s"] for r in records if r["policy"] == default}
    print(
        f"\n(b) partial rollout, {default}, separate from the above (it trains on tokens up to a "
        f"step old): each step starts {args.sim_partial:.0%} more prompt groups than the "
        f"{args.sim_prompts} it needs; once {args.sim_prompts} groups are whole it sends no more "
        f"requests, waits for those in flight (at most {args.sim_step_tokens} tokens each with the "
        "incremental scheduler) and tool calls, and carries the unfinished samples into the next "
        "(re-prefilled there), as rl-stage's rollout.over_provision does; step k's fresh prompts are "
        "workload seed k's, so it is set against that seed's whole-batch makespan. Step 0 has "
        "nothing carried in, so the later steps show the steady state."
    )
    header = ["step", "seed", "step s", "whole batch s", "whole/step", "carried out", "old tokens"]
    header.append("move work")
    rows, out = [], []
    for k, (seed, step) in enumerate(zip(seeds, steps, strict=True)):
        base = whole.get(seed)
        rows.append(
            [
                str(k),
                str(seed),
                f"{step.makespan_s:.1f}",
                "-" if base is None else f"{base:.1f}",
                "-" if base is None else f"{base / step.makespan_s:.2f}x",
                str(step.num_carried),
                f"{step.off_policy_share:.1%}",
                f"{100 * step.migration_overhead_share:.2f}%",
            ]
        )
        out.append({"step": k, "seed": seed, "whole_batch_s": base, **vars(step)})
    print_table(header, rows)
    print(
        "old tokens: share of the decoded tokens of the step's whole groups made in an earlier step"
    )
    return {"policy": default, "over_provision": args.sim_partial, "steps": out}
