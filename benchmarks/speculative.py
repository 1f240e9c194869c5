"""Speculative decoding on real engines: `rstar2 rollout` with and without `--speculative`.

Runs the same rollout (model, problems, samples, seed) both ways, interleaved `--repeats` times,
each in a fresh `rstar2 rollout` process, and prints per mode the median makespan (the rollout
itself, from its stats.json: engine start-up is not in it), generated tokens/s, the draft
acceptance and the mean reward, then the ratio of the makespans. The samples differ between the
two modes (drafts change how each request's random numbers are drawn) but follow the same
distribution, so the rewards should agree within sampling noise.

What it measures is this model on this machine: on a CPU the tiny quickstart model (its
defaults below, after `make quickstart`) samples at temperature 1 too freely for n-gram drafts,
and verifying them costs compute. On a GPU with a real model, run it with `--model` and
`--data`; benchmarks/scheduler_bench.py `--sim-spec` takes the acceptance it prints.

    python benchmarks/speculative.py                       # after `make quickstart`
    python benchmarks/speculative.py --model M --data D --speculative ngram:4:64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("baseline", "speculative")


def run_once(args, mode: str, out: Path) -> dict:
    """One `rstar2 rollout`; its stats.json numbers and the mean reward of what it wrote."""
    cmd = [
        sys.executable, "-m", "rstar2cli.cli", "rollout", "--model", args.model, "--data",
        args.data, "--samples", str(args.samples), "--seed", str(args.seed), "--engines",
        str(args.engines), "--out", str(out),
    ]  # fmt: skip
    if mode == "speculative":
        cmd += ["--speculative", args.speculative]
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
    ap.add_argument("--speculative", default="ngram:4", metavar="METHOD:TOKENS[:MAX_BATCH]")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved")
    args = ap.parse_args()
    for path in (args.model, args.data):
        if not Path(path).exists():
            ap.error(f"{path} not found: run `make quickstart` first, or pass --model and --data")
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for mode in MODES:
                runs[mode].append(run_once(args, mode, Path(tmp) / f"{mode}{r}.jsonl"))
                print(f"  {mode} run {r + 1}: {runs[mode][-1]['makespan_s']:.1f} s", flush=True)
    print(
        f"\n{args.model} on {args.data}: {args.samples} samples per problem, seed {args.seed}, "
        f"{args.engines} engine(s); speculative = {args.speculative}; medians of {args.repeats}"
    )
    print(
        f"{'mode':>12}  {'makespan s':>10}  {'tokens/s':>9}  {'drafts':>8}  {'accept':>6}  reward"
    )
    medians = {}
    for mode in MODES:
        rs = runs[mode]
        medians[mode] = statistics.median(x["makespan_s"] for x in rs)
        acceptance = [x["draft_acceptance"] for x in rs if x["draft_acceptance"] is not None]
        print(
            f"{mode:>12}  {medians[mode]:>10.1f}  "
            f"{statistics.median(x['tokens_per_s'] for x in rs):>9.0f}  "
            f"{statistics.median(x['draft_tokens'] for x in rs):>8.0f}  "
            f"{statistics.median(acceptance) if acceptance else float('nan'):>6.2f}  "
            f"{statistics.mean(x['reward'] for x in rs):.3f}"
        )
    print(f"\nbaseline / speculative makespan: {medians['baseline'] / medians['speculative']:.2f}x")


if __name__ == "__main__":
    main()
