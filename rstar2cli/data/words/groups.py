"""Word-problem templates about groups and rates: shares of a group, comparisons, per-minute work.

Each template's numbers are drawn so every division in it is exact, and so the answer is a
positive integer. Written from everyday life for this project; see
`rstar2cli.data.words.generate` for how they are split and checked.
"""

from __future__ import annotations

import random

from rstar2cli.data.words.template import Numbers, WordTemplate


def _share_of_group(r: random.Random) -> Numbers:
    percent = r.choice((10, 20, 25, 30, 40, 50, 60, 75))
    return {"members": 20 * r.randint(6, 45), "percent": percent, "price": r.randint(9, 48)}


def _how_many_more(r: random.Random) -> Numbers:
    bags, per_bag = r.randint(12, 60), r.randint(15, 40)
    return {"bags": bags, "per_bag": per_bag, "other": r.randint(100, bags * per_bag - 20)}


def _seedlings(r: random.Random) -> Numbers:
    rows, per_row = r.randint(8, 30), r.randint(12, 40)
    return {"rows": rows, "per_row": per_row, "lost": r.randint(5, rows * per_row // 4)}


GROUPS_TEMPLATES: tuple[WordTemplate, ...] = (
    WordTemplate(
        key="share_of_group",
        setting="school",
        draw=_share_of_group,
        answer=lambda v: v["members"] * v["percent"] // 100 * v["price"],
        steps=("group = members * percent // 100", "cost = group * price", "print(cost)"),
        phrasings=(
            "A school has {members} students, and {percent}% of them sing in the choir. Each "
            "choir member needs a new robe that costs {price} dollars. How much do the robes cost "
            "in all?",
            "{percent}% of the {members} runners in a club will race this weekend, and the entry "
            "fee is ${price} per runner. What do the club's entry fees add up to, in dollars?",
            "A company has {members} employees, and {percent}% of them sign up for a training "
            "course that costs {price} dollars per person. What does the company pay for the "
            "course?",
            "Each volunteer gets one lunch voucher worth {price} dollars. If {percent}% of a town's "
            "{members} residents volunteer for the clean-up day, how many dollars do the "
            "vouchers cost?",
        ),
    ),
    WordTemplate(
        key="chain_of_more",
        setting="home",
        draw=lambda r: {
            "first": r.randint(35, 240),
            "more": r.randint(8, 60),
            "times": r.randint(2, 4),
        },
        answer=lambda v: (
            v["first"] + (v["first"] + v["more"]) + v["times"] * (v["first"] + v["more"])
        ),
        steps=(
            "second = first + more",
            "third = second * times",
            "total = first + second + third",
            "print(total)",
        ),
        phrasings=(
            "{name} has {first} marbles. {His} sister has {more} more marbles than {name}, and "
            "their brother has {times} times as many as the sister. How many marbles do the three "
            "have in total?",
            "A bookshop sold {first} books on Monday, {more} more on Tuesday than on Monday, and "
            "{times} times Tuesday's number on Wednesday. How many books did it sell over the "
            "three days?",
            "Three friends collect shells. The first finds {first}, the second finds {more} more "
            "than the first, and the third finds {times} times as many as the second. How many "
            "shells do they find in all?",
            "Three beehives are weighed for honey. The first gives {first} grams; the second "
            "gives {more} grams more than the first; the third gives {times} times as much as the "
            "second. How many grams of honey is that altogether?",
        ),
    ),
    WordTemplate(
        key="per_minute_hours",
        setting="work",
        draw=lambda r: {
            "per_minute": r.randint(6, 45),
            "hours": r.randint(2, 9),
            "days": r.randint(2, 6),
        },
        answer=lambda v: v["per_minute"] * 60 * v["hours"] * v["days"],
        steps=(
            "per_hour = per_minute * 60",
            "per_day = per_hour * hours",
            "total = per_day * days",
            "print(total)",
        ),
        phrasings=(
            "A machine fills {per_minute} bottles every minute. It runs {hours} hours a day. How "
            "many bottles does it fill in {days} days?",
            "{name} can fold {per_minute} flyers a minute. If {he} folds for {hours} hours on each "
            "of {days} days, how many flyers does {he} fold?",
            "A bakery oven turns out {per_minute} rolls per minute. It is used {hours} hours each"
            " day. How many rolls does it bake in {days} days?",
            "How many envelopes are stamped in {days} days by a machine that stamps {per_minute} "
            "envelopes per minute and works {hours} hours each day?",
        ),
    ),
    WordTemplate(
        key="how_many_more",
        setting="school",
        draw=_how_many_more,
        answer=lambda v: v["bags"] * v["per_bag"] - v["other"],
        steps=("collected = bags * per_bag", "difference = collected - other", "print(difference)"),
        phrasings=(
            "For a recycling drive, class A filled {bags} bags with {per_bag} cans in each bag. "
            "Class B collected {other} cans. How many more cans did class A collect?",
            "{name}'s team picked {bags} baskets of strawberries with {per_bag} strawberries per "
            "basket. The other team picked {other} strawberries. By how many strawberries did "
            "{name}'s team win?",
            "One printer produced {other} posters. Another produced {bags} stacks of {per_bag} "
            "posters. How many more posters did the second printer make than the first?",
        ),
    ),
    WordTemplate(
        key="seedlings_left",
        setting="farming",
        draw=_seedlings,
        answer=lambda v: v["rows"] * v["per_row"] - v["lost"],
        steps=("planted = rows * per_row", "alive = planted - lost", "print(alive)"),
        phrasings=(
            "A gardener plants {rows} rows of lettuce with {per_row} seedlings in each row. Snails "
            "eat {lost} seedlings. How many seedlings are left?",
            "{name} sets out {per_row} tulip bulbs in each of {rows} rows, but {lost} bulbs never "
            "come up. How many tulips grow?",
            "A vineyard has {rows} rows of {per_row} vines. Disease kills {lost} vines. How many "
            "vines are still alive?",
            "After {lost} of them were damaged by frost, how many pepper plants survived from "
            "{rows} rows holding {per_row} plants each?",
        ),
    ),
)
