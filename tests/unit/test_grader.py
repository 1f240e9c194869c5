"""Grader tests on the real eval references (../shared/data/eval) and real worker processes.

Each reference is graded against itself and against equivalent rewritings generated from it;
perturbed references must be unequal. A pathological expression that makes sympy compute a
gigantic power must come back incorrect with status "timeout", a worker killed mid-check with
status "crash", and in both cases the rest of the batch is still graded.
"""

from __future__ import annotations

import json
import os
import threading
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from rstar2cli.reward import Grader, fast_equivalent, is_equivalent, reference_answer
from rstar2cli.reward.answer_normalize import answer_key, as_number, normalize_answer

EVAL_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "eval"
HANG = "9^{9^{9^{9}}}"  # sympy evaluates the tower eagerly: minutes of CPU, never returns in time


def _respond(answer: str) -> str:
    return f"<reason>work</reason>\n<answer>\nSo the answer is \\boxed{{{answer}}}.\n</answer>"


@pytest.fixture(scope="module")
def references() -> dict[str, list[str]]:
    if not EVAL_DIR.is_dir():
        pytest.skip(f"eval data not found at {EVAL_DIR}")
    refs = {}
    for name in ("aime24", "math500", "gsm8k"):
        path = EVAL_DIR / f"{name}.jsonl"
        if not path.exists():
            pytest.skip(f"{path} not found")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        refs[name] = [reference_answer(row["answer"]) for row in rows]
    return refs


@pytest.fixture(scope="module")
def grader():
    with Grader(num_workers=2, timeout_s=10.0) as g:
        yield g


def _rewritings(ref: str) -> list[str]:
    """Equivalent forms of a reference: numeric re-spellings and LaTeX wrapper changes."""
    forms = [f"${ref}$", f"{ref}.", f"\\text{{{ref}}}" if ref.isalpha() else ref]
    value = as_number(answer_key(normalize_answer(ref)))
    if isinstance(value, Fraction):
        forms += _numeric_forms(value)
    if "\\frac" in ref:
        forms.append(ref.replace("\\frac", "\\dfrac"))
    if "^\\circ" in ref:
        forms += [ref.replace("^\\circ", ""), ref.replace("^\\circ", "^{\\circ}")]
    if ref.startswith("\\text{") and ref.endswith("}"):
        forms.append(ref[len("\\text{") : -1])  # \text{Evelyn} -> Evelyn
    elif "\\text{" in ref or "\\mbox{" in ref:
        forms.append(ref.split("\\text{")[0].split("\\mbox{")[0].strip())  # drop the unit
    if ref[:1] in "([" and ref[-1:] in ")]":
        forms += [ref.replace(" ", ""), "\\left" + ref[0] + ref[1:-1] + "\\right" + ref[-1]]
    return forms


def _numeric_forms(value: Fraction) -> list[str]:
    if value.denominator == 1:
        n = int(value)
        forms = [str(n), f"x = {n}", f"{n}.0"]
        return forms + ([f"{n:,}"] if abs(n) >= 1000 else [])
    sign = "-" if value < 0 else ""
    num, den = abs(value.numerator), value.denominator
    forms = [f"{sign}\\dfrac{{{num}}}{{{den}}}", f"{sign}{num}/{den}"]
    if num < 10 and den < 10:
        forms.append(f"{sign}\\tfrac{num}{den}")
    if all(p in (2, 5) for p in _prime_factors(den)):  # terminating decimal, written out exactly
        forms.append(format(Decimal(value.numerator) / Decimal(value.denominator), "f"))
    return forms


def _prime_factors(n: int) -> set[int]:
    found, p = set(), 2
    while p * p <= n:
        while n % p == 0:
            found.add(p)
            n //= p
        p += 1
    return found | ({n} if n > 1 else set())


def test_every_reference_matches_itself(references, grader):
    refs = [r for rs in references.values() for r in rs]
    results = grader.grade_batch([(_respond(r), r) for r in refs])
    wrong = [(r, res) for r, res in zip(refs, results, strict=True) if not res.correct]
    assert not wrong, wrong[:10]
    assert all(res.status == "ok" and res.extracted is not None for res in results)


def test_equivalent_rewritings_of_references(references, grader):
    pairs = [(form, r) for rs in references.values() for r in rs for form in _rewritings(r)]
    assert len(pairs) > 4 * sum(len(rs) for rs in references.values())
    results = grader.grade_batch([(_respond(form), r) for form, r in pairs])
    wrong = [pair for pair, res in zip(pairs, results, strict=True) if not res.correct]
    assert not wrong, wrong[:10]


def test_numeric_references_reject_neighbours(references, grader):
    pairs = []
    for r in [r for rs in references.values() for r in rs]:
        value = as_number(answer_key(normalize_answer(r)))
        if isinstance(value, Fraction):
            pairs += [(str(value + 1), r), (str(-value - 1), r)]
    assert len(pairs) > 2000
    results = grader.grade_batch([(_respond(p), r) for p, r in pairs])
    wrongly_accepted = [pair for pair, res in zip(pairs, results, strict=True) if res.correct]
    assert not wrongly_accepted, wrongly_accepted[:10]


EQUIVALENT = [
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac12", "\\frac{1}{2}"),
    ("1000", "1,000"),
    ("30", "30^\\circ"),
    ("5", "x=5"),
    ("10080", "10,\\!080"),
    ("\\$18.90", "\\$18.90"),
    ("18.9", "\\$18.90"),
    ("137.5", "137 \\frac{1}{2}"),
    ("9/5", "1\\frac{4}{5}"),
    ("5.4", "5.4 \\text{ cents}"),
    ("15", "15\\mbox{ cm}^2"),
    ("(-\\infty,2)\\cup(3,\\infty)", "(-\\infty, 2) \\cup (3, \\infty)"),
    ("\\left[-2, 7\\right]", "x \\in [-2,7]"),
    ("(1.5,-13)", "\\left( \\frac{3}{2}, -13 \\right)"),
    ("7, 5, 3", "3, 5, 7"),
    ("B", "\\text{(B)}"),
    ("evelyn", "\\text{Evelyn}"),
    ("204_{5}", "204_5"),
    ("7i - 2", "-2 + 7i"),
    ("\\frac{\\sqrt{12}}{2}", "\\sqrt{3}"),
    ("2x+3", "y = 2x + 3"),
    (
        "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\\\ \\frac53 \\end{pmatrix}",
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
    ),
    ("(x+1)^2", "x^2+2x+1"),
    ("\\pi/6", "\\frac{\\pi}{6}"),
]

UNEQUAL = [
    ("0.51", "\\frac{1}{2}"),
    ("100", "1,000"),
    ("60", "30^\\circ"),
    ("(3,4)", "(3,4]"),
    ("(4,2)", "(2,4)"),
    ("2", "(2,4)"),
    ("(1,-16,-4,42)", "(1,-16,-4,43)"),
    ("3, 5", "3, 5, 7"),
    ("C", "\\text{(B)}"),
    ("Navin", "\\text{Evelyn}"),
    ("1 + 12i", "1 - 12i"),
    ("\\sqrt{6}", "\\sqrt{5}"),
    ("\\frac{\\pi}{3}", "\\frac{\\pi}{6}"),
    ("x^3+3x+6", "x^3+3x-6"),
    (
        "\\begin{pmatrix} -18 \\\\ 49 \\\\ 96 \\end{pmatrix}",
        "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}",
    ),
    ("", "5"),
]


@pytest.mark.parametrize(("pred", "ref"), EQUIVALENT)
def test_is_equivalent_accepts_rewritings(pred, ref):
    assert is_equivalent(pred, ref)


@pytest.mark.parametrize(("pred", "ref"), UNEQUAL)
def test_is_equivalent_rejects_different_answers(pred, ref):
    assert not is_equivalent(pred, ref)


def test_batch_agrees_with_in_process_check(grader):
    pairs = EQUIVALENT + UNEQUAL
    results = grader.grade_batch([(_respond(p), r) for p, r in pairs])
    assert [res.correct for res in results] == [True] * len(EQUIVALENT) + [False] * len(UNEQUAL)


def test_fast_path_decides_plain_numbers_without_sympy():
    assert fast_equivalent("0.25", "\\frac14") is True
    assert fast_equivalent("025", "25") is True
    assert fast_equivalent("26", "25") is False
    assert fast_equivalent("1e999999999", "1") is None  # not a number to the fast path: no hang
    assert fast_equivalent("\\sqrt{2}", "1.414") is None


def test_extraction_and_references():
    assert reference_answer("She makes 9 * 2 = $18.\n#### 18") == "18"
    assert reference_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    with Grader(num_workers=1, strict=True) as g:
        outside = "<reason>\\boxed{5}</reason><answer>5</answer>"
        res = g.grade_batch([(outside, "5"), ("no answer here", "5"), (_respond("5"), "5")])
    assert [(r.correct, r.status) for r in res] == [(False, "no_answer")] * 2 + [(True, "ok")]


def test_truncated_responses_score_zero(grader):
    text = _respond("42")
    results = grader.grade_batch([(text, "42")] * 3, finish_reasons=["budget", "answer", None])
    assert [(r.correct, r.status) for r in results] == [
        (False, "truncated"),
        (True, "ok"),
        (True, "ok"),
    ]
    assert results[0].extracted == "42"
    assert grader.score(text, "42", "max_turns") == 0.0
    assert grader.score(text, "42", "answer") == 1.0


def test_hanging_check_times_out_and_batch_goes_on():
    items = [
        (_respond(HANG), "1"),
        (_respond("\\frac{\\sqrt{12}}{2}"), "\\sqrt{3}"),
        (_respond("7"), "7"),
    ]
    with Grader(num_workers=1, timeout_s=1.0) as g:
        results = g.grade_batch(items)
        assert g.num_replaced == 1
        after = g.grade_batch([(_respond("2\\sqrt{3}"), "\\sqrt{12}")])
    assert (results[0].correct, results[0].status, results[0].extracted) == (False, "timeout", HANG)
    assert [(r.correct, r.status) for r in results[1:]] == [(True, "ok"), (True, "ok")]
    assert (after[0].correct, after[0].status) == (True, "ok")  # the replacement worker works


def test_worker_killed_mid_check_reports_crash():
    with Grader(num_workers=1, timeout_s=60.0) as g:
        killer = threading.Thread(target=_kill_busy_worker, args=(g,), daemon=True)
        killer.start()
        results = g.grade_batch([(_respond(HANG), "1"), (_respond("\\sqrt{4}"), "2")])
        killer.join(timeout=30)
        assert g.num_replaced == 1
    assert (results[0].correct, results[0].status) == (False, "crash")
    assert (results[1].correct, results[1].status) == (True, "ok")


def _kill_busy_worker(grader: Grader) -> None:
    """Play the OOM killer: SIGKILL the worker once it has started on the hanging check."""
    for _ in range(3000):
        worker = grader._workers[0] if grader._workers else None
        if worker is not None and worker.job is not None and worker.job[0] == HANG:
            time.sleep(0.2)  # let it get into sympy
            os.kill(worker.process.pid, 9)
            return
        time.sleep(0.01)
