"""The eval results file: what is still to run, graded appends, and answer-pair checks.

- `pending_items`: the (problem, sample) items of a label not yet in results.jsonl (resume rule:
  a finished (label, benchmark, id, sample) is never run again), plus problem id -> benchmark.
- `ResultWriter`: buffers trajectory records, grades them with the training grader (the paper's
  rule: `\\boxed{}` inside `<answer>`, truncated -> wrong) and appends rows with flush + fsync per
  batch. A row is the trajectory record (CONTRACTS.md) plus `label`, `benchmark`, `correct`,
  `reward`, `extracted` (the graded answer), `grade_status` and `num_response_tokens`.
- `check_answer_pairs`: equivalence of answer pairs (for maj@k) through the grader's bounded
  worker processes, so a pathological answer cannot stall the report.

What it does not do: run models or print. Tested through tests/cli/test_eval_grade_only.py and
tests/integration/test_eval_cli.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

_FLUSH_EVERY = 16
_FLUSH_EVERY_S = 2.0


def pending_items(
    benchmarks: list[Any], n: int, results: Path, label: str
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Items still to run for `label`, and problem id -> benchmark name."""
    from rstar2cli.fileio import read_jsonl_if_exists

    done = {
        (r.get("benchmark"), str(r.get("id")), r.get("sample"))
        for r in read_jsonl_if_exists(results)
        if r.get("label") == label
    }
    items: list[dict[str, Any]] = []
    owner: dict[str, str] = {}
    for bench in benchmarks:
        for p in bench.problems:
            owner[p["id"]] = bench.name
            items += [{**p, "sample": s} for s in range(n) if (bench.name, p["id"], s) not in done]
    return items, owner


class ResultWriter:
    """Buffers records; grades them (the training grader); appends + fsyncs per batch."""

    def __init__(self, path: Path, label: str, owner: dict[str, str]):
        from rstar2cli.fileio import JsonlAppender
        from rstar2cli.reward.grader import Grader

        self.label = label
        self.owner = owner
        self.appender = JsonlAppender(path)
        self.grader = Grader(num_workers=1, strict=True)
        self.buffer: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        self.num_written = 0
        self.num_correct = 0

    def add(self, record: dict[str, Any]) -> None:
        self.buffer.append(record)
        if len(self.buffer) >= _FLUSH_EVERY or time.monotonic() - self.last_flush > _FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            items = [(r["text"], str(r["answer"])) for r in self.buffer]
            results = self.grader.grade_batch(items, [r["finish_reason"] for r in self.buffer])
            rows = [self._row(r, g) for r, g in zip(self.buffer, results, strict=True)]
            self.appender.write_batch(rows)
            self.num_written += len(rows)
            self.num_correct += sum(1 for r in rows if r["correct"])
            self.buffer = []
        self.last_flush = time.monotonic()

    def _row(self, record: dict[str, Any], graded: Any) -> dict[str, Any]:
        return {
            "label": self.label,
            "benchmark": self.owner[record["id"]],
            **record,
            "correct": graded.correct,
            "reward": 1.0 if graded.correct else 0.0,
            "extracted": graded.extracted,
            "grade_status": graded.status,
            "num_response_tokens": len(record["response_ids"]),
        }

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.appender.close()
            self.grader.close()


def check_answer_pairs(pairs: set[tuple[str, str]]) -> dict[tuple[str, str], bool]:
    """Is answer a equivalent to answer b, for each pair; hung or crashed checks say no."""
    if not pairs:
        return {}
    from rstar2cli.reward.grader import Grader

    ordered = sorted(pairs)
    with Grader(num_workers=1, strict=False, zero_truncated=False) as grader:
        results = grader.grade_batch([("\\boxed{" + a + "}", b) for a, b in ordered])
    return {pair: r.correct for pair, r in zip(ordered, results, strict=True)}
