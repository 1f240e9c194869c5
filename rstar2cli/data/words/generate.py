"""The "words" synthetic set: multi-step integer word problems with reference Python solutions.

`make_words(num, seed)` returns (train_rows, test_rows). A row holds `id, question, answer,
source` (the normalised schema) and `template, phrasing, setting, held_out, solution`, which
prepare-data keeps in the `meta` column: cold-start transcripts read the solution from there.

The split is by template and by phrasing, so the test split is not the training problems with new
numbers: the templates in `HELD_OUT_TEMPLATES` appear only in the test split (all their
phrasings), and of every other template the last phrasing (`HELD_OUT_PHRASING`) appears only in
the test split. Half of the test problems come from each kind (`held_out` says which). Every
question is unique. The same (num, seed) always gives the same rows.

The templates were written for this project from everyday settings; GSM8K is an evaluation set
only (tests/unit/test_words.py checks that no question shares an 8-gram with GSM8K test).
What it does not do: write files (`rstar2 prepare-data --synthetic words` does) or build
transcripts (`rstar2cli.sft.synthetic_transcripts`). Tested in tests/unit/test_words.py.
"""

from __future__ import annotations

import random

from rstar2cli.data.words.budget import BUDGET_TEMPLATES
from rstar2cli.data.words.everyday import EVERYDAY_TEMPLATES
from rstar2cli.data.words.groups import GROUPS_TEMPLATES
from rstar2cli.data.words.home import HOME_TEMPLATES
from rstar2cli.data.words.money import MONEY_TEMPLATES
from rstar2cli.data.words.places import PLACES_TEMPLATES
from rstar2cli.data.words.template import PEOPLE, WordTemplate, render, spellable_slots

TEMPLATES: tuple[WordTemplate, ...] = (
    MONEY_TEMPLATES
    + BUDGET_TEMPLATES
    + EVERYDAY_TEMPLATES
    + PLACES_TEMPLATES
    + HOME_TEMPLATES
    + GROUPS_TEMPLATES
)
# NOTE: chosen so every operation they use (rounding up, exact division, a third, sums of
# products, n - 1 gaps) also appears in some training template; what is new is the setting and
# the wording.
HELD_OUT_TEMPLATES = frozenset(
    {
        "buses_needed",
        "print_minutes",
        "harvest_income",
        "season_points",
        "plan_difference",
        "recipe_scale",
        "third_and_rest",
        "stock_left",
        "outing_cost",
        "how_many_more",
        "parking_fees",
    }
)
HELD_OUT_PHRASING = -1  # the last wording of each training template is test-only
SOURCE = "synthetic/words"
SPELLED_SHARE = 0.3  # of the numbers 2-12 in a question, the share written in words

Pair = tuple[WordTemplate, int]  # a template and the index of one of its phrasings


def split_pairs() -> tuple[list[Pair], list[Pair], list[Pair]]:
    """(training pairs, test pairs of held-out templates, test pairs of held-out phrasings)."""
    train: list[Pair] = []
    new_template: list[Pair] = []
    new_phrasing: list[Pair] = []
    for t in TEMPLATES:
        indices = list(range(len(t.phrasings)))
        if t.key in HELD_OUT_TEMPLATES:
            new_template += [(t, i) for i in indices]
            continue
        last = indices[HELD_OUT_PHRASING]
        train += [(t, i) for i in indices if i != last]
        new_phrasing.append((t, last))
    return train, new_template, new_phrasing


def draw_problem(pair: Pair, rng: random.Random) -> dict:
    """One problem of a (template, phrasing): question, answer and reference solution."""
    template, phrasing = pair
    numbers = template.draw(rng)
    person = rng.choice(PEOPLE)
    answer = template.answer(numbers)
    if not isinstance(answer, int) or answer <= 0:  # a template bug, never bad input
        raise AssertionError(f"template {template.key}: answer {answer!r} for {numbers}")
    spellable = spellable_slots(template.phrasings[phrasing], numbers)
    spelled = frozenset(s for s in spellable if rng.random() < SPELLED_SHARE)
    question, solution = render(
        template, phrasing=phrasing, numbers=numbers, person=person, spelled=spelled
    )
    return {
        "question": question,
        "answer": str(answer),
        "template": template.key,
        "phrasing": phrasing,
        "setting": template.setting,
        "solution": solution,
    }


def _unique(num: int, draw, rng: random.Random) -> list[dict]:
    problems: dict[str, dict] = {}
    while len(problems) < num:
        problem = draw(rng)
        problems.setdefault(problem["question"], problem)
    return list(problems.values())


def make_words(num: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train_rows, test_rows): `num` problems in all, a fifth of them (at least one) test."""
    train_pairs, new_template, new_phrasing = split_pairs()
    rng = random.Random(f"words:{seed}")  # string seeds hash the same on every run
    num_test = max(1, num // 5)

    def test_draw(r: random.Random) -> dict:
        held_out, pairs = (
            ("template", new_template) if r.random() < 0.5 else ("phrasing", new_phrasing)
        )
        return {**draw_problem(r.choice(pairs), r), "held_out": held_out}

    test = _unique(num_test, test_draw, rng)
    train = _unique(
        num - num_test, lambda r: {**draw_problem(r.choice(train_pairs), r), "held_out": ""}, rng
    )
    return _rows(seed, "train", train), _rows(seed, "test", test)


def _rows(seed: int, split: str, problems: list[dict]) -> list[dict]:
    return [
        {"id": f"words-s{seed}-{split}-{i}", "source": SOURCE, **p} for i, p in enumerate(problems)
    ]
