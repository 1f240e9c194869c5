"""Benchmark sets for `rstar2 eval`: known names -> HF dataset id, split and fields, plus local files.

`load_benchmark(name)` loads a known set with `datasets.load_dataset` (imported inside the
function; the hub cache and HF_TOKEN apply as usual) and `load_local(path)` reads a local
jsonl/json/parquet file. Both go through the same normaliser as `prepare-data`
(`rstar2cli.data.dataset_normalize`, no filtering, no dedupe), so any schema `prepare-data` reads works and
problems come out as `{"id", "question", "answer"}` with ids `{name}-{row index}` (stable while the
file is unchanged, which is what resuming relies on).

GPQA-Diamond is multiple choice: its four options are shuffled with a seed derived from the
question (the same order on every run) and listed as (A)-(D); the reference is the letter.

What it does not do: download anything at import time, or cache sets itself.
Tested through tests/cli/test_eval_grade_only.py (names, local files) and
tests/integration/test_eval_cli.py.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError


@dataclass
class Benchmark:
    """A loaded set: its problems and how many rows were unusable (reported, not fatal)."""

    name: str
    source: str  # HF id or file path
    problems: list[dict[str, Any]]
    num_skipped: int = 0
    first_skip: str = ""


@dataclass(frozen=True)
class BenchmarkSpec:
    dataset_id: str
    split: str
    config: str | None = None
    question_field: str | None = None  # None: the normaliser's detection (problem/question/prompt)
    answer_field: str | None = None  # None: answer -> reward_model.ground_truth -> solution box
    multiple_choice: bool = False


# NOTE: the paper reports AIME24, AIME25, HMMT25, MATH-500 and GPQA-Diamond (avg@16, T=0.6).
BENCHMARKS: dict[str, BenchmarkSpec] = {
    "aime24": BenchmarkSpec(
        dataset_id="HuggingFaceH4/aime_2024",
        split="train",
        config=None,
        question_field="problem",
        answer_field="answer",
    ),
    "aime25": BenchmarkSpec(
        dataset_id="MathArena/aime_2025",
        split="train",
        config=None,
        question_field="problem",
        answer_field="answer",
    ),
    "hmmt25": BenchmarkSpec(
        dataset_id="MathArena/hmmt_feb_2025",
        split="train",
        config=None,
        question_field="problem",
        answer_field="answer",
    ),
    "math500": BenchmarkSpec(
        dataset_id="HuggingFaceH4/MATH-500",
        split="test",
        config=None,
        question_field="problem",
        answer_field="answer",
    ),
    "gsm8k": BenchmarkSpec(
        dataset_id="openai/gsm8k",
        split="test",
        config="main",
        question_field="question",
        answer_field="answer",
    ),
    "amc23": BenchmarkSpec("math-ai/amc23", "test"),
    "gpqa-diamond": BenchmarkSpec(
        dataset_id="Idavidrein/gpqa",
        split="train",
        config="gpqa_diamond",
        multiple_choice=True,
    ),
}

_LETTERS = "ABCD"


def check_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise UserError(
            f"unknown benchmark {unknown[0]!r}; known: {', '.join(BENCHMARKS)} (or use --data PATH)"
        )


def load_benchmark(name: str) -> Benchmark:
    """Problems of a known benchmark, from the HF hub (or the local HF cache)."""
    check_names([name])
    spec = BENCHMARKS[name]
    from rstar2cli.data.loading import load_hub_dataset

    rows = load_hub_dataset(spec.dataset_id, spec.config, spec.split, f"benchmark {name}")
    if spec.multiple_choice:
        rows = [multiple_choice_row(r) for r in rows]
    return normalize_problems(
        rows=rows,
        name=name,
        source=spec.dataset_id,
        question_field=spec.question_field,
        answer_field=spec.answer_field,
    )


def load_local(path: Path) -> Benchmark:
    """Problems of a local jsonl/json/parquet file in any schema `prepare-data` reads."""
    from rstar2cli.fileio import read_records

    rows, bad_lines = read_records(path)
    if bad_lines:
        num, why = bad_lines[0]
        raise UserError(f"{path}: line {num}: {why} ({len(bad_lines)} bad line(s) in all)")
    return normalize_problems(rows, local_name(path), str(path))


def local_name(path: Path) -> str:
    return Path(path).stem


def normalize_problems(
    rows: list[dict[str, Any]],
    name: str,
    source: str,
    question_field: str | None = None,
    answer_field: str | None = None,
) -> Benchmark:
    """Rows -> problems through the `prepare-data` normaliser; no usable row -> UserError."""
    from rstar2cli.data.dataset_normalize import NormalizeOptions, normalize_records

    options = NormalizeOptions(
        question_field=question_field, answer_field=answer_field, integer_only=False, dedupe=False
    )
    result = normalize_records(rows, name, options)
    if not result.kept:
        why = result.rejects[0].detail if result.rejects else "no rows"
        raise UserError(f"benchmark {name}: no usable problems ({why})")
    problems = [{"id": p.id, "question": p.question, "answer": p.answer} for p in result.kept]
    first = result.rejects[0] if result.rejects else None
    return Benchmark(
        name=name,
        source=source,
        problems=problems,
        num_skipped=len(result.rejects),
        first_skip=f"row {first.index}: {first.reason} ({first.detail})" if first else "",
    )


def multiple_choice_row(row: dict[str, Any]) -> dict[str, str]:
    """A GPQA row -> question with options (A)-(D) in a fixed shuffled order, answer = letter."""
    question = str(row["Question"]).strip()
    correct = str(row["Correct Answer"]).strip()
    options = [correct] + [str(row[f"Incorrect Answer {i}"]).strip() for i in (1, 2, 3)]
    seed = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big")
    random.Random(seed).shuffle(options)
    lines = [f"({letter}) {text}" for letter, text in zip(_LETTERS, options, strict=False)]
    text = (
        question + "\n\n" + "\n".join(lines) + "\n\nAnswer with the letter of the correct option."
    )
    return {"question": text, "answer": _LETTERS[options.index(correct)]}
