"""`rstar2 eval` without a model: `--grade-only`, the one-line input errors, and the report.

- `--grade-only IN --out OUT` through the real entry point (subprocess) with the real grader
  workers, on GSM8K references from ../shared/data/eval;
- every bad input fails with exit 2 and one line, before any work (no output folder created);
- the report (summary.json, tables, eval.png) from a hand-written results.jsonl holding two
  labels whose every (id, sample) is finished, so the resume rule starts no engine at all; the
  expected numbers are worked out in comments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2cli.eval.benchmarks import BENCHMARKS, multiple_choice_row


def _flat(text: str) -> str:
    """Output with rich's line wrapping undone (it wraps at the terminal width)."""
    return " ".join(text.split())


RSTAR2 = [sys.executable, "-m", "rstar2cli.cli"]
EVAL_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "eval"
needs_eval = pytest.mark.skipif(
    not (EVAL_DIR / "gsm8k.jsonl").is_file(), reason=f"eval data not found in {EVAL_DIR}"
)


def _cli(*args, timeout=180):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(
        [*RSTAR2, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def _gsm8k(num):
    lines = (EVAL_DIR / "gsm8k.jsonl").read_text().splitlines()[:num]
    return [json.loads(line) for line in lines]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@needs_eval
def test_grade_only_adds_correct_and_extracted_and_prints_accuracy(tmp_path):
    rows = _gsm8k(4)  # references end in "#### 18", "#### 3", "#### 70000", "#### 540"
    responses = [
        "<answer>The total is \\boxed{18}</answer>",  # right
        "<answer>\\boxed{3.0}</answer>",  # right, another spelling
        "<answer>\\boxed{70,001}</answer>",  # wrong
        "I am not sure.",  # no answer
    ]
    src = tmp_path / "in.jsonl"
    _write_jsonl(
        src,
        [
            {"response": r, "answer": row["answer"], "idx": row["idx"]}
            for r, row in zip(responses, rows, strict=False)
        ],
    )
    dst = tmp_path / "graded.jsonl"
    res = _cli("eval", "--grade-only", src, "--out", dst)
    assert res.returncode == 0, res.stderr
    assert "accuracy 50.0% (2/4)" in _flat(res.stdout)
    graded = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [g["correct"] for g in graded] == [True, True, False, False]
    assert [g["extracted"] for g in graded] == ["18", "3.0", "70,001", None]
    assert [g["idx"] for g in graded] == [0, 1, 2, 3]  # other fields kept

    # an existing output is kept unless --force
    before = dst.read_text()
    again = _cli("eval", "--grade-only", src, "--out", dst)
    assert again.returncode == 2 and "output exists" in again.stderr and dst.read_text() == before
    forced = _cli("eval", "--grade-only", src, "--out", dst, "--force")
    assert forced.returncode == 0 and dst.read_text() == before


def test_bad_inputs_fail_with_one_line_before_any_work(tmp_path):
    data = tmp_path / "tiny.jsonl"
    _write_jsonl(data, [{"question": "What is 1+1?", "answer": "2"}])
    fake_model = tmp_path / "model"
    fake_model.mkdir()
    (fake_model / "config.json").write_text("{}")
    out = tmp_path / "out"
    base = ["--model", fake_model, "--out", out]
    dead_endpoint = ["--endpoint", "http://127.0.0.1:9", "--data", data, "--out", out]
    cases = [
        (["--grade-only", data], "--grade-only needs --out OUT.jsonl"),
        (["--grade-only", data, "--model", fake_model, "--out", tmp_path / "g.jsonl"], "takes no"),
        (
            ["--grade-only", tmp_path / "none.jsonl", "--out", tmp_path / "g.jsonl"],
            "file not found",
        ),
        (["--data", data, "--out", out], "exactly one of --model"),
        (
            [
                "--model",
                fake_model,
                "--endpoint",
                "http://127.0.0.1:9",
                "--data",
                data,
                "--out",
                out,
            ],
            "exactly one of --model",
        ),
        ([*base], "at least one --benchmark"),
        ([*base, "--benchmark", "aime2099"], "unknown benchmark 'aime2099'"),
        ([*base, "--data", tmp_path / "missing.jsonl"], "--data file not found"),
        ([*base, "--data", data, "--samples", 2, "--k", 4], "--k must be between 1 and --samples"),
        ([*base, "--data", data, "--data", data], "benchmark names repeat"),
        ([*base, "--data", data, "--engine", "tpu"], "--engine must be vllm or hf"),
        (["--model", tmp_path / "nope", "--data", data, "--out", out], "model path not found"),
        (dead_endpoint, "does not answer"),
        ([*dead_endpoint, "--speculative", "ngram:4"], "an --endpoint server decodes as it was"),
        ([*base, "--data", data, "--sandbox", "http://127.0.0.1:9"], "no sandbox answered"),
        (["--model", fake_model, "--data", data], "--out DIR is required"),
    ]
    for args, message in cases:
        res = _cli("eval", *args, timeout=120)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2 and len(lines) == 1 and message in lines[0], (args, res.stderr)
    assert not out.exists()


def test_grade_only_prints_the_status_counts_verbatim(tmp_path):
    src = tmp_path / "in.jsonl"
    _write_jsonl(
        src,
        [
            {"response": "<answer>\\boxed{2}</answer>", "answer": "2"},
            {"response": "x", "answer": "3"},
        ],
    )
    res = _cli("eval", "--grade-only", src, "--out", tmp_path / "g.jsonl")
    assert res.returncode == 0, res.stderr
    assert "[no_answer 1, ok 1]" in _flat(res.stdout)  # not eaten as rich markup


def _row(label, bench, pid, sample, correct, extracted, tokens, statuses, finish="answer"):
    return {
        "label": label,
        "benchmark": bench,
        "id": pid,
        "sample": sample,
        "question": "q",
        "answer": "a",
        "response_ids": [7] * tokens,
        "text": "",
        "num_turns": 1,
        "tool_calls": [{"status": s, "duration_s": 0.01, "code": "print(1)"} for s in statuses],
        "finish_reason": finish,
        "correct": correct,
        "extracted": extracted,
        "reward": float(correct),
        "num_response_tokens": tokens,
    }


def test_finished_results_are_skipped_and_summarised_for_every_label(tmp_path):
    data = tmp_path / "mini.jsonl"  # benchmark "mini", problem ids mini-0 and mini-1
    _write_jsonl(
        data,
        [{"question": "What is 9*2?", "answer": "18"}, {"question": "What is 1+2?", "answer": "3"}],
    )
    fake_model = tmp_path / "stage2"
    fake_model.mkdir()
    (fake_model / "config.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    rows = [
        # stage1: mini-0 [right, wrong], mini-1 [wrong, wrong] -> avg@2 = (1/2 + 0) / 2 = 25%,
        # pass@2 = (1 + 0) / 2 = 50%; 2 tool calls (ok, error) over 4 trajectories
        _row("stage1", "mini", "mini-0", 0, True, "18", 100, ["ok"]),
        _row("stage1", "mini", "mini-0", 1, False, "17", 200, ["error"]),
        _row("stage1", "mini", "mini-1", 0, False, None, 300, [], "budget"),
        _row("stage1", "mini", "mini-1", 1, False, "4", 400, []),
        # stage2: mini-0 [right, right], mini-1 [right, wrong] -> avg@2 = (1 + 1/2) / 2 = 75%,
        # pass@2 = 100%; maj@2: mini-0 "18","18.0" one class (right); mini-1 "3" vs "4" tie, "3"
        # came first (right) -> 100%
        _row("stage2", "mini", "mini-1", 1, False, "4", 10, ["ok"]),  # order in file is free
        _row("stage2", "mini", "mini-0", 0, True, "18", 10, ["ok"]),
        _row("stage2", "mini", "mini-0", 1, True, "18.0", 10, ["ok"]),
        _row("stage2", "mini", "mini-1", 0, True, "3", 10, ["timeout"]),
    ]
    _write_jsonl(out / "results.jsonl", rows)
    res = _cli(
        "eval",
        "--model",
        fake_model,
        "--data",
        data,
        "--out",
        out,
        "--samples",
        2,
        "--k",
        1,
        "--k",
        2,
    )
    assert res.returncode == 0, res.stderr
    assert "0 trajectories to run" in _flat(res.stdout)
    assert "temperature 0.6, max 30 turns, 30000 response tokens" in _flat(
        res.stdout
    )  # says what it runs
    assert len((out / "results.jsonl").read_text().splitlines()) == 8  # nothing added
    summary = json.loads((out / "summary.json").read_text())["labels"]
    s1, s2 = summary["stage1"]["benchmarks"]["mini"], summary["stage2"]["benchmarks"]["mini"]
    assert s1["avg_at_n"] == pytest.approx(0.25) and s2["avg_at_n"] == pytest.approx(0.75)
    assert s1["pass_at_k"] == {"pass@1": pytest.approx(0.25), "pass@2": pytest.approx(0.5)}
    assert s2["pass_at_k"]["pass@2"] == pytest.approx(1.0)
    # stage1 maj@2: mini-0 "18" vs "17" tie, "18" first (right) -> 1; mini-1 only "4" -> 0: 50%
    assert s1["maj_at_k"]["maj@2"] == pytest.approx(0.5)
    assert s2["maj_at_k"]["maj@2"] == pytest.approx(1.0)
    assert s1["mean_response_tokens"] == pytest.approx(250.0)  # (100+200+300+400)/4
    assert s1["tool_calls_per_trajectory"] == pytest.approx(0.5)
    assert s1["tool_error_rate_by_status"] == {"error": pytest.approx(0.5)}
    assert s1["finish_reasons"] == {"answer": 3, "budget": 1}
    assert summary["stage2"]["settings"]["temperature"] == 0.6  # this run's label
    assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "75.0" in _flat(res.stdout) and "25.0" in _flat(
        res.stdout
    )  # the table shows both labels

    # the same label with other sampling settings is refused, before any work
    again = _cli(
        "eval",
        "--model",
        fake_model,
        "--data",
        data,
        "--out",
        out,
        "--samples",
        2,
        "--temperature",
        1.0,
    )
    lines = [ln for ln in again.stderr.splitlines() if ln.strip()]
    assert again.returncode == 2 and len(lines) == 1 and "temperature=0.6" in lines[0]


def test_known_benchmarks_and_multiple_choice_rows():
    assert {"aime24", "aime25", "hmmt25", "math500", "gsm8k", "amc23", "gpqa-diamond"} <= set(
        BENCHMARKS
    )
    row = {
        "Question": "Which?",
        "Correct Answer": "right",
        "Incorrect Answer 1": "w1",
        "Incorrect Answer 2": "w2",
        "Incorrect Answer 3": "w3",
    }
    first, second = multiple_choice_row(row), multiple_choice_row(row)
    assert first == second  # the shuffle is fixed per question
    letter = first["answer"]
    assert f"({letter}) right" in first["question"]
    assert sum(f"({x}) " in first["question"] for x in "ABCD") == 4
