"""Synthetic tool-use task sets: "arith" for the tiny default model, "words" for small real ones.

`make_synthetic(name, num, seed)` returns (train_rows, test_rows) with rows
`{"id", "question", "answer", "source"}` and integer answers. The set "arith" asks for
expressions such as "Compute 37*41+5." — products of two-digit numbers that a model with a few
hundred thousand parameters cannot work out in its head, but can answer by writing the expression
as a Python tool call and copying the printed number into `\\boxed{}`. Questions stay under ~30
characters so prompt + tool call + answer fit the tiny model's short context.

`num` is the total number of problems; a fifth of them (at least one) form the test split. Every
question is unique, so train and test are disjoint; the same (name, num, seed) always gives the
same rows. "words" (`rstar2cli.data.words.generate`) holds everyday multi-step word problems,
with a reference Python solution in each row, split by template and by phrasing.
It does not write files (`rstar2 prepare-data --synthetic` does) and needs no model.
Tested in tests/unit/test_synthetic.py and tests/unit/test_words.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from rstar2cli.errors import UserError

MAX_NUM = 200_000  # far below the number of distinct "arith" expressions (~10^6 per form)


# Each form: (template, answer function, ranges for a, b, c). The answer is computed here, not by
# evaluating the text; tests check both agree.
_ArithForm = tuple[str, Callable[[int, int, int], int], tuple[range, range, range]]
_TWO_DIGIT = range(11, 100)
_ARITH_FORMS: tuple[_ArithForm, ...] = (
    ("{a}*{b}+{c}", lambda a, b, c: a * b + c, (_TWO_DIGIT, _TWO_DIGIT, range(1, 100))),
    ("{a}*{b}-{c}", lambda a, b, c: a * b - c, (_TWO_DIGIT, _TWO_DIGIT, range(1, 100))),
    ("{a}*({b}+{c})", lambda a, b, c: a * (b + c), (_TWO_DIGIT, _TWO_DIGIT, range(1, 100))),
    ("{a}*{b}*{c}", lambda a, b, c: a * b * c, (_TWO_DIGIT, _TWO_DIGIT, range(2, 10))),
    ("{a}**2+{b}*{c}", lambda a, b, c: a * a + b * c, (_TWO_DIGIT, _TWO_DIGIT, range(2, 10))),
)


def _arith_question(rng: random.Random) -> tuple[str, int]:
    template, fn, (ra, rb, rc) = rng.choice(_ARITH_FORMS)
    a, b, c = rng.choice(ra), rng.choice(rb), rng.choice(rc)
    expr = template.format(a=a, b=b, c=c)
    return f"Compute {expr}.", fn(a, b, c)


_GENERATORS: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "arith": _arith_question,
}
SYNTHETIC_NAMES = (*_GENERATORS, "words")


def make_synthetic(name: str, num: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train_rows, test_rows) of a synthetic set; `num` problems in all, ~20% of them test."""
    if name not in SYNTHETIC_NAMES:
        raise UserError(f"unknown synthetic set {name!r}; available: {', '.join(SYNTHETIC_NAMES)}")
    if not 2 <= num <= MAX_NUM:
        raise UserError(f"--num must be between 2 and {MAX_NUM} for a train/test split, got {num}")
    if name == "words":  # split by template and phrasing, not by question
        from rstar2cli.data.words.generate import make_words

        return make_words(num, seed)
    rng = random.Random(f"{name}:{seed}")  # string seeds hash the same on every run
    generate = _GENERATORS[name]
    problems: dict[str, int] = {}
    while len(problems) < num:
        question, answer = generate(rng)
        problems.setdefault(question, answer)  # NOTE: unique questions => disjoint splits
    num_test = max(1, num // 5)
    items = list(problems.items())
    rng.shuffle(items)
    test = _rows(name, seed, "test", items[:num_test])
    train = _rows(name, seed, "train", items[num_test:])
    return train, test


def _rows(name: str, seed: int, split: str, items: list[tuple[str, int]]) -> list[dict]:
    return [
        {
            "id": f"{name}-s{seed}-{split}-{i}",
            "question": question,
            "answer": str(answer),
            "source": f"synthetic/{name}",
        }
        for i, (question, answer) in enumerate(items)
    ]
