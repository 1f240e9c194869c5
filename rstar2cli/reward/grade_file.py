"""Grade a file of existing responses: the work behind `rstar2 eval --grade-only IN --out OUT`.

Each input line needs `response` (the model's text) and `answer` (the reference); every other
field is kept. Output lines add `correct` (bool) and `extracted` (the answer string, or null);
lines whose record carries a `finish_reason` also follow the truncation rule of the grader. The
output is written atomically, so a crash never leaves half a file. Uses the same `Grader` as
training. What it does not do: print (the command reports the returned `GradeFileReport`).
Tested in tests/unit/test_grade_file.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rstar2cli.errors import UserError
from rstar2cli.fileio import read_records, write_jsonl_atomic
from rstar2cli.reward.grader import Grader

BATCH_SIZE = 1024


@dataclass
class GradeFileReport:
    num_graded: int
    num_correct: int
    status_counts: dict[str, int] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return self.num_correct / self.num_graded if self.num_graded else 0.0


def grade_file(
    in_path: str | Path,
    out_path: str | Path,
    num_workers: int = 2,
    timeout_s: float = 5.0,
    strict: bool = False,
) -> GradeFileReport:
    """Grade every record of `in_path` into `out_path`; raise UserError on unusable input."""
    records, bad_lines = read_records(in_path)
    if bad_lines:
        num, reason = bad_lines[0]
        raise UserError(f"{in_path}: line {num}: {reason} ({len(bad_lines)} bad line(s) in all)")
    _check_fields(records, in_path)
    rows: list[dict] = []
    statuses: Counter[str] = Counter()
    with Grader(num_workers=num_workers, timeout_s=timeout_s, strict=strict) as grader:
        for start in range(0, len(records), BATCH_SIZE):
            batch = records[start : start + BATCH_SIZE]
            items = [(str(r["response"] or ""), str(r["answer"])) for r in batch]
            reasons = [r.get("finish_reason") for r in batch]
            for record, result in zip(batch, grader.grade_batch(items, reasons), strict=True):
                rows.append({**record, "correct": result.correct, "extracted": result.extracted})
                statuses[result.status] += 1
    write_jsonl_atomic(out_path, rows)
    num_correct = sum(1 for row in rows if row["correct"])
    return GradeFileReport(len(rows), num_correct, dict(statuses))


def _check_fields(records: list[dict], in_path: str | Path) -> None:
    if not records:
        raise UserError(f"{in_path}: no records to grade")
    for num, record in enumerate(records, start=1):
        missing = [key for key in ("response", "answer") if key not in record]
        if missing:
            raise UserError(f"{in_path}: record {num} has no {' or '.join(missing)} field")
        if record["answer"] is None:
            raise UserError(f"{in_path}: record {num} has a null answer")
