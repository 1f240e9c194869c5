"""One word-problem template: its numbers, its phrasings and its reference Python solution.

A `WordTemplate` is one kind of everyday problem (a setting and a chain of operations). `draw`
picks its numbers; `answer` computes the result from them in plain Python, independently of the
solution text; `steps` are the solution's lines after the given numbers. Each phrasing is one
wording of the problem with `{slot}` fields: number slots are the keys `draw` returns, person
slots are `{name}`, `{he}`, `{him}`, `{his}` and their capitalised forms.

`render` fills one phrasing and writes the reference solution: one assignment per given number,
in the order the numbers appear in that wording (so the code reads like the question), then the
template's steps, which end with `print(...)`. Small numbers may be written in words in the
question ("five days"); the code always has digits.

What it does not do: choose templates, split or check answers (`rstar2cli.data.words.generate`
and tests/unit/test_words.py do).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

Numbers = dict[str, int]


@dataclass(frozen=True)
class Person:
    name: str
    he: str
    him: str
    his: str

    def slots(self) -> dict[str, str]:
        forms = {"name": self.name, "he": self.he, "him": self.him, "his": self.his}
        return {**forms, **{k.capitalize(): v.capitalize() for k, v in forms.items()}}


def _people(names: str, he: str, him: str, his: str) -> tuple[Person, ...]:
    return tuple(Person(name=n, he=he, him=him, his=his) for n in names.split())


PEOPLE = _people(
    "Amara Ines Leila Sofia Priya Hana Noor Greta Yuki Camila Zainab Maren Olga Rosa Aiko",
    he="she",
    him="her",
    his="her",
) + _people(
    "Tomas Kofi Ravi Emil Mateo Jonas Farid Kenji Luca Diego Arjun Pavel Omar Nils Bruno",
    he="he",
    him="him",
    his="his",
)
PERSON_SLOTS = frozenset(PEOPLE[0].slots())


@dataclass(frozen=True)
class WordTemplate:
    key: str  # unique, also the problem's `template` field
    setting: str  # shopping, work, travel, time, cooking, school, farming, home, sports
    draw: Callable[[random.Random], Numbers]
    answer: Callable[[Numbers], int]  # NOTE: written apart from `steps`; tests check they agree
    steps: tuple[str, ...]  # solution lines after the assignments; the last one prints
    phrasings: tuple[str, ...]


def number_slots(phrasing: str) -> list[str]:
    """The fields of a phrasing that are not person slots, in order of first appearance."""
    fields = [f for _, f, _, _ in string.Formatter().parse(phrasing) if f]
    return [f for f in dict.fromkeys(fields) if f not in PERSON_SLOTS]


NUMBER_WORDS = dict(
    enumerate("two three four five six seven eight nine ten eleven twelve".split(), start=2)
)


def spellable_slots(text: str, numbers: Numbers) -> list[str]:
    """Number slots that may be written in words: 2-12, not a percent or a dollar amount."""
    return [
        slot
        for slot in number_slots(text)
        if numbers[slot] in NUMBER_WORDS
        and f"{{{slot}}}%" not in text
        and f"${{{slot}}}" not in text
    ]


def render(
    template: WordTemplate,
    phrasing: int,
    numbers: Numbers,
    person: Person,
    spelled: frozenset[str] = frozenset(),
) -> tuple[str, str]:
    """(question, reference solution) of one wording with these numbers; the slots in `spelled`
    are written in words in the question ("five days"), always in digits in the code."""
    text = template.phrasings[phrasing]
    shown = {k: NUMBER_WORDS[v] if k in spelled else v for k, v in numbers.items()}
    question = text.format(**shown, **person.slots())
    # NOTE: a number word that opens a sentence is capitalised ("Five friends eat out.")
    question = re.sub(r"(^|[.?!] )([a-z])", lambda m: m.group(1) + m.group(2).upper(), question)
    given = [f"{slot} = {numbers[slot]}" for slot in number_slots(text)]
    return question, "\n".join([*given, *template.steps])


def pick_not_dividing(rng: random.Random, lo: int, hi: int, by: int) -> int:
    """A number in [lo, hi] that `by` does not divide (so a remainder or a rounding-up matters)."""
    while True:
        value = rng.randint(lo, hi)
        if value % by:
            return value
