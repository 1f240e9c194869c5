"""`grade_file` (the `eval --grade-only` path) on real files with the real grader workers."""

from __future__ import annotations

import json

import pytest

from rstar2cli.errors import UserError
from rstar2cli.reward.grade_file import grade_file


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


ROWS = [
    {"id": "a", "response": "<answer>\\boxed{\\dfrac12}</answer>", "answer": "0.5", "model": "m1"},
    {"id": "b", "response": "It is \\boxed{2\\sqrt{3}}.", "answer": "\\sqrt{12}", "model": "m1"},
    {"id": "c", "response": "<answer>\\boxed{7}</answer>", "answer": "8", "model": "m1"},
    {"id": "d", "response": "I give up.", "answer": "1,000", "model": "m1"},
    {
        "id": "e",
        "response": "<answer>\\boxed{1000}</answer>",
        "answer": 1000,
        "finish_reason": "budget",
    },
    {"id": "f", "response": "\\boxed{18}", "answer": "She sells 9 eggs.\n#### 18"},
]


def test_grades_adds_fields_and_keeps_the_rest(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "sub" / "out.jsonl"
    _write_jsonl(src, ROWS)
    report = grade_file(src, out, num_workers=1, timeout_s=10.0)
    rows = _read_jsonl(out)
    assert [r["id"] for r in rows] == ["a", "b", "c", "d", "e", "f"]
    assert [r["correct"] for r in rows] == [True, True, False, False, False, True]
    assert [r["extracted"] for r in rows] == ["\\dfrac12", "2\\sqrt{3}", "7", None, "1000", "18"]
    assert rows[0]["model"] == "m1" and rows[4]["finish_reason"] == "budget"
    assert all(set(src_row) <= set(row) for src_row, row in zip(ROWS, rows, strict=True))
    assert (report.num_graded, report.num_correct) == (6, 3)
    assert report.accuracy == pytest.approx(0.5)
    assert report.status_counts == {"ok": 4, "no_answer": 1, "truncated": 1}
    assert list(tmp_path.joinpath("sub").iterdir()) == [out]  # no temporary file left behind


def test_missing_field_is_a_user_error_and_writes_nothing(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_jsonl(src, [ROWS[0], {"id": "x", "response": "\\boxed{1}"}])
    with pytest.raises(UserError, match="record 2 has no answer"):
        grade_file(src, out, num_workers=1)
    assert not out.exists()


def test_bad_json_line_and_empty_file_are_user_errors(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 2"):
        grade_file(src, out, num_workers=1)
    src.write_text("\n", encoding="utf-8")
    with pytest.raises(UserError, match="no records"):
        grade_file(src, out, num_workers=1)
    assert not out.exists()
