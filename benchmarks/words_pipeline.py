"""Word problems on SmolLM2: base model, SFT and GRPO-RoC, each evaluated on GSM8K and held-out words.

The whole measured chain of issue "Beyond arithmetic", run with the real commands one after the
other (each a `python -m rstar2cli.cli` subprocess from the repository root):
  1. `prepare-data --synthetic words` into OUT/data (train, and a test split of held-out templates
     and phrasings);
  2. `eval` of the base model on GSM8K test (the first 200 problems) and on the held-out words
     (the first 100), 4 samples each at T 0.6, 3 turns, 512 response tokens: the budget of the
     README's GSM8K table, the same for every checkpoint (on two engines, one per core);
  3. `sft-coldstart --recipe recipes/pretrained/words_sft.yaml` (words + arith transcripts), eval;
     with `--sft-cycles N`, the recipe runs N times, each from the last one's model, on words
     newly drawn with seed + 1, seed + 2, ... (the training templates with new numbers);
  4. `rl-stage --recipe recipes/pretrained/words_rl.yaml` on the words train split, eval.
Then it prints a table (avg@4, pass@4, tool calls per trajectory and the share of them failing,
per checkpoint and set), writes it to OUT/words_pipeline.json with each stage's wall time, and
plots accuracy and tool use per RL step from OUT/rl/metrics.jsonl into OUT/words_rl_steps.png.

Run from the repository root after `make smollm2` (a few hours on 2 cores; a rerun skips finished
stages and resumes an interrupted one; `--report-only` redoes the table, JSON and plot):
    python -m benchmarks.words_pipeline --out runs/words
GSM8K is read from --gsm8k (a local copy of openai/gsm8k's test split); it is evaluated on only.
Tested in tests/unit/test_words_pipeline.py (the planned commands parse against the real CLI; the
report from hand-written summaries).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.stage_runs import REPO, plot_steps, read_rows

SANDBOX = "$SANDBOX"  # stands for the daemon's URL in a planned command
CHECKPOINTS = ("base", "sft", "rl")
SETS = ("gsm8k", "words")
RL_PANELS = [
    ("reward", "training accuracy (reward, T 1.0)"),
    ("eval_accuracy", "held-out words accuracy (T 0.6)"),
    ("tool_calls_per_rollout", "tool calls per rollout"),
    ("tool_error_share_all", "share of tool calls failing"),
]


@dataclass
class Settings:
    out: Path
    model: Path
    gsm8k: Path
    num_problems: int = 5000  # words train + test (80 / 20)
    seed: int = 0
    gsm8k_problems: int = 200
    words_problems: int = 100
    samples: int = 4
    temperature: float = 0.6
    max_turns: int = 3
    max_response_tokens: int = 512
    # NOTE: two engines, one per core, generate about twice as fast on 2 cores; sampling seeds
    # are per problem, sample and turn, so the split does not change what is sampled
    eval_engines: int = 2
    eval_kv_cache_tokens: int = 32768  # per engine: 64k in all, the default of one engine
    # NOTE: cycle c > 1 runs the SFT recipe again from cycle c - 1's model, on words drawn with
    # seed + c - 1: the same training templates and phrasings with new numbers (a question may
    # recur by chance), so nothing held out enters training
    sft_cycles: int = 1
    arith: Path = REPO / "data" / "arith.parquet"
    sft_recipe: Path = REPO / "recipes" / "pretrained" / "words_sft.yaml"
    rl_recipe: Path = REPO / "recipes" / "pretrained" / "words_rl.yaml"


@dataclass
class Stage:
    name: str
    argv: list[str]  # after `rstar2`; SANDBOX stands for the daemon's URL
    done: Path  # exists once the stage's output is complete


def plan(s: Settings) -> list[Stage]:
    train = s.out / "data" / "words.parquet"
    test = s.out / "data" / "words.test.parquet"
    stages = [
        Stage("prepare-data", _prepare(s, s.seed, train), test),
        *evals(s, label="base", model=s.model, test=test),
    ]
    model = s.model
    for cycle in range(1, s.sft_cycles + 1):
        data, folder, suffix, seed_set = train, s.out / "sft", "", []
        if cycle > 1:
            suffix = f"-c{cycle}"
            data, folder = s.out / "data" / f"words{suffix}.parquet", s.out / f"sft{suffix}"
            stages.append(
                Stage(f"prepare-data{suffix}", _prepare(s, s.seed + cycle - 1, data), data)
            )
            seed_set = ["--set", f"train.seed={cycle - 1}"]
        sources = (
            f"data.sources=[{{path: {data}, format: words}}, "
            f"{{path: {s.arith}, format: arith, max_records: 1000}}]"
        )
        sft = ["sft-coldstart", "--recipe", str(s.sft_recipe), "--out", str(folder)]
        sft += ["--set", f"model={model}", "--set", sources, *seed_set]
        stages.append(Stage(f"sft-coldstart{suffix}", sft, folder / "final" / "config.json"))
        model = folder / "final"
    rl = ["rl-stage", "--recipe", str(s.rl_recipe), "--out", str(s.out / "rl")]
    rl += ["--init-from", str(model), "--sandbox", SANDBOX]
    rl += ["--set", f"data.train={train}", "--set", f"data.eval={test}"]
    return [
        *stages,
        *evals(s, label="sft", model=model, test=test),
        Stage("rl-stage", rl, s.out / "rl" / "final" / "config.json"),
        *evals(s, label="rl", model=s.out / "rl" / "final", test=test),
    ]


def _prepare(s: Settings, seed: int, out: Path) -> list[str]:
    """`prepare-data` of the words set drawn with `seed` into `out` (and its .test split)."""
    argv = ["prepare-data", "--synthetic", "words", "--num", str(s.num_problems)]
    return argv + ["--seed", str(seed), "--out", str(out), "--force"]


def evals(s: Settings, *, label: str, model: Path, test: Path) -> list[Stage]:
    """The two evals of one checkpoint, each into its own folder (one summary.json per set)."""
    stages = []
    for name, data, limit in (
        ("gsm8k", s.gsm8k, s.gsm8k_problems),
        ("words", test, s.words_problems),
    ):
        folder = s.out / "eval" / name
        argv = ["eval", "--model", str(model), "--data", str(data), "--limit", str(limit)]
        argv += ["--samples", str(s.samples), "--temperature", str(s.temperature)]
        argv += ["--max-turns", str(s.max_turns)]
        argv += ["--max-response-tokens", str(s.max_response_tokens), "--seed", str(s.seed)]
        argv += ["--engines", str(s.eval_engines), "--kv-cache-tokens", str(s.eval_kv_cache_tokens)]
        argv += ["--sandbox", SANDBOX, "--out", str(folder), "--label", label]
        stages.append(Stage(f"eval-{label}-{name}", argv, folder / f".done-{label}"))
    return stages


def run(stages: list[Stage], out: Path) -> None:
    """Run the stages not yet done, with one sandbox daemon for all; wall times to timings.json."""
    from sandboxd.spawn import spawn_daemon

    timings_path = out / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.is_file() else {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with spawn_daemon(timeout_s=5.0, memory_mb=512) as daemon:
        for stage in stages:
            if stage.done.exists():
                print(f"= {stage.name}: done, skipped", flush=True)
                continue
            argv = [daemon.url if a == SANDBOX else a for a in stage.argv]
            print(f"== {stage.name}: rstar2 {' '.join(argv)}", flush=True)
            began = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "rstar2cli.cli", *argv], check=True, cwd=REPO, env=env
            )
            timings[stage.name] = round(time.monotonic() - began, 1)
            if stage.name.startswith("eval-"):
                stage.done.touch()
            timings_path.write_text(json.dumps(timings, indent=2) + "\n")


def eval_results(out: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """set -> checkpoint -> the metrics of the table, from each eval folder's summary.json."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in SETS:
        path = out / "eval" / name / "summary.json"
        labels = json.loads(path.read_text())["labels"] if path.is_file() else {}
        for label in CHECKPOINTS:
            benches = labels.get(label, {}).get("benchmarks") or {}
            if benches:
                (summary,) = benches.values()  # NOTE: one data file per eval folder
                results.setdefault(name, {})[label] = table_metrics(summary)
    return results


def table_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    pass_at = summary.get("pass_at_k") or {}
    return {
        "problems": summary["num_problems"],
        "trajectories": summary["num_trajectories"],
        "avg_at_n": summary["avg_at_n"],
        "pass_at_n": pass_at[max(pass_at, key=lambda k: int(k.split("@")[1]))] if pass_at else None,
        "tool_calls_per_trajectory": summary["tool_calls_per_trajectory"],
        "tool_failure_share": summary["tool_error_rate"],
        "mean_response_tokens": summary["mean_response_tokens"],
    }


def table_lines(results: dict[str, dict[str, dict[str, Any]]], samples: int) -> list[str]:
    """The table as markdown rows: one per (set, checkpoint)."""
    lines = [
        f"| set | checkpoint | avg@{samples} | pass@{samples} | tool calls / trajectory "
        "| failing tool calls | mean response tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by_label in results.items():
        for label in CHECKPOINTS:
            m = by_label.get(label)
            if m is None:
                continue
            pass_n = "-" if m["pass_at_n"] is None else f"{m['pass_at_n']:.1%}"
            lines.append(
                f"| {name} ({m['problems']} x {samples}) | {label} | {m['avg_at_n']:.1%} | "
                f"{pass_n} | {m['tool_calls_per_trajectory']:.2f} | "
                f"{m['tool_failure_share']:.1%} | {m['mean_response_tokens']:.0f} |"
            )
    return lines


def held_out_accuracy(out: Path) -> dict[str, dict[str, float]]:
    """checkpoint -> accuracy on the held-out words of new templates and of new phrasings
    (eval ids are `words.test-<row>`; the row's `held_out` field, in its meta, says which)."""
    import pyarrow.parquet as pq

    test, results = out / "data" / "words.test.parquet", out / "eval" / "words" / "results.jsonl"
    if not test.is_file() or not results.is_file():
        return {}
    kinds = [json.loads(m)["held_out"] for m in pq.read_table(test).column("meta").to_pylist()]
    tally: dict[str, dict[str, list[int]]] = {}
    for row in read_rows(results):
        kind = kinds[int(str(row["id"]).rsplit("-", 1)[1])]
        counts = tally.setdefault(str(row["label"]), {}).setdefault(kind, [0, 0])
        counts[0] += int(bool(row.get("correct")))
        counts[1] += 1
    return {
        label: {f"new {kind}s": right / total for kind, (right, total) in sorted(by_kind.items())}
        for label, by_kind in tally.items()
    }


def report(s: Settings) -> dict[str, Any]:
    """Print the table; write OUT/words_pipeline.json and the per-step plot (if RL has rows)."""
    results = eval_results(s.out)
    metrics = s.out / "rl" / "metrics.jsonl"
    steps = read_rows(metrics) if metrics.is_file() else []
    timings_path = s.out / "timings.json"
    doc = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(s).items()},
        "results": results,
        "words_by_held_out_kind": held_out_accuracy(s.out),
        "rl_steps": [{k: r.get(k) for k in ("step", *(p for p, _ in RL_PANELS))} for r in steps],
        "timings_s": json.loads(timings_path.read_text()) if timings_path.is_file() else {},
    }
    s.out.mkdir(parents=True, exist_ok=True)
    (s.out / "words_pipeline.json").write_text(json.dumps(doc, indent=2) + "\n")
    if steps:
        plot_steps(
            {"GRPO-RoC": steps},
            panels=RL_PANELS,
            title="SmolLM2-135M on word problems: GRPO-RoC steps after SFT",
            path=s.out / "words_rl_steps.png",
        )
    print("\n".join(table_lines(results, s.samples)))
    for label, by_kind in doc["words_by_held_out_kind"].items():
        print(f"held-out words, {label}: " + ", ".join(f"{k} {v:.1%}" for k, v in by_kind.items()))
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=REPO / "runs" / "words", help="folder for everything"
    )
    ap.add_argument("--model", type=Path, default=REPO / "models" / "smollm2-135m-instruct")
    ap.add_argument(
        "--gsm8k", type=Path, default=REPO.parent / "shared" / "data" / "eval" / "gsm8k.jsonl"
    )
    ap.add_argument("--gsm8k-problems", type=int, default=200)
    ap.add_argument("--words-problems", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sft-cycles",
        type=int,
        default=1,
        help="run the SFT recipe this many times, each on newly drawn words (default 1)",
    )
    ap.add_argument("--report-only", action="store_true", help="redo the table, JSON and plot only")
    args = ap.parse_args()
    if args.sft_cycles < 1:
        sys.exit(f"--sft-cycles {args.sft_cycles}: give 1 or more")
    s = Settings(
        out=args.out.resolve(),
        model=args.model.resolve(),
        gsm8k=args.gsm8k.resolve(),
        seed=args.seed,
        gsm8k_problems=args.gsm8k_problems,
        words_problems=args.words_problems,
        sft_cycles=args.sft_cycles,
    )
    if not args.report_only:
        if not (s.model / "config.json").is_file():
            sys.exit(f"--model {s.model}: no config.json (run `make smollm2` first)")
        if not s.gsm8k.is_file():
            sys.exit(f"--gsm8k {s.gsm8k}: no such file")
        s.out.mkdir(parents=True, exist_ok=True)
        run(plan(s), s.out)
    report(s)


if __name__ == "__main__":
    main()
