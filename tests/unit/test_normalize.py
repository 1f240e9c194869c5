"""Schema detection, answer extraction and the filters of rstar2cli.data.dataset_normalize."""

from __future__ import annotations

import datetime
import json

import pytest

from rstar2cli.data import dataset_normalize as nz


def _run(rows, **kw):
    return nz.normalize_records(rows, "t", nz.NormalizeOptions(**kw))


# --- answer extraction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $\\boxed{42}$.", "42"),
        ("\\boxed{\\frac{1}{2}} then \\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\dfrac{\\sqrt{3}}{2}"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("answer: \\boxed {x^{2}+1}", "x^{2}+1"),
        ("brace-less $\\boxed 5$", "5"),
        ("old style \\fbox{7}", "7"),
        ("no box here", None),
        ("unbalanced \\boxed{1", None),
        # the last *complete* box wins over a trailing broken one
        ("\\boxed{3} and later \\boxed{", "3"),
    ],
)
def test_last_boxed(text, expected):
    assert nz.last_boxed(text) == expected


def test_gsm8k_answer_takes_last_marker_and_drops_commas():
    text = "80,000+50,000=<<80000+50000=130000>>130,000\n#### 70,000"
    assert nz.gsm8k_answer(text) == "70000"
    assert nz.gsm8k_answer("steps\n#### $1,450,000.") == "1450000"
    assert nz.gsm8k_answer("no marker 12") is None


@pytest.mark.parametrize(
    "raw, expected",
    [("025", "25"), ("+7", "7"), ("-0", "0"), (" 58,500 ", "58500"), ("10{,}080", "10080"),
     ("$12$", "12"), ("(1,2)", "(1,2)"), ("1,23", "1,23"), ("\\frac{1}{2}", "\\frac{1}{2}")],
)  # fmt: skip
def test_canonical_answer(raw, expected):
    assert nz.canonical_answer(raw) == expected


def test_find_answer_schemas_in_order():
    # plain answer field (MATH500/AIME style)
    assert (
        nz.find_answer({"answer": "\\frac{14}{3}", "solution": "\\boxed{9}"})[0] == "\\frac{14}{3}"
    )
    # GSM8K: the answer field is a worked solution ending in #### n
    assert nz.find_answer({"answer": "3*3=9\n#### 9"}) == ("9", "answer")
    # verl / rStar release schema
    row = {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "204"}}
    assert nz.find_answer(row) == ("204", "reward_model.ground_truth")
    # only a solution: its last \boxed{}
    assert nz.find_answer({"solution": "a \\boxed{1} b \\boxed{{2}}"}) == ("{2}", "solution")
    # numbers stored as numbers
    assert nz.find_answer({"answer": 18})[0] == "18"
    assert nz.find_answer({"answer": 4.0})[0] == "4"
    assert nz.find_answer({"question": "q"})[0] is None


def test_answer_field_override_with_dotted_path():
    row = {"answer": "wrong", "meta": {"final": "\\boxed{12}"}}
    assert nz.find_answer(row, "meta.final") == ("12", "meta.final")
    ans, detail = nz.find_answer(row, "meta.missing")
    assert ans is None and "meta.missing" in detail


# --- question detection -----------------------------------------------------------------------


def test_find_question_fields_and_chat_prompt():
    assert nz.find_question({"problem": "P", "question": "Q"})[0] == "P"
    assert nz.find_question({"question": "  Q  "})[0] == "  Q  "  # verbatim, not stripped
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "U"}]
    assert nz.find_question({"prompt": chat})[0] == "U"
    assert nz.find_question({"text": "T"}, question_field="text")[0] == "T"
    q, detail = nz.find_question({"text": "T"})
    assert q is None and "problem" in detail
    assert nz.find_question({"problem": "   "})[0] is None


# --- the whole pass ---------------------------------------------------------------------------


def test_normalize_records_keeps_meta_and_ids():
    rows = [{"problem": "What is 1+1?", "answer": "2", "extra": [1, 2]}]
    result = _run(rows)
    assert [p.to_row()["id"] for p in result.kept] == ["t-0"]
    (p,) = result.kept
    assert (p.question, p.answer, p.source) == ("What is 1+1?", "2", "t")
    assert json.loads(p.meta) == rows[0]
    assert result.rejects == []


def test_rejects_carry_reason_row_and_index():
    rows = [
        {"question": "Find x if 2x=4.", "answer": "2"},
        {"foo": "bar"},
        {"question": "No answer here"},
        {"question": "Find y.", "answer": "\\frac{1}{2}"},
        {"question": "find  X if 2x=4!", "answer": "2"},  # same normalised question as row 0
    ]
    result = _run(rows, integer_only=True)
    assert [p.id for p in result.kept] == ["t-0"]
    got = [(r.reason, r.index) for r in result.rejects]
    assert got == [
        (nz.NO_QUESTION, 1),
        (nz.NO_ANSWER, 2),
        (nz.NOT_INTEGER, 3),
        (nz.DUPLICATE, 4),
    ]
    assert result.rejects[3].detail == "same question as t-0"
    assert result.rejects[1].to_row()["row"] == {"question": "No answer here"}


def test_no_dedupe_keeps_repeats():
    rows = [{"question": "Same?", "answer": "1"}, {"question": "same", "answer": "1"}]
    assert len(_run(rows, dedupe=False).kept) == 2
    assert len(_run(rows).kept) == 1


def test_integer_only_accepts_canonical_integers():
    rows = [
        {"question": f"q{i}", "answer": a} for i, a in enumerate(["025", "1,000", "-3", "2.5", "x"])
    ]
    kept = _run(rows, integer_only=True).kept
    assert [p.answer for p in kept] == ["25", "1000", "-3"]


def test_ngrams_and_decontamination():
    eval_q = "Let x, y and z be positive real numbers such that xyz = 1. Find the minimum."
    grams = nz.eval_ngrams([eval_q])
    # "let x y and z be positive real numbers such that xyz 1 find the minimum": 16 words -> 9
    assert len(grams) == 16 - 8 + 1
    rows = [
        # shares "let x y and z be positive real" (and more) with the eval question
        {"question": "Let x, y and z be positive real numbers with x+y+z=3.", "answer": "1"},
        {"question": "let X,Y AND z be positive REAL", "answer": "2"},  # punctuation/case ignored
        {"question": "Compute 3*4.", "answer": "12"},  # short and unrelated: kept
        {
            "question": "Let x and y be positive real numbers.",
            "answer": "3",
        },  # near, no 8 words shared
    ]
    result = _run(rows, eval_grams=grams)
    assert [p.answer for p in result.kept] == ["12", "3"]
    assert [r.reason for r in result.rejects] == [nz.CONTAMINATED, nz.CONTAMINATED]
    assert "positive real" in result.rejects[1].detail


def test_short_texts_match_whole():
    grams = nz.eval_ngrams(["Compute 3*4."])
    assert grams == {("compute", "3", "4")}
    result = _run([{"question": "compute 3 * 4", "answer": "12"}], eval_grams=grams)
    assert [r.reason for r in result.rejects] == [nz.CONTAMINATED]


def test_rows_with_non_json_values_still_serialise():
    day = datetime.date(2024, 2, 1)
    result = _run([{"question": "q?", "answer": "1", "when": day}, {"question": "r?", "when": day}])
    assert json.loads(result.kept[0].meta)["when"] == "2024-02-01"
    assert result.rejects[0].to_row()["row"] == {"question": "r?", "when": "2024-02-01"}
