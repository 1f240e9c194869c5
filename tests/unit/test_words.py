"""The "words" set: determinism, answers that running the solution gives, a split by template and
phrasing, transcripts in the protocol's layout, and no 8-gram shared with GSM8K test."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import pytest

from rstar2cli import protocol as P
from rstar2cli.data.synthetic import make_synthetic
from rstar2cli.data.words.generate import (
    HELD_OUT_TEMPLATES,
    TEMPLATES,
    draw_problem,
    make_words,
    split_pairs,
)
from rstar2cli.data.words.template import (
    PEOPLE,
    PERSON_SLOTS,
    number_slots,
    render,
    spellable_slots,
)
from rstar2cli.sft.data import render_chat
from rstar2cli.sft.synthetic_transcripts import make_transcripts, run_code

GSM8K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "eval" / "gsm8k.jsonl"


@pytest.fixture(scope="module")
def words():
    return make_words(2000, seed=0)


def test_deterministic_per_seed_and_the_same_through_make_synthetic(words):
    assert make_synthetic("words", 2000, seed=0) == words
    other_train, _ = make_words(2000, seed=1)
    assert [r["question"] for r in other_train] != [r["question"] for r in words[0]]
    train, test = words
    assert (len(train), len(test)) == (1600, 400)
    questions = [r["question"] for r in train + test]
    assert len(set(questions)) == len(questions)
    ids = [r["id"] for r in train + test]
    assert len(set(ids)) == len(ids)


def test_every_answer_is_what_its_solution_prints():
    """Every (template, phrasing), several draws: the answer function and the code agree."""
    rng = random.Random(0)
    for template in TEMPLATES:
        for phrasing in range(len(template.phrasings)):
            for _ in range(4):
                row = draw_problem((template, phrasing), rng)
                status, stdout, stderr = run_code(row["solution"])
                assert (status, stderr) == ("ok", ""), (template.key, row["solution"])
                assert stdout == row["answer"] + "\n", (template.key, row["question"])
                assert int(row["answer"]) > 0


def test_phrasings_give_every_number_and_solutions_are_short_and_regular():
    for t in TEMPLATES:
        numbers = t.draw(random.Random(1))
        assert len(t.phrasings) >= 3 and numbers, t.key
        for text in t.phrasings:
            fields = {f for f in re.findall(r"{(\w+)}", text)}
            assert fields - PERSON_SLOTS == set(numbers), (t.key, text)
            assert len(number_slots(text)) == len(numbers)
        assert t.steps[-1].startswith("print(") and 2 <= len(t.steps) <= 5, t.key
    assert len({t.key for t in TEMPLATES}) == len(TEMPLATES)
    settings = Counter(t.setting for t in TEMPLATES)
    assert len(settings) >= 8 and max(settings.values()) <= len(TEMPLATES) // 4, settings


def test_small_numbers_are_sometimes_words_in_the_question_and_digits_in_the_code():
    template = next(t for t in TEMPLATES if t.key == "split_bill")
    numbers = {"people": 5, "bill": 130, "tip": 20}
    person = PEOPLE[0]
    question, code = render(template, 0, numbers, person, spelled=frozenset({"people"}))
    assert question.startswith("Five friends eat out. The bill is 130 dollars")
    assert code.splitlines()[:3] == ["people = 5", "bill = 130", "tip = 20"]
    assert run_code(code) == ("ok", "30\n", "")
    discount = next(t for t in TEMPLATES if t.key == "shop_discount")  # never "ten%"
    assert spellable_slots(discount.phrasings[0], {"price": 80, "percent": 10, "count": 3}) == [
        "count"
    ]


def test_split_shares_no_template_and_no_phrasing(words):
    train, test = words
    train_pairs = {(r["template"], r["phrasing"]) for r in train}
    train_templates = {r["template"] for r in train}
    assert not train_templates & HELD_OUT_TEMPLATES
    assert not train_pairs & {(r["template"], r["phrasing"]) for r in test}
    kinds = Counter(r["held_out"] for r in test)
    assert set(kinds) == {"template", "phrasing"} and min(kinds.values()) > 60, kinds
    for r in test:
        assert (r["template"] in HELD_OUT_TEMPLATES) == (r["held_out"] == "template")
        assert r["held_out"] == "template" or r["template"] in train_templates
    all_train, new_template, new_phrasing = split_pairs()
    assert train_pairs == {(t.key, i) for t, i in all_train}  # 1600 problems cover all of them
    assert {(r["template"], r["phrasing"]) for r in test} <= {
        (t.key, i) for t, i in new_template + new_phrasing
    }


@pytest.mark.parametrize("template", ["paper", "release"])
def test_transcripts_write_the_solution_read_the_tool_and_box_the_answer(words, template):
    rows = words[0][:60]
    chats = make_transcripts(rows, error_fraction=0.5, seed=3, template=template, kind="words")
    errors = Counter()
    for row, chat in zip(rows, chats, strict=True):
        segs = render_chat(chat, template)
        assert segs[0].text == P.render_prompt(row["question"], template)
        assert [s.trainable for s in segs] == [False, True] * (len(segs) // 2)
        calls = [P.parse_tool_calls(s.text) for s in segs[1::2]]
        tool_outputs = [m.content for m in chat.messages if m.role == "tool"]
        assert calls[-1] == [] and len(calls) == len(tool_outputs) + 1
        assert calls[-2][0].error is None and calls[-2][0].code == row["solution"]
        assert tool_outputs[-1] == row["answer"]
        assert segs[2 * len(tool_outputs)].text.endswith(
            P.render_tool_response(row["answer"], template)
        )
        assert P.extract_answer(segs[-1].text, strict=True) == row["answer"]
        if len(tool_outputs) == 2:  # a broken first call, its real traceback, then the fix
            kind = "NameError" if "NameError" in tool_outputs[0] else "SyntaxError"
            assert kind in tool_outputs[0] and 'File "main.py"' in tool_outputs[0]
            errors[kind] += 1
    assert set(errors) == {"NameError", "SyntaxError"} and 15 <= sum(errors.values()) <= 45


def test_transcripts_read_the_solution_from_meta_and_reject_rows_without_one(words):
    import json

    row = words[0][0]
    from_meta = {k: row[k] for k in ("id", "question", "answer", "source")}
    from_meta["meta"] = json.dumps(row)
    (a,) = make_transcripts([row], error_fraction=0.0, seed=0, kind="words")
    (b,) = make_transcripts([from_meta], error_fraction=0.0, seed=0, kind="words")
    assert a == b and a.messages[2].calls[0].arguments["code"] == row["solution"]
    (missing,) = make_transcripts([{"question": "q", "answer": "1"}], 0.0, seed=0, kind="words")
    assert "reference solution" in str(missing)


@pytest.mark.skipif(not GSM8K.is_file(), reason=f"no GSM8K test file at {GSM8K}")
def test_no_question_shares_an_8gram_with_gsm8k_test():
    """The project's decontamination rule (prepare-data --decontaminate) finds nothing."""
    from rstar2cli.data.dataset_normalize import eval_ngrams, find_question, ngrams
    from rstar2cli.fileio import read_records

    rows, _ = read_records(GSM8K)
    grams = eval_ngrams(q for q in (find_question(r)[0] for r in rows) if q)
    assert len(grams) > 50_000  # the whole test split was read
    for seed in (0, 1):
        train, test = make_words(4000, seed=seed)
        for r in train + test:
            assert not ngrams(r["question"]) & grams, r["question"]
