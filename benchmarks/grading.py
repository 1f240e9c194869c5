"""Benchmark: our batch grader vs plain math-verify on the same (response, answer) pairs.

Builds N pairs (default 5,000) from the eval references in ../shared/data/eval (AIME24, MATH-500,
GSM8K): the reference boxed verbatim ("exact"), an equivalent rewriting of it ("equivalent":
\\dfrac, decimals, thousands separators, `x = `, `^\\circ`, `\\text{}`, `$...$`, spacing) or a wrong
answer ("wrong": a neighbouring number, or another problem's answer). Each response is a short
<reason>/<answer> text with some inline maths before the box, as a model would write it.

Baseline: math-verify as its README shows it, in the main thread, one pair after another:
`verify(parse("$" + answer + "$"), parse(response))`. Ours: `Grader(num_workers=2).grade_batch`
on the whole list, workers already started (start-up is printed separately).

Prints throughput (checks/s) with the ratio, and agreement with math-verify per kind of pair.
Run: `.venv/bin/python -m benchmarks.grading [--num-pairs 5000] [--seed 0]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

EVAL_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eval"
SET_WEIGHTS = {"math500": 0.5, "gsm8k": 0.35, "aime24": 0.15}
KIND_WEIGHTS = {"exact": 0.4, "equivalent": 0.3, "wrong": 0.3}
FILLER = (
    "Let $f(x) = x^2 - 3x + 2$, so the roots satisfy $x_1 + x_2 = 3$ and $x_1 x_2 = 2$. "
    "Checking with the tool gives the same value, and the case $n = 0$ is excluded. "
)


def load_references() -> dict[str, list[str]]:
    from rstar2cli.reward import reference_answer

    refs = {}
    for name in SET_WEIGHTS:
        path = EVAL_DIR / f"{name}.jsonl"
        if not path.exists():
            raise SystemExit(f"eval data not found: {path}")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        refs[name] = [reference_answer(row["answer"]) for row in rows]
    return refs


def rewritings(ref: str) -> list[str]:
    """Equivalent spellings of a reference (only ones that keep its value)."""
    from rstar2cli.reward.answer_normalize import answer_key, as_number, normalize_answer

    forms = [f"${ref}$", ref + "."]
    value = as_number(answer_key(normalize_answer(ref)))
    if isinstance(value, Fraction) and value.denominator == 1:
        n = int(value)
        forms += [f"x = {n}", f"{n}.0"] + ([f"{n:,}"] if abs(n) >= 1000 else [])
    elif isinstance(value, Fraction):
        sign, num, den = ("-" if value < 0 else ""), abs(value.numerator), value.denominator
        forms += [f"{sign}\\dfrac{{{num}}}{{{den}}}", f"{sign}{num}/{den}"]
        if set(_prime_factors(den)) <= {2, 5}:
            forms.append(format(Decimal(value.numerator) / Decimal(value.denominator), "f"))
    if "\\frac" in ref:
        forms.append(ref.replace("\\frac", "\\dfrac"))
    if "^\\circ" in ref:
        forms.append(ref.replace("^\\circ", ""))
    if ref.startswith("\\text{") and ref.endswith("}"):
        forms.append(ref[len("\\text{") : -1])
    if ref[:1] in "([" and ref[-1:] in ")]":
        forms += [ref.replace(" ", ""), "\\left" + ref[0] + ref[1:-1] + "\\right" + ref[-1]]
    return forms


def wrong_answer(ref: str, others: list[str], rng: random.Random) -> str:
    from rstar2cli.reward.answer_normalize import answer_key, as_number, normalize_answer

    value = as_number(answer_key(normalize_answer(ref)))
    if isinstance(value, Fraction) and rng.random() < 0.7:
        return str(value + rng.choice([1, -1, 2, 10]))
    while True:
        other = rng.choice(others)
        if answer_key(normalize_answer(other)) != answer_key(normalize_answer(ref)):
            return other


def _prime_factors(n: int) -> list[int]:
    found, p = [], 2
    while p * p <= n:
        while n % p == 0:
            found.append(p)
            n //= p
        p += 1
    return found + ([n] if n > 1 else [])


def build_pairs(num_pairs: int, seed: int) -> list[tuple[str, str, str, str]]:
    """(set, kind, response, answer) tuples."""
    rng = random.Random(seed)
    refs = load_references()
    everything = [r for rs in refs.values() for r in rs]
    pairs = []
    for _ in range(num_pairs):
        name = rng.choices(list(SET_WEIGHTS), weights=list(SET_WEIGHTS.values()))[0]
        kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
        ref = rng.choice(refs[name])
        if kind == "exact":
            boxed = ref
        elif kind == "equivalent":
            boxed = rng.choice(rewritings(ref))
        else:
            boxed = wrong_answer(ref, everything, rng)
        reasoning = FILLER * rng.randint(1, 4)
        response = f"{reasoning}</reason>\n<answer>\nThe answer is $\\boxed{{{boxed}}}$.\n</answer>"
        pairs.append((name, kind, response, ref))
    return pairs


def run_math_verify(pairs) -> tuple[list[bool], float]:
    from math_verify import parse, verify

    start = time.perf_counter()
    verdicts = [bool(verify(parse("$" + ref + "$"), parse(resp))) for _, _, resp, ref in pairs]
    return verdicts, time.perf_counter() - start


def run_ours(pairs, num_workers: int, timeout_s: float) -> tuple[list, float, float, int]:
    from rstar2cli.reward import Grader

    start = time.perf_counter()
    grader = Grader(num_workers=num_workers, timeout_s=timeout_s)
    grader.grade_batch([("\\boxed{\\sqrt{4}}", "2")] * num_workers)  # workers up and warm
    startup_s = time.perf_counter() - start
    try:
        start = time.perf_counter()
        results = grader.grade_batch([(resp, ref) for _, _, resp, ref in pairs])
        elapsed_s = time.perf_counter() - start
    finally:
        grader.close()
    return results, elapsed_s, startup_s, grader.num_replaced


def print_report(pairs, mv, mv_s, ours, ours_s, startup_s, num_replaced) -> None:
    from rstar2cli.reward import fast_equivalent
    from rstar2cli.reward.grader import reference_answer

    n = len(pairs)
    num_fast = sum(
        1
        for (_, _, _, ref), r in zip(pairs, ours, strict=True)
        if r.extracted is not None
        and fast_equivalent(r.extracted, reference_answer(ref)) is not None
    )
    print(
        f"\n{n} pairs ("
        + ", ".join(f"{k}: {sum(p[1] == k for p in pairs)}" for k in KIND_WEIGHTS)
        + ") from "
        + ", ".join(f"{s}: {sum(p[0] == s for p in pairs)}" for s in SET_WEIGHTS)
    )
    print(f"decided by our fast path: {num_fast} ({num_fast / n:.1%}); the rest went to workers")
    print(f"our grader start-up (spawn + warm-up, once per run): {startup_s:.2f} s\n")
    print(f"{'grader':<34}{'time s':>9}{'checks/s':>11}{'ratio':>8}")
    print(f"{'math-verify (main thread, serial)':<34}{mv_s:>9.2f}{n / mv_s:>11.0f}{1.0:>8.2f}")
    print(
        f"{'rstar2cli Grader (2 workers)':<34}{ours_s:>9.2f}{n / ours_s:>11.0f}{mv_s / ours_s:>8.2f}"
    )
    print(
        f"\n{'kind':<12}{'pairs':>7}{'mv accepts':>12}{'ours accepts':>14}{'agree':>9}"
        f"{'only mv':>9}{'only ours':>11}"
    )
    for kind in KIND_WEIGHTS:
        idx = [i for i, p in enumerate(pairs) if p[1] == kind]
        mv_yes = sum(mv[i] for i in idx)
        ours_yes = sum(ours[i].correct for i in idx)
        agree = sum(mv[i] == ours[i].correct for i in idx)
        only_mv = sum(mv[i] and not ours[i].correct for i in idx)
        only_ours = sum(ours[i].correct and not mv[i] for i in idx)
        print(
            f"{kind:<12}{len(idx):>7}{mv_yes:>12}{ours_yes:>14}{agree / len(idx):>9.1%}"
            f"{only_mv:>9}{only_ours:>11}"
        )
    agree_all = sum(mv[i] == ours[i].correct for i in range(n))
    statuses: dict[str, int] = {}
    for r in ours:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    print(f"{'all':<12}{n:>7}{sum(mv):>12}{sum(r.correct for r in ours):>14}{agree_all / n:>9.1%}")
    print(f"\nour statuses: {statuses}; workers replaced: {num_replaced}")
    _print_disagreements(pairs, mv, ours)


def _print_disagreements(pairs, mv, ours, max_shown: int = 8) -> None:
    """Distinct differing pairs, grouped: a boxed answer ending in a period is its own group."""
    groups: dict[str, list[str]] = {}
    for (_, kind, _, ref), verdict, r in zip(pairs, mv, ours, strict=True):
        if verdict == r.correct:
            continue
        period = "boxed answer ends with '.'" if (r.extracted or "").endswith(".") else "other"
        side = "only mv accepts" if verdict else "only ours accepts"
        line = f"boxed={r.extracted!r} ref={ref!r}"
        group = groups.setdefault(f"[{kind}] {side}, {period}", [])
        if line not in group:
            group.append(line)
    for name, lines in sorted(groups.items()):
        print(f"  {name}: {len(lines)} distinct, e.g.")
        for line in lines[:max_shown]:
            print(f"    {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-pairs", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    pairs = build_pairs(args.num_pairs, args.seed)
    ours, ours_s, startup_s, num_replaced = run_ours(pairs, args.num_workers, args.timeout_s)
    mv, mv_s = run_math_verify(pairs)
    print_report(
        pairs=pairs,
        mv=mv,
        mv_s=mv_s,
        ours=ours,
        ours_s=ours_s,
        startup_s=startup_s,
        num_replaced=num_replaced,
    )


if __name__ == "__main__":
    main()
