"""Word-problem templates about personal budgets: resale, spending in parts, allowances, fees.

Each template's numbers are drawn so every division in it is exact, and so the answer is a
positive integer. Written from everyday life for this project; see
`rstar2cli.data.words.generate` for how they are split and checked.
"""

from __future__ import annotations

import random

from rstar2cli.data.words.template import Numbers, WordTemplate


def _resale(r: random.Random) -> Numbers:
    buy, repair = r.randint(20, 140), r.randint(5, 40)
    return {
        "count": r.randint(4, 30),
        "buy": buy,
        "repair": repair,
        "sell": buy + repair + r.randint(10, 90),
    }


def _halves(r: random.Random) -> Numbers:
    return {"money": 6 * r.randint(25, 400)}


def _allowance(r: random.Random) -> Numbers:
    allowance = r.randint(12, 45)
    return {
        "start": r.randint(15, 300),
        "allowance": allowance,
        "spend": r.randint(3, allowance - 2),
        "weeks": r.randint(4, 30),
    }


BUDGET_TEMPLATES: tuple[WordTemplate, ...] = (
    WordTemplate(
        key="resale_profit",
        setting="shopping",
        draw=_resale,
        answer=lambda v: v["count"] * (v["sell"] - v["buy"] - v["repair"]),
        steps=(
            "cost_each = buy + repair",
            "profit_each = sell - cost_each",
            "profit = profit_each * count",
            "print(profit)",
        ),
        phrasings=(
            "{name} buys {count} old bikes for {buy} dollars each, spends {repair} dollars fixing "
            "each one, and sells each bike for {sell} dollars. What is {his} total profit?",
            "A shop sells refurbished phones at ${sell} each. Every phone was bought for ${buy} "
            "and needed ${repair} of repairs. What profit, in dollars, does the shop make on "
            "{count} phones?",
            "{name} restores {count} old lamps. Each lamp cost {buy} dollars to buy and {repair} "
            "dollars in parts, and each sells for {sell} dollars. How much profit does {he} make?",
            "How many dollars of profit come from {count} second-hand chairs bought at {buy} "
            "dollars apiece, repainted for {repair} dollars apiece, and sold at {sell} dollars "
            "apiece?",
        ),
    ),
    WordTemplate(
        key="half_then_third",
        setting="shopping",
        draw=_halves,
        answer=lambda v: (v["money"] - v["money"] // 2) * 2 // 3,
        steps=(
            "rest = money - money // 2",
            "left = rest - rest // 3",
            "print(left)",
        ),
        phrasings=(
            "{name} had {money} dollars. {He} spent half of it on a bicycle and then a third of "
            "what was left on a helmet. How much money does {he} have now?",
            "A school club starts the year with ${money}. It uses half of the money for a trip, "
            "then one third of the remainder for equipment. How many dollars are left?",
            "A charity receives {money} dollars. Half is spent on food, and one third of the "
            "remaining money is spent on blankets. How much money has not been spent?",
            "Out of {money} dollars, half goes to rent and a third of the rest goes to food. How "
            "many dollars remain after both?",
        ),
    ),
    WordTemplate(
        key="allowance_savings",
        setting="home",
        draw=_allowance,
        answer=lambda v: v["start"] + (v["allowance"] - v["spend"]) * v["weeks"],
        steps=(
            "saved_weekly = allowance - spend",
            "total = start + saved_weekly * weeks",
            "print(total)",
        ),
        phrasings=(
            "{name} has {start} dollars in a jar. Every week {he} gets {allowance} dollars of "
            "pocket money and spends {spend} dollars of it. How much is in the jar after {weeks} "
            "weeks?",
            "Each week {name} earns ${allowance} walking dogs and spends ${spend} on snacks. {He} "
            "started with ${start}. How many dollars does {he} have after {weeks} weeks?",
            "{name} starts with {start} dollars. {He} earns {allowance} dollars a week from "
            "chores and spends {spend} dollars a week. How much money does {he} have after "
            "{weeks} weeks?",
            "How much money will be in a savings box after {weeks} weeks if it holds {start} "
            "dollars now and each week {allowance} dollars go in and {spend} dollars come out?",
        ),
    ),
    WordTemplate(
        key="parking_fees",
        setting="travel",
        draw=lambda r: {
            "first": r.randint(4, 12),
            "extra": r.randint(2, 6),
            "hours": r.randint(2, 10),
            "days": r.randint(3, 22),
        },
        answer=lambda v: (v["first"] + (v["hours"] - 1) * v["extra"]) * v["days"],
        steps=(
            "daily = first + (hours - 1) * extra",
            "total = daily * days",
            "print(total)",
        ),
        phrasings=(
            "A car park charges {first} dollars for the first hour and {extra} dollars for each "
            "hour after that. {name} parks for {hours} hours a day on {days} days. How much does "
            "{he} pay?",
            "Renting a kayak costs ${first} for the first hour plus ${extra} for every extra hour. "
            "A guide rents one for {hours} hours on each of {days} days. What is the total cost "
            "in dollars?",
            "For {days} days, how many dollars does a {hours}-hour daily bike rental cost if the "
            "first hour is {first} dollars and each further hour is {extra} dollars?",
        ),
    ),
)
