"""The rollout corrections side by side: none, token TIS, geometric sequence mask, bypass.

From one SFT checkpoint and one seed, `rstar2 rl-stage` runs the same GRPO-RoC recipe once per
correction setting (the `correction:` section, rstar2cli/rl/correction.py), the engines in
`--engine-dtype` (bfloat16 by default, against the trainer's float32: the mismatch a GPU run
has; float32 engines on a CPU agree with the trainer to ~1e-10 and every setting is then the
same run). A short extra run with float32 engines measures that floor. Per step and arm it
reports training accuracy (the binary answer reward of the rollouts), the tool-error share in
correct trajectories, mismatch_kl, the largest importance ratio, the shares of tokens and
sequences truncated or masked, and step and update seconds; the held-out accuracy at the last
step; a PNG, a JSON and a table.

Run (from the repository root, after `make smollm2` and an SFT cold start, e.g. the pretrained
quickstart's runs/qs-smollm2/sft/final):
    python -m benchmarks.correction_ab --model runs/qs-smollm2/sft/final --out runs/correction_ab \
      --json runs/correction_ab/correction_ab.json
Each arm resumes if interrupted (rerun the same command). Extra `--set` values go to every arm;
`--report-only` redoes the table, plot and JSON from the arms already in --out.
Measured (that command plus `--steps 20 --fp32-steps 0 --set rollout.num_prompts_per_step=2 --set
eval.every_steps=20 --set eval.num_problems=32`, seeds 0 and 1, 35 min each): mismatch_kl ~4e-3
with bf16 engines; training accuracy in steps 11-20 none 77% / 44%, token TIS 68% / 38%,
geometric 51% / 50% (41-46% of sequences masked), bypass 36% / 56%: the seeds move it more than
the settings. README has the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.stage_runs import REPO, mean, plot_steps, read_rows, run_stage
from rstar2cli.rl.correction import METRIC_KEYS

_OFF = [
    "correction.token_is_cap=null",
    "correction.token_mask_low=null",
    "correction.token_mask_high=null",
    "correction.seq_mask_low=null",
    "correction.seq_mask_high=null",
    "correction.bypass=false",
    "correction.mask_stale=false",
]
ARMS = {
    "none": [],
    "token-TIS": ["correction.token_is_cap=2.0"],
    "geometric": ["correction.seq_mask_low=0.99", "correction.seq_mask_high=1.01"],
    "bypass": ["correction.bypass=true"],
}
# the per-step numbers kept in the JSON (and the table's means)
KEYS = [
    "step",
    "reward",
    "tool_error_share_correct",
    "tool_calls_per_rollout",
    *METRIC_KEYS,
    "clip_frac",
    "grad_norm",
    "time_rollout_s",
    "time_update_s",
    "time_step_s",
    "eval_accuracy",
]


def arm_sets(name: str, *, steps: int, seed: int, dtype: str, extra: list[str]) -> list[str]:
    """Every `--set` of an arm: all corrections off, then the arm's own, then the shared ones."""
    common = [f"train.num_steps={steps}", f"train.seed={seed}", f"rollout.dtype={dtype}"]
    return [*_OFF, *ARMS[name], *common, *extra]


def step_rows(rows: list[dict]) -> list[dict]:
    """One dict per training step with KEYS, after the step-0 held-out eval's when there is one
    (its other keys None)."""
    return [{k: r.get(k) for k in KEYS} for r in rows if "reward" in r or "eval_accuracy" in r]


def summarise(steps: list[dict]) -> dict[str, float | None]:
    evals = [s["eval_accuracy"] for s in steps if s["eval_accuracy"] is not None]
    steps = [s for s in steps if s["reward"] is not None]

    def col(key: str) -> list[float | None]:
        return [s[key] for s in steps]

    first, last = steps[: len(steps) // 2], steps[len(steps) // 2 :]
    return {
        "steps": len(steps),
        "accuracy_first_half": mean([s["reward"] for s in first]),
        "accuracy_second_half": mean([s["reward"] for s in last]),
        "tool_error_share_correct": mean(col("tool_error_share_correct")),
        "tool_calls_per_rollout": mean(col("tool_calls_per_rollout")),
        "clip_frac": mean(col("clip_frac")),
        "mismatch_kl": mean(col("mismatch_kl")),
        "is_ratio_max": max((v for v in col("is_ratio_max") if v is not None), default=None),
        "truncated_token_share": mean(col("truncated_token_share")),
        "masked_token_share": mean(col("masked_token_share")),
        "masked_sequence_share": mean(col("masked_sequence_share")),
        "median_step_s": statistics.median(v for v in col("time_step_s") if v is not None),
        "median_update_s": statistics.median(v for v in col("time_update_s") if v is not None),
        "eval_start": evals[0] if len(evals) > 1 else None,
        "eval_end": evals[-1] if evals else None,
    }


PANELS = [
    ("reward", "training accuracy (reward)"),
    ("tool_calls_per_rollout", "tool calls per rollout"),
    ("masked_sequence_share", "sequences masked"),
    ("mismatch_kl", "mismatch_kl (engine vs trainer, k3)"),
    ("time_step_s", "step seconds"),
]


def print_table(summary: dict[str, dict[str, float | None]]) -> None:
    cols = [
        ("acc 1st half", "accuracy_first_half", "pct"),
        ("acc 2nd half", "accuracy_second_half", "pct"),
        ("held-out start", "eval_start", "pct"),
        ("held-out end", "eval_end", "pct"),
        ("tool err in correct", "tool_error_share_correct", "pct"),
        ("tool calls/rollout", "tool_calls_per_rollout", "f2"),
        ("PPO clipped", "clip_frac", "pct"),
        ("mismatch_kl", "mismatch_kl", "sci"),
        ("max ratio", "is_ratio_max", "f3"),
        ("tok truncated", "truncated_token_share", "pct"),
        ("tok masked", "masked_token_share", "pct"),
        ("seq masked", "masked_sequence_share", "pct"),
        ("step s", "median_step_s", "f1"),
        ("update s", "median_update_s", "f1"),
    ]
    forms = {"pct": "{:.1%}", "sci": "{:.2e}", "f3": "{:.3f}", "f2": "{:.2f}", "f1": "{:.1f}"}
    print("\n" + f"{'arm':<14}" + "".join(f"{c:>20}" for c, _, _ in cols))
    for name, s in summary.items():
        cells = [forms[f].format(s[k]) if s[k] is not None else "-" for _, k, f in cols]
        print(f"{name:<14}" + "".join(f"{c:>20}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="SFT'd model folder every arm starts from")
    ap.add_argument("--out", type=Path, default=REPO / "runs/correction_ab")
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes/pretrained/rl.yaml")
    ap.add_argument("--json", type=Path, default=None, help="write every arm's steps and summary")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument(
        "--fp32-steps", type=int, default=2, help="steps of the float32-engine run (0: skip it)"
    )
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override, every arm")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="redo the plot, table and JSON from the arms' metrics.jsonl in --out; run nothing",
    )
    args = ap.parse_args()
    if not args.model and not args.report_only:
        ap.error("--model is required (the SFT'd folder every arm starts from)")
    runs: list[tuple[str, str, str, int]] = [
        (a, a, args.engine_dtype, args.steps) for a in args.arms
    ]
    if args.fp32_steps:
        runs.append(("none, fp32 engine", "none", "float32", args.fp32_steps))
    results: dict[str, list[dict]] = {}
    for label, arm, dtype, steps in runs:
        folder = args.out / label.replace(", ", "_").replace(" ", "_").lower()
        if args.report_only:
            rows = read_rows(folder / "metrics.jsonl")
        else:
            sets = arm_sets(arm, steps=steps, seed=args.seed, dtype=dtype, extra=args.sets)
            rows = run_stage(label, model=args.model, out=folder, recipe=args.recipe, sets=sets)
        results[label] = step_rows(rows)
    summary = {name: summarise(steps) for name, steps in results.items()}
    png = args.out / "correction_ab.png"
    plot_steps(
        results,
        panels=PANELS,
        title="Rollout corrections from one SFT model and seed (bf16 engines, fp32 trainer)",
        path=png,
        log_keys=("mismatch_kl",),
    )
    print_table(summary)
    print(f"plot: {png}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "steps": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
