"""Word-problem templates about home, sports and stock rooms.

Each template's numbers are drawn so every division in it is exact or is meant to round, and so
the answer is a positive integer. Written from everyday life for this project; see
`rstar2cli.data.words.generate` for how they are split and checked.
"""

from __future__ import annotations

import math
import random

from rstar2cli.data.words.template import Numbers, WordTemplate


def _goal(r: random.Random) -> Numbers:
    while True:
        price = r.randint(180, 1500)
        v = {"price": price, "saved": r.randint(20, price // 2), "weekly": r.randint(12, 60)}
        if (v["price"] - v["saved"]) % v["weekly"]:
            return v


def _tank(r: random.Random) -> Numbers:
    rate, current = r.randint(8, 45), r.randint(50, 600)
    return {"capacity": current + rate * r.randint(10, 90), "current": current, "rate": rate}


def _stock(r: random.Random) -> Numbers:
    pallets, boxes, items = r.randint(6, 40), r.randint(12, 48), r.randint(6, 24)
    return {
        "pallets": pallets,
        "boxes": boxes,
        "items": items,
        "shipped": r.randint(50, pallets * boxes * items - 50),
    }


def _printing(r: random.Random) -> Numbers:
    per_minute, pages = r.randint(10, 40), r.randint(6, 30)
    step = per_minute // math.gcd(per_minute, pages)  # copies x pages is then a multiple of it
    return {
        "per_minute": per_minute,
        "pages": pages,
        "copies": step * r.randint(1, max(1, 120 // step)),
    }


HOME_TEMPLATES: tuple[WordTemplate, ...] = (
    WordTemplate(
        key="savings_goal",
        setting="home",
        draw=_goal,
        answer=lambda v: -(-(v["price"] - v["saved"]) // v["weekly"]),
        steps=(
            "import math",
            "needed = price - saved",
            "weeks = math.ceil(needed / weekly)",
            "print(weeks)",
        ),
        phrasings=(
            "{name} wants a bike that costs {price} dollars. {He} has saved {saved} dollars and "
            "saves {weekly} dollars each week. How many more weeks until {he} can afford it?",
            "A laptop costs {price} dollars. {name} already has {saved} dollars and puts away "
            "{weekly} dollars every week. After how many weeks will {he} have enough?",
            "A guitar costs {price} dollars. {name} has {saved} dollars and adds {weekly} dollars"
            " a week. How many weeks must {he} save before {he} can buy the guitar?",
            "Saving {weekly} dollars a week on top of the {saved} dollars already in {his} piggy "
            "bank, how many weeks will it take {name} to reach {price} dollars?",
        ),
    ),
    WordTemplate(
        key="fill_tank",
        setting="home",
        draw=_tank,
        answer=lambda v: (v["capacity"] - v["current"]) // v["rate"],
        steps=("missing = capacity - current", "minutes = missing // rate", "print(minutes)"),
        phrasings=(
            "A water tank holds {capacity} litres and already contains {current} litres. A pump "
            "adds {rate} litres per minute. How many minutes does it take to fill the tank?",
            "A pool has {current} litres of water in it and takes {capacity} litres when full. "
            "If a hose pours in {rate} litres a minute, how long, in minutes, until it is full?",
            "A fish tank can hold {capacity} litres. It has {current} litres now, and water flows"
            " in at {rate} litres per minute. How many minutes until the tank is full?",
            "How many minutes will it take to top up a {capacity} litre rain barrel that has "
            "{current} litres in it, using a tap that gives {rate} litres each minute?",
        ),
    ),
    WordTemplate(
        key="tile_cost",
        setting="home",
        draw=lambda r: {
            "length": r.randint(3, 12),
            "width": r.randint(3, 10),
            "per_m2": r.randint(4, 16),
            "price": r.randint(2, 7),
        },
        answer=lambda v: v["length"] * v["width"] * v["per_m2"] * v["price"],
        steps=(
            "area = length * width",
            "tiles = area * per_m2",
            "cost = tiles * price",
            "print(cost)",
        ),
        phrasings=(
            "A kitchen floor is {length} m by {width} m. Each square metre needs {per_m2} tiles, "
            "and each tile costs {price} dollars. How much do the tiles cost?",
            "{name} is tiling a patio that measures {width} metres by {length} metres. It takes "
            "{per_m2} tiles to cover one square metre, at {price} dollars per tile. What is the "
            "cost of the tiles in dollars?",
            "A bathroom wall is {length} m wide and {width} m high. Covering one square metre "
            "takes {per_m2} tiles, and a tile costs {price} dollars. What do the tiles cost in "
            "total?",
            "Tiles cost {price} dollars each and {per_m2} tiles cover a square metre. How many "
            "dollars are needed to tile a rectangular hall {length} metres long and {width} "
            "metres wide?",
        ),
    ),
    WordTemplate(
        key="season_points",
        setting="sports",
        draw=lambda r: {
            "twos": r.randint(8, 25),
            "threes": r.randint(3, 14),
            "free": r.randint(4, 18),
            "games": r.randint(5, 30),
        },
        answer=lambda v: (2 * v["twos"] + 3 * v["threes"] + v["free"]) * v["games"],
        steps=(
            "per_game = twos * 2 + threes * 3 + free",
            "total = per_game * games",
            "print(total)",
        ),
        phrasings=(
            "In every game this season, a basketball team scored {twos} two-point baskets, "
            "{threes} three-point baskets and {free} free throws worth one point each. How many "
            "points did the team score in {games} games?",
            "In each of {games} matches, a player made {threes} three-pointers, {twos} "
            "two-pointers and {free} free throws worth 1 point. What is the player's points "
            "total?",
            "How many points is a team's total after {games} games if each game it made {free} "
            "free throws (1 point), {twos} field goals worth 2 points, and {threes} shots worth "
            "3 points?",
        ),
    ),
    WordTemplate(
        key="weekly_running",
        setting="sports",
        draw=lambda r: {
            "km": r.randint(4, 14),
            "long_run": r.randint(15, 35),
            "weeks": r.randint(4, 16),
        },
        answer=lambda v: (5 * v["km"] + v["long_run"]) * v["weeks"],
        steps=("weekly = km * 5 + long_run", "total = weekly * weeks", "print(total)"),
        phrasings=(
            "{name} runs {km} km every weekday and {long_run} km on Saturdays. How many "
            "kilometres does {he} run in {weeks} weeks?",
            "Training for a marathon, a runner covers {long_run} km in one long run each week "
            "plus {km} km on each of the five weekdays. What distance is covered in {weeks} "
            "weeks?",
            "Every weekday {name} walks {km} km, and on Sundays {he} walks {long_run} km. How far"
            " does {he} walk in {weeks} weeks?",
            "How many kilometres does a cyclist ride in {weeks} weeks riding {km} km Monday to "
            "Friday and {long_run} km each Sunday?",
        ),
    ),
    WordTemplate(
        key="twice_plus",
        setting="home",
        draw=lambda r: {"first": r.randint(120, 900), "more": r.randint(10, 150)},
        answer=lambda v: 3 * v["first"] + v["more"],
        steps=("second = first * 2 + more", "total = first + second", "print(total)"),
        phrasings=(
            "{name} has {first} stamps. {His} cousin has {more} more than twice as many stamps. "
            "How many stamps do they have together?",
            "A museum has {first} old coins. A second museum has twice as many plus {more} more. "
            "How many coins do the two museums hold in all?",
            "A farm has {first} sheep. A neighbouring farm has {more} more than twice that "
            "number. How many sheep are on the two farms together?",
            "How many cards do two friends have altogether if one has {first} cards and the "
            "other has {more} more than double that number?",
        ),
    ),
    WordTemplate(
        key="stock_left",
        setting="work",
        draw=_stock,
        answer=lambda v: v["pallets"] * v["boxes"] * v["items"] - v["shipped"],
        steps=(
            "per_pallet = boxes * items",
            "stock = pallets * per_pallet",
            "left = stock - shipped",
            "print(left)",
        ),
        phrasings=(
            "A warehouse has {pallets} pallets. Each pallet holds {boxes} boxes, and each box has "
            "{items} jars of honey. If {shipped} jars are shipped, how many jars remain?",
            "{shipped} tins are sent out from a store room that had {pallets} pallets of {boxes} "
            "cartons each, with {items} tins in every carton. How many tins are still in the "
            "store room?",
            "How many bottles are left after {shipped} are sold, if a depot had {pallets} stacks "
            "of {boxes} crates and {items} bottles were in each crate?",
        ),
    ),
    WordTemplate(
        key="print_minutes",
        setting="work",
        draw=_printing,
        answer=lambda v: v["copies"] * v["pages"] // v["per_minute"],
        steps=("sheets = copies * pages", "minutes = sheets // per_minute", "print(minutes)"),
        phrasings=(
            "A printer prints {per_minute} pages per minute. How many minutes does it take to "
            "print {copies} copies of a {pages}-page booklet?",
            "A school needs {copies} copies of a {pages} page exam. Its copier makes "
            "{per_minute} pages each minute. How long will the job take, in minutes?",
            "How many minutes are needed to print {pages} pages for each of {copies} guests on a "
            "machine that prints {per_minute} pages a minute?",
        ),
    ),
)
