"""filter-hard's output side: which problems are kept, what the files hold, the histogram."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from rstar2cli.commands.filter_hard import _print_histogram, _write

ROWS = [
    {"id": "a", "question": "Compute 1+1.", "answer": "2", "source": "s"},
    {"id": "b", "question": "Compute 2+2.", "answer": "4", "source": "s"},
    {"id": "c", "question": "Compute 3+3.", "answer": "6", "source": "s"},
]
PROBLEMS = [{"id": r["id"], "question": r["question"], "answer": r["answer"]} for r in ROWS]
COUNTS = {"a": 8, "b": 3, "c": 0}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_drops_only_problems_solved_every_time_and_keeps_all_columns(tmp_path, suffix):
    from rstar2cli.fileio import read_records

    out = tmp_path / f"hard{suffix}"
    _write(rows=ROWS, problems=PROBLEMS, counts=COUNTS, samples=8, out=out)
    kept, _ = read_records(out)
    assert [r["id"] for r in kept] == ["b", "c"]
    assert kept[0] == {**ROWS[1], "num_correct": 3, "num_samples": 8}
    counts = [
        json.loads(line) for line in (tmp_path / "hard.counts.jsonl").read_text().splitlines()
    ]
    assert counts == [
        {"id": "a", "num_correct": 8, "num_samples": 8},
        {"id": "b", "num_correct": 3, "num_samples": 8},
        {"id": "c", "num_correct": 0, "num_samples": 8},
    ]


def test_histogram_counts_each_pass_count(tmp_path):
    console = Console(record=True, width=100)
    _print_histogram(
        console=console,
        counts={"a": 2, "b": 2, "c": 0, "d": 1},
        samples=2,
        out=tmp_path / "hard.jsonl",
    )
    text = console.export_text()
    cells = [line.replace("│", " ").split() for line in text.splitlines()]
    rows = {c[0]: c[1] for c in cells if c and c[0].endswith("/2")}
    assert rows == {"0/2": "1", "1/2": "1", "2/2": "2"}
    assert "kept 2 of 4 problems (dropped 2 solved 2/2)" in text
