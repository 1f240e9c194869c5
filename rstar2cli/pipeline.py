"""The quickstart pipeline: the user-facing commands, chained as a shell script would chain them.

`plan_steps` returns each stage as the exact `rstar2` argument list a user would type, so the
quickstart runs the same command functions (through the same CLI parser) and `pipeline.sh` is a
faithful copy of what ran. A stage whose output is complete is skipped on a rerun; a stage that was
interrupted is rerun and resumes by itself (sft-coldstart, rl-stage and eval all resume).

`summarize` reads the eval results of the SFT and RL models into the quickstart's summary.json.
What it does not do: train, sample or grade anything itself. Tested in tests/unit/test_pipeline.py
(planning and summary); the whole run is `rstar2 quickstart` itself.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2cli.records import GradedRecord
from rstar2cli.rl.roc import RolloutSummary, tool_error_share
from sandboxd.pool import DEFAULT_WORKERS

SANDBOX_URL_VAR = "$SANDBOX"


@dataclass
class Step:
    name: str
    argv: list[str]  # arguments after `rstar2`; SANDBOX_URL_VAR stands for the daemon's URL
    done_marker: Path  # exists once the step's output is complete

    def bound(self, sandbox_url: str) -> list[str]:
        return [sandbox_url if a == SANDBOX_URL_VAR else a for a in self.argv]


@dataclass
class QuickstartSettings:
    recipes_dir: Path
    model: Path | None = None  # a local HF causal-LM folder; None: the tiny model the recipe builds
    num_problems: int = 2000  # train + held-out test (80/20), as the tiny recipes were tuned on
    seed: int = 0
    eval_problems: int = 100  # the first N of the held-out split
    eval_samples: int = 4
    eval_temperature: float = 0.6
    eval_max_turns: int = 3
    eval_max_response_tokens: int = 384


def pretrained_settings(recipes_dir: Path, model: Path) -> QuickstartSettings:
    """The quickstart from a pretrained model (`--model`): its evals are smaller, since each
    sample costs ~100x the tiny model's on a CPU (SmolLM2-135M: ~96 generated tokens/s)."""
    return QuickstartSettings(recipes_dir=recipes_dir, model=model, eval_problems=50)


def plan_steps(out: Path, s: QuickstartSettings) -> list[Step]:
    train = out / "data" / "arith.parquet"
    test = out / "data" / "arith.test.parquet"
    sft_dir, rl_dir, eval_dir = out / "sft", out / "rl", out / "eval"
    sources = f"data.sources=[{{path: {train}, format: arith}}]"

    own_model = [] if s.model is None else [("--set", f"model={s.model}")]
    return [
        Step(
            name="prepare-data",
            argv=_argv(
                "prepare-data",
                [
                    ("--synthetic", "arith"),
                    ("--num", s.num_problems),
                    ("--seed", s.seed),
                    ("--out", train),
                ],
            ),
            done_marker=test,
        ),
        Step(
            name="sft-coldstart",
            argv=_argv(
                "sft-coldstart",
                [("--recipe", s.recipes_dir / "sft.yaml"), ("--out", sft_dir), ("--set", sources)]
                + own_model,
            ),
            done_marker=sft_dir / "final" / "config.json",
        ),
        _eval_step(s, label="sft", model=sft_dir / "final", test=test, eval_dir=eval_dir),
        Step(
            name="rl-stage",
            argv=_argv(
                "rl-stage",
                [
                    ("--recipe", s.recipes_dir / "rl.yaml"),
                    ("--out", rl_dir),
                    ("--init-from", sft_dir / "final"),
                    ("--sandbox", SANDBOX_URL_VAR),
                    ("--set", f"data.train={train}"),
                    ("--set", f"data.eval={test}"),
                ],
            ),
            done_marker=rl_dir / "final" / "config.json",
        ),
        _eval_step(s, label="rl", model=rl_dir / "final", test=test, eval_dir=eval_dir),
    ]


def _eval_step(
    s: QuickstartSettings, *, label: str, model: Path, test: Path, eval_dir: Path
) -> Step:
    """Evaluate `model` on the held-out split into `eval_dir`, labelled `label`."""
    options = [
        ("--model", model),
        ("--data", test),
        ("--sandbox", SANDBOX_URL_VAR),
        ("--limit", s.eval_problems),
        ("--samples", s.eval_samples),
        ("--temperature", s.eval_temperature),
        ("--max-turns", s.eval_max_turns),
        ("--max-response-tokens", s.eval_max_response_tokens),
        ("--seed", s.seed),
        ("--out", eval_dir),
        ("--label", label),
    ]
    return Step(
        name=f"eval-{label}",
        argv=_argv("eval", options),
        done_marker=eval_dir / f".done-{label}",
    )


def _argv(verb: str, options: list[tuple[str, Any]]) -> list[str]:
    """`rstar2 VERB --flag value ...` as its argument list, each value as text."""
    return [verb, *(str(part) for option in options for part in option)]


# the line in pipeline.sh that marks a folder as a quickstart's own (`quickstart --fresh` deletes
# only such a folder)
SCRIPT_MARK = "Generated by `rstar2 quickstart`"


def shell_script(steps: list[Step], port: int = 8765) -> str:
    """The same pipeline as a shell script a user can edit and run."""
    lines = [
        "#!/usr/bin/env bash",
        f"# The quickstart pipeline, as commands. {SCRIPT_MARK}.",
        "set -euo pipefail",
        f"rstar2 serve-sandbox --host 127.0.0.1 --port {port} --workers {DEFAULT_WORKERS} &",
        "SANDBOX_PID=$!",
        "trap 'kill $SANDBOX_PID' EXIT",
        f"SANDBOX=http://127.0.0.1:{port}",
        "until curl -sf $SANDBOX/healthz >/dev/null; do sleep 0.5; done",
    ]
    for step in steps:
        args = " ".join(a if a == SANDBOX_URL_VAR else shlex.quote(a) for a in step.argv)
        lines.append(f"rstar2 {args}")
    return "\n".join(lines) + "\n"


def label_summary(rows: Iterable[GradedRecord]) -> dict[str, Any]:
    """Accuracy, tool calls per trajectory, tool-error share inside correct trajectories, length."""
    rows = list(rows)
    if not rows:
        return {"accuracy": None, "tool_error_share": None, "trajectories": 0}
    summaries = [RolloutSummary.from_record(r) for r in rows]
    num_problems = len({r["id"] for r in rows})
    return {
        "accuracy": sum(1 for r in rows if r["correct"]) / len(rows),
        # NOTE: errored tool calls / tool calls, pooled over correct trajectories (paper Fig. 4).
        "tool_error_share": tool_error_share(summaries, positive_only=True),
        "tool_calls_per_trajectory": sum(len(r.get("tool_calls", [])) for r in rows) / len(rows),
        "mean_response_tokens": sum(len(r["response_ids"]) for r in rows) / len(rows),
        "trajectories": len(rows),
        "problems": num_problems,
    }


def summarize(results: list[GradedRecord], rl_steps: int, seconds: float) -> dict[str, Any]:
    by_label: dict[str, list[GradedRecord]] = {"sft": [], "rl": []}
    for r in results:
        if r.get("label") in by_label:
            by_label[r["label"]].append(r)
    return {
        "sft": label_summary(by_label["sft"]),
        "rl": {**label_summary(by_label["rl"]), "steps": rl_steps},
        "seconds": round(seconds, 1),
    }
