"""Word-problem templates about school and farming.

Each template's numbers are drawn so every division in it is exact or is meant to round, and so
the answer is a positive integer. Written from everyday life for this project; see
`rstar2cli.data.words.generate` for how they are split and checked.
"""

from __future__ import annotations

import random

from rstar2cli.data.words.template import Numbers, WordTemplate


def _pencils(r: random.Random) -> Numbers:
    while True:
        v = {
            "students": r.randint(18, 35),
            "per_student": r.randint(3, 8),
            "box": r.randint(10, 24),
        }
        if v["students"] * v["per_student"] % v["box"]:
            return v


def _scores(r: random.Random) -> Numbers:
    v = {f"score{i}": r.randint(55, 100) for i in range(1, 4)}
    # NOTE: the fourth score makes the sum a multiple of 4, so the average is a whole number
    fourth = r.randint(55, 96)
    v["score4"] = fourth + (-(sum(v.values()) + fourth)) % 4
    return v


def _library(r: random.Random) -> Numbers:
    lent = r.randint(40, 300)
    return {
        "books": r.randint(800, 5000),
        "lent": lent,
        "returned": r.randint(10, lent),
        "boxes": r.randint(2, 9),
        "per_box": r.randint(12, 40),
    }


def _commute(r: random.Random) -> Numbers:
    people = 3 * r.randint(50, 300)
    return {"people": people, "others": r.randint(10, people // 3)}


def _orchard(r: random.Random) -> Numbers:
    bag = r.choice((5, 10, 20, 25))
    return {
        "rows": r.randint(6, 30),
        "trees": r.randint(8, 25),
        "fruit": bag * r.randint(8, 30),
        "bag": bag,
    }


def _field(r: random.Random) -> Numbers:
    length = r.randint(30, 240)
    return {"length": length, "width": r.randint(20, length), "price": r.randint(4, 19)}


def _eggs(r: random.Random) -> Numbers:
    while True:
        v = {
            "hens": r.randint(25, 140),
            "per_hen": r.randint(3, 6),
            "carton": r.choice((6, 10, 12, 15, 18, 30)),
        }
        if v["hens"] * v["per_hen"] % v["carton"]:
            return v


PLACES_TEMPLATES: tuple[WordTemplate, ...] = (
    WordTemplate(
        key="class_boxes",
        setting="school",
        draw=_pencils,
        answer=lambda v: -(-v["students"] * v["per_student"] // v["box"]),
        steps=(
            "import math",
            "needed = students * per_student",
            "boxes = math.ceil(needed / box)",
            "print(boxes)",
        ),
        phrasings=(
            "A teacher gives each of {students} students {per_student} pencils. Pencils come in "
            "boxes of {box}. How many boxes must the teacher buy?",
            "Markers are sold in sets of {box}. An art class of {students} children needs "
            "{per_student} markers per child. What is the smallest number of sets to buy?",
            "Each of the {students} children at a camp gets {per_student} name tags, and name "
            "tags come in sheets of {box}. How many sheets are needed?",
            "How many packs of {box} stickers does a coach need so that each of {students} "
            "players gets {per_student} stickers?",
        ),
    ),
    WordTemplate(
        key="average_score",
        setting="school",
        draw=_scores,
        answer=lambda v: (v["score1"] + v["score2"] + v["score3"] + v["score4"]) // 4,
        steps=(
            "total = score1 + score2 + score3 + score4",
            "average = total // 4",
            "print(average)",
        ),
        phrasings=(
            "{name} got {score1}, {score2}, {score3} and {score4} points on four quizzes. What "
            "is {his} average score?",
            "A diver receives scores of {score1}, {score2}, {score3} and {score4} from four "
            "judges. What is the average score?",
            "Over four rounds of a quiz show, a team scored {score1}, {score2}, {score3} and "
            "{score4} points. What was its average per round?",
            "What is the mean of four test results: {score1}, {score2}, {score3} and {score4}?",
        ),
    ),
    WordTemplate(
        key="library_count",
        setting="school",
        draw=_library,
        answer=lambda v: v["books"] - v["lent"] + v["returned"] + v["boxes"] * v["per_box"],
        steps=(
            "new_books = boxes * per_box",
            "total = books - lent + returned + new_books",
            "print(total)",
        ),
        phrasings=(
            "A school library has {books} books. This week it lends out {lent} books, gets "
            "{returned} books back and receives {boxes} boxes of new books with {per_box} books "
            "in each box. How many books are in the library now?",
            "{boxes} boxes, each with {per_box} new books, arrive at a library that had {books} "
            "books on its shelves. That day {lent} books are borrowed and {returned} are "
            "returned. How many books are on the shelves at the end of the day?",
            "A toy library starts the month with {books} toys. It lends {lent}, gets {returned} "
            "back, and receives {boxes} donated boxes holding {per_box} toys each. How many toys "
            "does it have now?",
            "How many books does a library hold after starting with {books}, lending {lent}, "
            "taking back {returned}, and adding {boxes} cartons of {per_box} books?",
        ),
    ),
    WordTemplate(
        key="outing_cost",
        setting="school",
        draw=lambda r: {
            "students": r.randint(25, 140),
            "teachers": r.randint(2, 8),
            "price": r.randint(6, 25),
            "bus": r.randint(150, 600),
        },
        answer=lambda v: (v["students"] + v["teachers"]) * v["price"] + v["bus"],
        steps=(
            "people = students + teachers",
            "tickets = people * price",
            "total = tickets + bus",
            "print(total)",
        ),
        phrasings=(
            "{students} students and {teachers} teachers visit a science museum. Entry is "
            "{price} dollars per person and the bus costs {bus} dollars. What is the total cost "
            "of the trip?",
            "A class trip to the zoo needs a bus for {bus} dollars. Tickets are {price} dollars "
            "each, and {teachers} teachers go with {students} pupils. How many dollars does the "
            "trip cost?",
            "What does an outing cost, in dollars, if a coach is hired for {bus} dollars and each "
            "of {students} children and {teachers} adults pays {price} dollars for a ticket?",
        ),
    ),
    WordTemplate(
        key="third_and_rest",
        setting="school",
        draw=_commute,
        answer=lambda v: v["people"] - v["people"] // 3 - v["others"],
        steps=("third = people // 3", "rest = people - third - others", "print(rest)"),
        phrasings=(
            "A school has {people} pupils. One third of them walk to school, {others} cycle, and "
            "the rest come by bus. How many pupils take the bus?",
            "Of the {people} workers at a factory, {others} come by bicycle and a third drive. "
            "The others take the train. How many take the train?",
            "How many of {people} concert guests arrived by tram if a third of them came on "
            "foot, {others} came by taxi, and all the others used the tram?",
        ),
    ),
    WordTemplate(
        key="orchard_bags",
        setting="farming",
        draw=_orchard,
        answer=lambda v: v["rows"] * v["trees"] * v["fruit"] // v["bag"],
        steps=(
            "all_trees = rows * trees",
            "all_fruit = all_trees * fruit",
            "bags = all_fruit // bag",
            "print(bags)",
        ),
        phrasings=(
            "An orchard has {rows} rows with {trees} apple trees in each row. Each tree gives "
            "{fruit} apples, and the apples are packed in bags of {bag}. How many bags are "
            "filled?",
            "Plums are picked from {rows} rows of {trees} trees, {fruit} plums per tree, and "
            "sold in crates of {bag}. How many crates does the farm fill?",
            "A farm has {rows} rows of {trees} orange trees. If every tree yields {fruit} oranges"
            " and the oranges go into nets of {bag}, how many nets are filled?",
            "How many boxes of {bag} peaches can be filled from {fruit} peaches per tree, with "
            "{trees} trees in each of {rows} rows?",
        ),
    ),
    WordTemplate(
        key="feed_weeks",
        setting="farming",
        draw=lambda r: {
            "animals": r.randint(12, 90),
            "kg": r.randint(6, 15),
            "weeks": r.randint(2, 10),
        },
        answer=lambda v: v["animals"] * v["kg"] * 7 * v["weeks"],
        steps=("daily = animals * kg", "days = weeks * 7", "total = daily * days", "print(total)"),
        phrasings=(
            "A farmer has {animals} cows. Each cow eats {kg} kg of hay a day. How many kg of hay "
            "do the cows eat in {weeks} weeks?",
            "For {weeks} weeks, how much feed, in kilograms, do {animals} goats need if each goat "
            "eats {kg} kg per day?",
            "A zoo has {animals} deer that each eat {kg} kg of food a day. How many kilograms of "
            "food do they need for {weeks} weeks?",
            "Each of the {animals} horses at a riding school is given {kg} kg of oats every day. "
            "How many kilograms of oats are used in {weeks} weeks?",
        ),
    ),
    WordTemplate(
        key="fence_cost",
        setting="farming",
        draw=_field,
        answer=lambda v: 2 * (v["length"] + v["width"]) * v["price"],
        steps=("perimeter = 2 * (length + width)", "cost = perimeter * price", "print(cost)"),
        phrasings=(
            "A rectangular field is {length} m long and {width} m wide. Fencing costs {price} "
            "dollars per metre. How much does it cost to fence the whole field?",
            "{name} wants to put a fence around a rectangular paddock measuring {width} metres "
            "by {length} metres. If fencing is {price} dollars a metre, what will it cost?",
            "How much will it cost to put a fence round a rectangular yard {length} m long and "
            "{width} m wide, at {price} dollars per metre of fence?",
            "At {price} dollars for each metre, how many dollars does a fence cost around a "
            "rectangular garden that is {length} metres long and {width} metres wide?",
        ),
    ),
    WordTemplate(
        key="harvest_income",
        setting="farming",
        draw=lambda r: {
            "harvest": r.randint(300, 2500),
            "kept": r.randint(20, 200),
            "price": r.randint(2, 9),
        },
        answer=lambda v: (v["harvest"] - v["kept"]) * v["price"],
        steps=("sold = harvest - kept", "income = sold * price", "print(income)"),
        phrasings=(
            "{name} harvests {harvest} kg of potatoes. {He} keeps {kept} kg for {his} family and "
            "sells the rest at {price} dollars per kg. How much money does {he} make?",
            "After setting aside {kept} kg of a {harvest} kg carrot harvest, a farm sells the "
            "remainder for {price} dollars a kilogram. How many dollars does it earn?",
            "How much income, in dollars, comes from {harvest} kg of onions if {kept} kg are kept "
            "as seed and every other kilogram sells for {price} dollars?",
        ),
    ),
    WordTemplate(
        key="eggs_left_over",
        setting="farming",
        draw=_eggs,
        answer=lambda v: v["hens"] * v["per_hen"] % v["carton"],
        steps=("eggs = hens * per_hen", "left = eggs % carton", "print(left)"),
        phrasings=(
            "A farm has {hens} hens, and each hen lays {per_hen} eggs a week. The eggs are packed "
            "into boxes of {carton}. After filling as many boxes as possible, how many eggs are "
            "left over?",
            "Each of {name}'s {hens} quails lays {per_hen} eggs in a week. {He} packs the week's "
            "eggs in trays of {carton}. How many eggs do not fit into a full tray?",
            "{hens} chickens each lay {per_hen} eggs this week. The farmer fills boxes of "
            "{carton} eggs. How many eggs are left after all full boxes are filled?",
            "Eggs go into cartons that hold {carton} each. If {hens} hens lay {per_hen} eggs "
            "apiece this week, how many eggs remain once every full carton is packed?",
        ),
    ),
)
