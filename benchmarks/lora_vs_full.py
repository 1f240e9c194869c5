"""LoRA RL against whole-weight RL: the same SFT model, recipe, seed and steps, three arms.

Runs `rstar2 rl-stage` once per arm from `--model` (an SFT'd model's final/) with `--recipe`
(default recipes/pretrained/rl.yaml, its 10 steps), each into OUT/<arm>/:
- whole: the recipe as it is (every weight trains);
- lora16, lora64 (`--ranks`): `train.lora` on with that rank, alpha = 2 x rank, and the learning
  rate times `--lora-lr-scale` (10 by default: LoRA's usual learning rate is about ten times
  whole-weight training's, since the adapters start at zero and move the weights less per step).
Then `rstar2 eval` of each arm's final/ (and of the SFT model, the "sft" row) on the held-out
file: `--eval-problems` problems x `--eval-samples` samples at `--eval-temperature`, with the
recipe's turn and response limits.
Per arm, from its metrics.jsonl: update trained tokens/s (model tokens trained over all steps /
the steps' update seconds), weight-push seconds per step (mean time_sync_s); from the rl-stage
process: its peak RSS (VmHWM from /proc, read until it exits). On a CPU the trainer runs in that
process and the vLLM engine in its own, so the peak is the trainer's plus the driver's own
(imports, rollout records). Ratios are against the whole arm; the targets: update at least 1.5x,
memory at most 0.5x, held-out accuracy within 5 points.
An arm already finished (OUT/<arm>/bench.json) is read back, not rerun; an interrupted one resumes
(rl-stage's own checkpoints; its peak memory is then the resumed process's).

Run (from the repository root; the SFT model as the pretrained quickstart makes it):
    rstar2 sft-coldstart --recipe recipes/pretrained/sft.yaml \
        --set model=models/smollm2-135m-instruct --out runs/smollm2-sft
    python -m benchmarks.lora_vs_full --model runs/smollm2-sft/final --out runs/lora_vs_full \
        --json runs/lora_vs_full/lora_vs_full.json
A check at the tiny model's size (minutes):
    rstar2 sft-coldstart --recipe recipes/tiny/sft.yaml --out runs/tiny-sft
    python -m benchmarks.lora_vs_full --model runs/tiny-sft/final --recipe recipes/tiny/rl.yaml \
        --steps 2 --eval-problems 8 --eval-samples 2 --set eval.every_steps=0 \
        --out runs/lora_vs_full_tiny
It ran end to end in 8.7 min on 2 shared cores. Its numbers say nothing about LoRA: at 0.36M
parameters the trainer's state is tiny next to the driver's own memory, and 16 eval samples are
noise. The SmolLM2 run above is the measurement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.stage_runs import REPO, read_rows


def arm_sets(rank: int | None, lr: float, lr_scale: float) -> list[str]:
    """The `--set` values of an arm (None: whole weights)."""
    if rank is None:
        return []
    return [
        "train.lora.enabled=true",
        f"train.lora.rank={rank}",
        f"train.lora.alpha={2 * rank}",
        f"train.lr={lr * lr_scale!r}",
    ]


class PeakMemory:
    """Reads a process's VmHWM (its peak RSS, kept by the kernel) until the process ends."""

    def __init__(self, pid: int, period_s: float = 0.5):
        self.pid, self.period_s, self.peak_kb = pid, period_s, 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        status = Path(f"/proc/{self.pid}/status")
        while True:
            try:
                text = status.read_text()
            except OSError:
                return
            for line in text.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            time.sleep(self.period_s)

    def peak_mb(self) -> float:
        self._thread.join(timeout=5)
        return self.peak_kb / 1024


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "rstar2cli.cli", *argv]


def run_arm(name: str, sets: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """rl-stage for one arm (or its saved numbers); its speed and memory numbers."""
    out = args.out / name
    saved = out / "bench.json"
    if saved.exists():
        return json.loads(saved.read_text())
    cmd = _cli("rl-stage", "--recipe", str(args.recipe), "--init-from", str(args.model))
    cmd += ["--out", str(out)]
    for s in [f"train.num_steps={args.steps}", *args.set, *sets]:
        cmd += ["--set", s]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO)
    memory = PeakMemory(proc.pid)
    if proc.wait() != 0:
        raise SystemExit(f"{name}: rl-stage exited with {proc.returncode}")
    rows = [r for r in read_rows(out / "metrics.jsonl") if "step" in r]
    tokens = sum(r.get("num_train_tokens", 0) for r in rows)
    update_s = sum(r["time_update_s"] for r in rows)
    result = {
        "arm": name,
        "sets": sets,
        "steps": len(rows),
        "train_tokens": tokens,
        "update_s": update_s,
        "update_tokens_per_s": tokens / update_s if update_s else None,
        "push_s": sum(r["time_sync_s"] for r in rows) / max(1, len(rows)),
        "peak_rss_mb": memory.peak_mb(),
        "reward_first": rows[0].get("reward") if rows else None,
        "reward_last": rows[-1].get("reward") if rows else None,
        "wall_s": time.perf_counter() - began,
    }
    saved.write_text(json.dumps(result, indent=2) + "\n")
    return result


def evaluate(label: str, model: Path, args: argparse.Namespace) -> float | None:
    """Held-out accuracy (mean over problems x samples) of `model`, from `rstar2 eval`."""
    from rstar2cli.fileio import read_jsonl_if_exists
    from rstar2cli.recipe import load_recipe
    from rstar2cli.rl.stage_recipe import RlRecipe

    recipe = load_recipe(args.recipe, RlRecipe, sets=args.set)
    test = args.eval_data or recipe.data.eval
    if test is None:
        raise SystemExit("no held-out file: the recipe has no data.eval; pass --eval-data")
    out = args.out / "eval"
    cmd = _cli("eval", "--model", str(model), "--data", str(test), "--label", label)
    cmd += ["--limit", str(args.eval_problems), "--samples", str(args.eval_samples)]
    cmd += ["--temperature", str(args.eval_temperature), "--seed", str(args.seed)]
    cmd += ["--max-turns", str(recipe.rollout.max_turns)]
    cmd += ["--max-response-tokens", str(recipe.rollout.max_response_tokens), "--out", str(out)]
    print(f"== eval {label}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    rows = [r for r in read_jsonl_if_exists(out / "results.jsonl") if r.get("label") == label]
    return sum(1 for r in rows if r["correct"]) / len(rows) if rows else None


def ratio(a: float | None, b: float | None) -> str:
    """a / b as "1.23x", or "-" when either is missing."""
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_table(results: list[dict[str, Any]], base_accuracy: float | None) -> None:
    whole = results[0]
    head = f"{'arm':8s}{'upd tok/s':>11s}{'x':>7s}{'peak MB':>10s}{'x':>7s}{'push s':>9s}"
    print("\n" + head + f"{'x':>7s}{'held-out':>10s}{'pts':>8s}")
    for r in results:
        acc, whole_acc = r.get("accuracy"), whole.get("accuracy")
        points = "-" if acc is None or whole_acc is None else f"{100 * (acc - whole_acc):+.1f}"
        print(
            f"{r['arm']:8s}{r['update_tokens_per_s'] or 0:11.1f}"
            f"{ratio(r['update_tokens_per_s'], whole['update_tokens_per_s']):>7s}"
            f"{r['peak_rss_mb']:10.0f}{ratio(r['peak_rss_mb'], whole['peak_rss_mb']):>7s}"
            f"{r['push_s']:9.2f}{ratio(r['push_s'], whole['push_s']):>7s}"
            f"{_pct(acc):>10s}{points:>8s}"
        )
    print(f"held-out accuracy of the SFT model they start from: {_pct(base_accuracy)}")


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the SFT'd model's final/")
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes/pretrained/rl.yaml")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=10, help="RL steps per arm")
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64], help="LoRA arms' ranks")
    ap.add_argument("--lora-lr-scale", type=float, default=10.0, help="LoRA lr = recipe lr x this")
    ap.add_argument("--eval-data", type=Path, help="held-out file (default: the recipe's)")
    ap.add_argument("--eval-problems", type=int, default=50)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--eval-temperature", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0, help="eval sampling seed")
    ap.add_argument("--set", action="append", default=[], help="extra recipe override, every arm")
    ap.add_argument("--json", type=Path, help="write the results here")
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    from rstar2cli.recipe import load_recipe
    from rstar2cli.rl.stage_recipe import RlRecipe

    args.out.mkdir(parents=True, exist_ok=True)
    lr = load_recipe(args.recipe, RlRecipe, sets=args.set).train.lr
    arms: list[tuple[str, int | None]] = [("whole", None), *((f"lora{r}", r) for r in args.ranks)]
    results = [run_arm(name, arm_sets(rank, lr, args.lora_lr_scale), args) for name, rank in arms]
    base_accuracy = evaluate("sft", args.model, args)
    for r in results:
        r["accuracy"] = evaluate(r["arm"], args.out / r["arm"] / "final", args)
    print_table(results, base_accuracy)
    if args.json:
        summary = {"args": {k: str(v) for k, v in vars(args).items()}, "arms": results}
        args.json.write_text(json.dumps(summary | {"sft_accuracy": base_accuracy}, indent=2) + "\n")


if __name__ == "__main__":
    main()
