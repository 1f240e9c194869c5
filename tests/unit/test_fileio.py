"""File helpers: record reading, atomic writes, durable appends."""

import json

import pytest

from rstar2cli.errors import UserError
from rstar2cli.fileio import (
    JsonlAppender,
    atomic_path,
    check_output_path,
    read_jsonl_if_exists,
    read_records,
    write_json_atomic,
)


def test_read_jsonl_reports_bad_lines(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"q": 1}\nnot json\n[1, 2]\n\n{"q": 2}\n')
    rows, bad = read_records(p)
    assert rows == [{"q": 1}, {"q": 2}]
    assert [n for n, _ in bad] == [2, 3]


def test_read_json_list_and_data_key(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"x": 1}]))
    (tmp_path / "b.json").write_text(json.dumps({"data": [{"x": 2}]}))
    assert read_records(tmp_path / "a.json")[0] == [{"x": 1}]
    assert read_records(tmp_path / "b.json")[0] == [{"x": 2}]


def test_read_parquet_roundtrip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"a": 1, "b": "x"}]), tmp_path / "t.parquet")
    assert read_records(tmp_path / "t.parquet")[0] == [{"a": 1, "b": "x"}]


@pytest.mark.parametrize(
    "name, content", [("m.jsonl", None), ("bad.json", "{oops"), ("t.csv", "a,b")]
)
def test_read_errors_are_user_errors(tmp_path, name, content):
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(UserError):
        read_records(tmp_path / name)


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    write_json_atomic(target, {"ok": True})
    assert json.loads(target.read_text()) == {"ok": True}


def test_appender_cuts_a_torn_tail_and_appends(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"i": 0}\n{"i": 1, "par')  # crashed mid-line
    with JsonlAppender(p) as app:
        app.write_batch([{"i": 2}])
    assert read_jsonl_if_exists(p) == [{"i": 0}, {"i": 2}]
    assert read_jsonl_if_exists(tmp_path / "none.jsonl") == []


def test_appender_keeps_a_whole_last_row_that_lacks_its_newline(tmp_path):
    # resuming counts that row as done, so cutting it would lose it for good
    p = tmp_path / "r.jsonl"
    p.write_text('{"i": 0}\n{"i": 1}')
    assert read_jsonl_if_exists(p) == [{"i": 0}, {"i": 1}]
    with JsonlAppender(p) as app:
        app.write_batch([{"i": 2}])
    assert read_jsonl_if_exists(p) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert p.read_text().endswith('{"i": 2}\n')


def test_appender_that_never_writes_leaves_no_file(tmp_path):
    # a run that fails before its first record must not leave an empty output behind
    p = tmp_path / "sub" / "r.jsonl"
    with JsonlAppender(p) as app:
        app.write_batch([])
    assert not p.exists()


def test_check_output_path(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    assert check_output_path(tmp_path / "new" / "o.jsonl", (data,), ".jsonl").parent.is_dir()
    with pytest.raises(UserError, match="also an input"):
        check_output_path(tmp_path / "." / "data.jsonl", (data,), ".jsonl")
    with pytest.raises(UserError, match="must be a .jsonl file"):
        check_output_path(tmp_path / "o.parquet", (data,), ".jsonl")
    with pytest.raises(UserError, match="cannot write to"):
        check_output_path(data / "sub" / "o.jsonl", (), ".jsonl")  # under a file
    assert check_output_path(tmp_path / "run", ()).is_dir()  # no suffix: an output folder
