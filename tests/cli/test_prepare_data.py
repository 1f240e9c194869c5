"""`rstar2 prepare-data` end to end: the real Typer app in-process (CliRunner) and, for the
one-line errors and exit codes, the real entry point in a subprocess (`python -m rstar2cli.cli`).

The three eval files in ../shared/data/eval use three schemas (AIME24: problem/answer with
zero-padded answers; MATH500: problem/solution/answer with LaTeX answers; GSM8K: question/answer
where the answer is a worked solution ending in `#### n`). No network: HF ids are only tried
offline, to check the error message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rstar2cli.cli import app
from rstar2cli.errors import UserError

REPO = Path(__file__).resolve().parents[2]
EVAL_DIR = REPO / ".." / "shared" / "data" / "eval"
EVAL_NAMES = ("aime24", "math500", "gsm8k")
COLUMNS = ["id", "question", "answer", "source", "meta"]

needs_eval = pytest.mark.skipif(
    not all((EVAL_DIR / f"{n}.jsonl").is_file() for n in EVAL_NAMES),
    reason=f"shared eval files not found in {EVAL_DIR.resolve()}",
)


def _invoke(*args: str):
    return CliRunner().invoke(app, ["prepare-data", *map(str, args)])


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The console entry point as a user runs it (one-line errors, exit codes)."""
    return subprocess.run(
        [sys.executable, "-m", "rstar2cli.cli", "prepare-data", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _expected_answer(name: str, row: dict) -> str:
    """Worked out independently of the code under test, per schema."""
    if name == "gsm8k":
        return re.search(r"####\s*(\S+)\s*$", row["answer"]).group(1).replace(",", "")
    if name == "aime24":
        return str(int(row["answer"]))  # "025" -> "25"
    # MATH500: the answer field, with the thousands separator of "58,500" dropped
    return (
        row["answer"].replace(",", "")
        if re.fullmatch(r"\d+,\d{3}", row["answer"])
        else row["answer"]
    )


@needs_eval
@pytest.mark.parametrize("name", EVAL_NAMES)
def test_eval_file_every_row_normalised(name, tmp_path):
    src = EVAL_DIR / f"{name}.jsonl"
    out = tmp_path / f"{name}.parquet"
    result = _invoke("--source", src, "--out", out)
    assert result.exit_code == 0, result.output
    rows = _read_jsonl(src)
    table = pq.read_table(out)
    assert table.column_names == COLUMNS
    got = table.to_pylist()
    assert len(got) == len(rows)
    question_key = "question" if name == "gsm8k" else "problem"
    for i, (orig, new) in enumerate(zip(rows, got, strict=True)):
        assert new["id"] == f"{name}-{i}"
        assert new["source"] == name
        assert new["question"] == orig[question_key]  # verbatim
        assert new["answer"] == _expected_answer(name, orig), (i, orig["answer"][-40:])
        assert json.loads(new["meta"]) == orig
    assert _read_jsonl(tmp_path / f"{name}.rejects.jsonl") == []


@needs_eval
def test_gsm8k_answers_spot_check_and_summary(tmp_path):
    out = tmp_path / "g.parquet"
    result = _invoke("--source", EVAL_DIR / "gsm8k.jsonl", "--out", out)
    assert result.exit_code == 0, result.output
    answers = pq.read_table(out).column("answer").to_pylist()
    assert answers[:4] == ["18", "3", "70000", "540"]
    assert "1450000" in answers  # was "1,450,000" after ####
    assert all(re.fullmatch(r"-?\d+", a) for a in answers)
    text = result.output
    assert re.search(r"read\s*│\s*1319", text) and re.search(r"kept\s*│\s*1319", text)
    assert re.search(r"rejected\s*│\s*0", text)


@needs_eval
def test_integer_only_and_decontaminate(tmp_path):
    src = EVAL_DIR / "math500.jsonl"
    out = tmp_path / "m.parquet"
    result = _invoke(
        *["--source", src, "--out", out, "--integer-only"],
        *["--decontaminate", EVAL_DIR / "aime24.jsonl"],
    )
    assert result.exit_code == 0, result.output
    kept = pq.read_table(out).to_pylist()
    rejects = _read_jsonl(tmp_path / "m.rejects.jsonl")
    assert len(kept) + len(rejects) == 500  # never silently dropped
    assert all(re.fullmatch(r"-?\d+", r["answer"]) for r in kept)
    reasons = {r["reason"] for r in rejects}
    assert reasons == {"not_integer", "contaminated"}
    for r in rejects:
        assert r["row"]["unique_id"] and r["detail"] and r["index"] is not None
    # every integer-answer problem is either kept or contaminated
    num_int = sum(bool(re.fullmatch(r"-?\d+|\d+,\d{3}", r["answer"])) for r in _read_jsonl(src))
    num_contaminated = sum(r["reason"] == "contaminated" for r in rejects)
    assert len(kept) + num_contaminated == num_int


@needs_eval
def test_decontaminating_against_itself_leaves_nothing(tmp_path):
    src = EVAL_DIR / "aime24.jsonl"
    proc = _cli("--source", src, "--out", tmp_path / "a.parquet", "--decontaminate", src)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "no usable rows" in proc.stderr
    assert "30 contaminated" in proc.stderr
    assert not (tmp_path / "a.parquet").exists() and not (tmp_path / "a.rejects.jsonl").exists()


@needs_eval
def test_parquet_and_json_inputs_match_jsonl(tmp_path):
    rows = _read_jsonl(EVAL_DIR / "aime24.jsonl")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "aime24.parquet")
    (tmp_path / "aime24.json").write_text(json.dumps(rows), encoding="utf-8")
    outs = []
    for src in (EVAL_DIR / "aime24.jsonl", tmp_path / "aime24.parquet", tmp_path / "aime24.json"):
        out = tmp_path / "out" / f"{src.suffix[1:]}.parquet"
        assert _invoke("--source", src, "--out", out).exit_code == 0
        outs.append(pq.read_table(out).select(["id", "question", "answer"]).to_pylist())
    assert outs[0] == outs[1] == outs[2]


def test_field_overrides_and_rejects(tmp_path):
    src = tmp_path / "custom.jsonl"
    lines = [
        json.dumps({"text": "What is 6*7?", "sol": {"final": "The answer is \\boxed{42}."}}),
        "{not json",
        json.dumps({"text": "No answer?", "sol": {}}),
        json.dumps(["a list, not an object"]),
        json.dumps({"text": "What is 2+2?", "sol": {"final": "4"}}),
    ]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "c.parquet"
    result = _invoke(
        *["--source", src, "--out", out],
        *["--question-field", "text", "--answer-field", "sol.final"],
    )
    assert result.exit_code == 0, result.output
    kept = pq.read_table(out).to_pylist()
    assert [(r["question"], r["answer"]) for r in kept] == [
        ("What is 6*7?", "42"),
        ("What is 2+2?", "4"),
    ]
    rejects = _read_jsonl(tmp_path / "c.rejects.jsonl")
    assert sorted(r["reason"] for r in rejects) == ["invalid_json", "invalid_json", "no_answer"]
    no_answer = next(r for r in rejects if r["reason"] == "no_answer")
    assert no_answer["row"] == {"text": "No answer?", "sol": {}}
    assert {r["line"] for r in rejects if r["reason"] == "invalid_json"} == {2, 4}
    assert re.search(r"invalid_json\s*│\s*2", result.output)


def test_question_answer_schema_and_dedupe(tmp_path):
    src = tmp_path / "qa.jsonl"
    rows = [
        {"question": "Compute 12*13.", "answer": "156"},
        {"question": "compute 12*13", "answer": "156"},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert _invoke("--source", src, "--out", tmp_path / "a.parquet").exit_code == 0
    assert pq.read_table(tmp_path / "a.parquet").num_rows == 1
    assert _invoke("--source", src, "--out", tmp_path / "b.parquet", "--no-dedupe").exit_code == 0
    assert pq.read_table(tmp_path / "b.parquet").num_rows == 2


def test_refuses_to_overwrite_without_force(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n", encoding="utf-8")
    out = tmp_path / "p.parquet"
    out.write_bytes(b"keep me")
    proc = _cli("--source", src, "--out", out)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert out.read_bytes() == b"keep me"
    assert _invoke("--source", src, "--out", out, "--force").exit_code == 0
    assert pq.read_table(out).to_pylist()[0]["answer"] == "2"
    # no temporary siblings left behind by the atomic write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "p.parquet", "p.rejects.jsonl"]


def test_missing_file_is_one_line_error(tmp_path):
    proc = _cli("--source", tmp_path / "nope.jsonl", "--out", tmp_path / "x.parquet")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: file not found: {tmp_path / 'nope.jsonl'}"]
    assert "Traceback" not in proc.stderr


def test_nothing_usable_exits_nonzero(tmp_path):
    src = tmp_path / "junk.jsonl"
    src.write_text('{"foo": 1}\n{"bar": 2}\nnot json\n', encoding="utf-8")
    proc = _cli("--source", src, "--out", tmp_path / "j.parquet")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no usable rows" in proc.stderr
    assert "(3 read: 2 no_question, 1 invalid_json)" in proc.stderr
    # a failed run writes nothing, so the corrected run needs no --force
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.jsonl"]
    src.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n", encoding="utf-8")
    assert _invoke("--source", src, "--out", tmp_path / "j.parquet").exit_code == 0
    assert _read_jsonl(tmp_path / "j.rejects.jsonl") == []


@pytest.mark.parametrize("content", ["", "not json\n", '{"foo": 1}\n'])
def test_failed_forced_run_leaves_earlier_outputs_unchanged(tmp_path, content):
    src = tmp_path / "p.jsonl"
    src.write_text(
        json.dumps({"problem": "1+1?", "answer": "2"}) + "\nnot json\n", encoding="utf-8"
    )
    out, rejects = tmp_path / "p.parquet", tmp_path / "p.rejects.jsonl"
    assert _invoke("--source", src, "--out", out).exit_code == 0
    before = (out.read_bytes(), rejects.read_bytes())
    src.write_text(content, encoding="utf-8")
    proc = _cli("--source", src, "--out", out, "--force")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no usable rows" in proc.stderr
    assert (out.read_bytes(), rejects.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "p.parquet", "p.rejects.jsonl"]


def test_unwritable_or_clashing_outputs_fail_before_reading(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n", encoding="utf-8")
    blocker = tmp_path / "a_file"
    blocker.write_text("", encoding="utf-8")
    cases = [
        (["--out", blocker / "p.parquet"], "cannot write to"),
        (["--out", tmp_path / "p.csv"], "--out must be a .parquet file"),
        (["--out", tmp_path / "q.parquet", "--rejects", blocker / "r.jsonl"], "cannot write to"),
        (["--out", tmp_path / "q.parquet", "--rejects", src], "--rejects"),
        (["--out", tmp_path / "q.parquet", "--rejects", tmp_path], "--rejects is a directory"),
        (["--out", tmp_path / "q.parquet", "--rejects", tmp_path / "q.parquet"], "same file"),
    ]
    for args, expected in cases:
        proc = _cli("--source", src, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], (
            args,
            proc.stderr,
        )
    assert src.read_text(encoding="utf-8").startswith('{"problem"')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "p.jsonl"]


def test_bad_hf_id_is_one_line_error(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = _cli("--source", "no-such-org/no-such-dataset", "--out", tmp_path / "h.parquet", env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-org/no-such-dataset" in lines[0], proc.stderr
    assert not (tmp_path / "h.parquet").exists()


def test_unreachable_hub_is_one_line_without_retries(tmp_path):
    # a hub that does not answer (loopback discard port): one request, then one line; the
    # datasets library alone would retry for ~25 s with a warning per attempt
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    proc = _cli("--source", "some-org/some-set", "--out", tmp_path / "h.parquet", env=env)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert (
        "hub could not be asked for 'some-org/some-set'" in lines[0]
        and "Retrying" not in proc.stderr
    )
    assert not (tmp_path / "h.parquet").exists()


def test_synthetic_writes_train_and_test(tmp_path):
    out = tmp_path / "arith.parquet"
    result = _invoke("--synthetic", "arith", "--num", "50", "--seed", "1", "--out", out)
    assert result.exit_code == 0, result.output
    train = pq.read_table(out)
    test = pq.read_table(tmp_path / "arith.test.parquet")
    assert train.column_names == test.column_names == COLUMNS
    assert (train.num_rows, test.num_rows) == (40, 10)
    assert not set(train.column("question").to_pylist()) & set(test.column("question").to_pylist())
    row = train.to_pylist()[0]
    assert json.loads(row["meta"])["question"] == row["question"]
    # same seed again needs --force and gives the same file content
    again = _invoke("--synthetic", "arith", "--num", "50", "--seed", "1", "--out", out)
    assert isinstance(again.exception, UserError)
    assert (
        _invoke(
            "--synthetic", "arith", "--num", "50", "--seed", "1", "--out", out, "--force"
        ).exit_code
        == 0
    )
    assert pq.read_table(out).equals(train)


def test_synthetic_words_writes_the_schema_and_sft_reads_its_solutions(tmp_path):
    from rstar2cli.data.tiny import build_tokenizer
    from rstar2cli.sft.coldstart_recipe import DataConfig
    from rstar2cli.sft.data import build_examples

    out = tmp_path / "words.parquet"
    result = _invoke("--synthetic", "words", "--num", "40", "--seed", "2", "--out", out)
    assert result.exit_code == 0, result.output
    train = pq.read_table(out).to_pylist()
    test = pq.read_table(tmp_path / "words.test.parquet").to_pylist()
    assert (len(train), len(test)) == (32, 8)
    assert all(list(r) == COLUMNS and r["source"] == "synthetic/words" for r in train + test)
    metas = [json.loads(r["meta"]) for r in train + test]
    assert all(m["question"] == r["question"] for m, r in zip(metas, train + test, strict=True))
    pairs = [{(m["template"], m["phrasing"]) for m in part} for part in (metas[:32], metas[32:])]
    assert not pairs[0] & pairs[1]
    cfg = DataConfig(sources=[{"path": str(out), "format": "words"}], max_seq_len=2048)
    examples, rejects = build_examples(cfg, build_tokenizer(), seed=0)
    assert (len(examples), rejects) == (32, [])


def test_synthetic_unknown_name_and_help(tmp_path):
    proc = _cli("--synthetic", "nope", "--out", tmp_path / "x.parquet")
    assert proc.returncode == 2 and "available: arith" in proc.stderr
    help_text = _invoke("--help").output
    squashed = re.sub(r"[\s│]", "", help_text)
    assert "(x.parquet->x.test.parquet)" in squashed


def test_options_of_the_other_mode_are_refused_not_ignored(tmp_path):
    out = tmp_path / "x.parquet"
    source = tmp_path / "raw.jsonl"
    source.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    synthetic = _cli(
        "--synthetic", "arith", "--out", out, "--rejects", tmp_path / "r.jsonl", "--no-dedupe"
    )
    lines = [ln for ln in synthetic.stderr.splitlines() if ln.strip()]
    assert synthetic.returncode == 2 and len(lines) == 1, synthetic.stderr
    assert "--dedupe/--no-dedupe, --rejects: only with --source" in lines[0]
    from_source = _cli("--source", source, "--out", out, "--num", "5")
    assert from_source.returncode == 2, from_source.stderr
    assert "--num: only with --synthetic; --source does not read it" in from_source.stderr
    assert list(tmp_path.iterdir()) == [source]  # nothing written
    # their defaults are not "given": each mode alone still runs
    assert _invoke("--source", source, "--out", out).exit_code == 0
    assert (
        _invoke("--synthetic", "arith", "--num", "20", "--out", tmp_path / "s.parquet").exit_code
        == 0
    )


def test_source_or_synthetic_required(tmp_path):
    result = _invoke("--out", tmp_path / "x.parquet")
    assert isinstance(result.exception, UserError)
    assert "--source or --synthetic" in str(result.exception)
