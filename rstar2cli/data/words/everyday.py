"""Word-problem templates about travel, time and cooking.

Each template's numbers are drawn so every division in it is exact or is meant to round, and so
the answer is a positive integer. Written from everyday life for this project; see
`rstar2cli.data.words.generate` for how they are split and checked.
"""

from __future__ import annotations

import random

from rstar2cli.data.words.template import Numbers, WordTemplate, pick_not_dividing


def _fuel(r: random.Random) -> Numbers:
    km_per_litre = r.randint(8, 16)
    return {
        "km_per_litre": km_per_litre,
        "price": r.randint(2, 4),
        "distance": km_per_litre * r.randint(20, 90),
    }


def _remaining_trip(r: random.Random) -> Numbers:
    total = r.randint(900, 3000)
    return {"total": total, "day1": r.randint(200, total // 3), "day2": r.randint(150, total // 3)}


def _buses(r: random.Random) -> Numbers:
    seats = r.randint(28, 60)
    return {"students": pick_not_dividing(r, lo=120, hi=700, by=seats), "seats": seats}


def _practice(r: random.Random) -> Numbers:
    minutes, days = r.choice((15, 20, 30, 40, 45, 50, 75, 90)), r.randint(3, 6)
    weeks = r.choice([w for w in range(4, 21) if minutes * days * w % 60 == 0])
    return {"minutes": minutes, "days": days, "weeks": weeks}


def _reading(r: random.Random) -> Numbers:
    per_day, read = r.randint(12, 45), r.randint(20, 200)
    return {"pages": read + per_day * r.randint(5, 30), "read": read, "per_day": per_day}


def _recipe(r: random.Random) -> Numbers:
    servings = r.randint(4, 8)
    return {
        "amount": servings * r.randint(15, 60),
        "servings": servings,
        "target": r.randint(9, 60),
    }


def _bakery(r: random.Random) -> Numbers:
    dozens, price = r.randint(8, 45), r.randint(2, 6)
    return {"dozens": dozens, "price": price, "cost": r.randint(50, dozens * 12 * price - 40)}


def _food_stall(r: random.Random) -> Numbers:
    sold, price = r.randint(60, 250), r.randint(3, 6)
    return {
        "sold": sold,
        "price": price,
        "costs": r.randint(90, sold * price - 20),
        "days": r.randint(5, 30),
    }


def _cycling(r: random.Random) -> Numbers:
    hours = r.randint(2, 6)
    return {"distance": hours * r.randint(12, 30), "hours": hours, "hours2": r.randint(3, 12)}


EVERYDAY_TEMPLATES: tuple[WordTemplate, ...] = (
    WordTemplate(
        key="two_leg_trip",
        setting="travel",
        draw=lambda r: {
            "speed1": r.randint(45, 110),
            "hours1": r.randint(2, 6),
            "speed2": r.randint(30, 90),
            "hours2": r.randint(2, 5),
        },
        answer=lambda v: v["speed1"] * v["hours1"] + v["speed2"] * v["hours2"],
        steps=(
            "first = speed1 * hours1",
            "second = speed2 * hours2",
            "total = first + second",
            "print(total)",
        ),
        phrasings=(
            "A bus travels at {speed1} km per hour for {hours1} hours, then at {speed2} km per "
            "hour for {hours2} hours. How many kilometres does it travel in all?",
            "{name} drives {hours1} hours on the highway at {speed1} km/h and then {hours2} hours "
            "on country roads at {speed2} km/h. What total distance does {he} cover, in km?",
            "A motorbike rider keeps {speed1} km/h for {hours1} hours and {speed2} km/h for the "
            "next {hours2} hours. How many km does the rider travel?",
            "How far, in kilometres, does a truck go if it spends {hours1} hours at {speed1} "
            "kilometres per hour and another {hours2} hours at {speed2} kilometres per hour?",
        ),
    ),
    WordTemplate(
        key="fuel_cost",
        setting="travel",
        draw=_fuel,
        answer=lambda v: v["distance"] // v["km_per_litre"] * v["price"],
        steps=("litres = distance // km_per_litre", "cost = litres * price", "print(cost)"),
        phrasings=(
            "A van can drive {km_per_litre} km on one litre of fuel. Fuel costs {price} dollars "
            "per litre. How much does fuel cost for a trip of {distance} km?",
            "{name} plans a {distance} km road trip. {His} car goes {km_per_litre} km per litre, "
            "and fuel is {price} dollars a litre. How many dollars will {he} spend on fuel?",
            "How many dollars of fuel does a {distance} km delivery route need if the truck "
            "covers {km_per_litre} km per litre and fuel is {price} dollars per litre?",
            "At {price} dollars per litre, what is the fuel bill for driving {distance} "
            "kilometres in a car that travels {km_per_litre} kilometres on each litre?",
        ),
    ),
    WordTemplate(
        key="round_trip_tickets",
        setting="travel",
        draw=lambda r: {
            "adult_price": r.randint(24, 95),
            "child_price": r.randint(9, 40),
            "adults": r.randint(2, 6),
            "children": r.randint(1, 7),
        },
        answer=lambda v: 2 * (v["adults"] * v["adult_price"] + v["children"] * v["child_price"]),
        steps=(
            "one_way = adults * adult_price + children * child_price",
            "total = one_way * 2",
            "print(total)",
        ),
        phrasings=(
            "A train ticket costs ${adult_price} for an adult and ${child_price} for a child, "
            "each way. A group of {adults} adults and {children} children makes a "
            "round trip. What do they pay in total?",
            "{name} books a return ferry trip for {adults} adults and {children} children. One "
            "way, adults pay {adult_price} dollars and children pay {child_price} dollars. How "
            "many dollars does the return trip cost?",
            "Museum boat tours cost {adult_price} dollars per adult and {child_price} dollars per"
            " child for each direction. {name} takes {adults} adults and {children} children "
            "there and back. How much does it cost?",
            "How much does a round trip cost, in dollars, for {children} kids and {adults} "
            "grown-ups if a one-way ticket is {child_price} dollars per kid and {adult_price} "
            "dollars per grown-up?",
        ),
    ),
    WordTemplate(
        key="trip_remaining",
        setting="travel",
        draw=_remaining_trip,
        answer=lambda v: v["total"] - v["day1"] - v["day2"],
        steps=("driven = day1 + day2", "left = total - driven", "print(left)"),
        phrasings=(
            "A road trip is {total} km long. On the first day the family drives {day1} km and on "
            "the second day {day2} km. How many kilometres are left?",
            "{name} is cycling a {total} km route across the country. {He} has ridden {day1} km "
            "in the first week and {day2} km in the second week. How far does {he} still have "
            "to go, in km?",
            "A truck must deliver goods {total} km away. It drives {day1} km on Monday and {day2}"
            " km on Tuesday. How many more kilometres must it drive?",
            "After covering {day1} km and then {day2} km, how many kilometres of a {total} km "
            "journey remain?",
        ),
    ),
    WordTemplate(
        key="buses_needed",
        setting="travel",
        draw=_buses,
        answer=lambda v: -(-v["students"] // v["seats"]),
        steps=("import math", "buses = math.ceil(students / seats)", "print(buses)"),
        phrasings=(
            "{students} students are going on a field trip. Each bus holds {seats} students. How "
            "many buses are needed?",
            "A coach seats {seats} passengers. What is the smallest number of coaches that can "
            "carry {students} fans to a match?",
            "To take {students} runners to the start of a race, organisers use vans with {seats} "
            "seats each. How many vans do they need at least?",
        ),
    ),
    WordTemplate(
        key="practice_hours",
        setting="time",
        draw=_practice,
        answer=lambda v: v["minutes"] * v["days"] * v["weeks"] // 60,
        steps=(
            "total_minutes = minutes * days * weeks",
            "hours = total_minutes // 60",
            "print(hours)",
        ),
        phrasings=(
            "{name} practises the violin for {minutes} minutes a day, {days} days a week. How "
            "many hours does {he} practise in {weeks} weeks?",
            "For {weeks} weeks, a swimmer trains {days} days each week, {minutes} minutes per "
            "session. How many hours of training is that?",
            "{name} spends {minutes} minutes on homework on {days} days of every week. How many "
            "hours is that over {weeks} weeks?",
            "How many hours in total does a choir rehearse over {weeks} weeks if it meets {days} "
            "times a week for {minutes} minutes each time?",
        ),
    ),
    WordTemplate(
        key="reading_days",
        setting="time",
        draw=_reading,
        answer=lambda v: (v["pages"] - v["read"]) // v["per_day"],
        steps=("left = pages - read", "days = left // per_day", "print(days)"),
        phrasings=(
            "A novel has {pages} pages. {name} has already read {read} pages and reads "
            "{per_day} pages each day. How many more days will it take {him} to finish?",
            "{name} reads {per_day} pages every evening. So far {he} has finished {read} pages of "
            "a {pages}-page book. How many evenings are left until {he} finishes it?",
            "A report is {pages} pages long. {name} has checked {read} pages and checks {per_day}"
            " more pages each day. In how many days will {he} finish checking it?",
            "How many days does it take to read the rest of a {pages}-page manual at {per_day} "
            "pages a day, if the first {read} pages are already done?",
        ),
    ),
    WordTemplate(
        key="films_in_a_row",
        setting="time",
        draw=lambda r: {
            "films": r.randint(3, 8),
            "length": r.randint(85, 150),
            "pause": r.randint(5, 25),
        },
        answer=lambda v: v["films"] * v["length"] + (v["films"] - 1) * v["pause"],
        steps=(
            "watching = films * length",
            "pauses = (films - 1) * pause",
            "total = watching + pauses",
            "print(total)",
        ),
        phrasings=(
            "A cinema shows {films} films in a row. Each film lasts {length} minutes and there "
            "is a {pause} minute pause between films. How many minutes does the whole marathon "
            "take?",
            "{name} watches {films} documentaries back to back, each {length} minutes long, "
            "taking a {pause}-minute pause between one and the next. How long does it take in "
            "minutes?",
            "A school holds {films} exams in a row on one day. Each exam is {length} minutes long"
            " and there are {pause} minutes between exams. How many minutes pass from the start "
            "of the first exam to the end of the last?",
            "There are {films} talks at a conference, one after another, with {pause} minutes "
            "between consecutive talks. If every talk is {length} minutes, how many minutes pass "
            "from the start of the first talk to the end of the last?",
        ),
    ),
    WordTemplate(
        key="ages_later",
        setting="time",
        draw=lambda r: {
            "age": r.randint(6, 15),
            "times": r.randint(3, 5),
            "years": r.randint(4, 20),
        },
        answer=lambda v: v["age"] * (1 + v["times"]) + 2 * v["years"],
        steps=(
            "elder = age * times",
            "child_later = age + years",
            "elder_later = elder + years",
            "total = child_later + elder_later",
            "print(total)",
        ),
        phrasings=(
            "{name} is {age} years old. {His} grandfather is {times} times as old. What will "
            "the sum of their ages be in {years} years?",
            "{name}'s uncle is {times} times as old as {name}, who is {age}. How old will the two "
            "of them be together {years} years from now?",
            "{name}'s mother is {times} times as old as {name}. {name} is {age}. What will their "
            "ages add up to in {years} years?",
            "In {years} years, what will {name} and {his} aunt's ages add up to, if {name} is "
            "{age} now and the aunt is {times} times as old?",
        ),
    ),
    WordTemplate(
        key="recipe_scale",
        setting="cooking",
        draw=_recipe,
        answer=lambda v: v["amount"] // v["servings"] * v["target"],
        steps=("per_serving = amount // servings", "total = per_serving * target", "print(total)"),
        phrasings=(
            "A soup recipe uses {amount} grams of lentils for {servings} servings. How many grams "
            "of lentils are needed for {target} servings?",
            "{name} is cooking rice for {target} guests. {His} recipe says {amount} grams of rice "
            "feed {servings} people. How many grams should {he} cook?",
            "To make {target} portions of pancakes, how much flour, in grams, is needed if "
            "{servings} portions take {amount} grams?",
        ),
    ),
    WordTemplate(
        key="bakery_profit",
        setting="cooking",
        draw=_bakery,
        answer=lambda v: v["dozens"] * 12 * v["price"] - v["cost"],
        steps=(
            "items = dozens * 12",
            "revenue = items * price",
            "profit = revenue - cost",
            "print(profit)",
        ),
        phrasings=(
            "A bakery bakes {dozens} dozen cookies and sells every cookie for {price} dollars. "
            "The ingredients cost {cost} dollars. What is the profit in dollars?",
            "{name} spends ${cost} on ingredients to bake {dozens} dozen muffins, which {he} "
            "sells at ${price} per muffin. How much profit does {he} make if all are "
            "sold?",
            "A school bake sale sells {dozens} dozen brownies at {price} dollars per brownie. The"
            " baking supplies cost {cost} dollars. How much money does the sale raise after "
            "paying for supplies?",
            "How many dollars of profit come from selling {dozens} dozen bagels at {price} "
            "dollars each, when making them cost {cost} dollars?",
        ),
    ),
    WordTemplate(
        key="stall_profit",
        setting="cooking",
        draw=_food_stall,
        answer=lambda v: (v["sold"] * v["price"] - v["costs"]) * v["days"],
        steps=(
            "takings = sold * price",
            "profit = takings - costs",
            "total = profit * days",
            "print(total)",
        ),
        phrasings=(
            "A coffee cart sells {sold} coffees a day at {price} dollars each. Its daily costs "
            "are {costs} dollars. How much profit does it make in {days} days?",
            "Every day a juice stand pays {costs} dollars in costs and sells {sold} juices for "
            "{price} dollars apiece. What is the stand's total profit over {days} days, in "
            "dollars?",
            "A lemonade stand sells {sold} cups a day at {price} dollars a cup and spends {costs}"
            " dollars a day on lemons and sugar. What is its profit after {days} days?",
            "Over {days} days, how much money does a food truck clear after costs if it sells "
            "{sold} tacos a day at {price} dollars per taco and spends {costs} dollars a day to "
            "run?",
        ),
    ),
    WordTemplate(
        key="steady_speed",
        setting="travel",
        draw=_cycling,
        answer=lambda v: v["distance"] // v["hours"] * v["hours2"],
        steps=("speed = distance // hours", "total = speed * hours2", "print(total)"),
        phrasings=(
            "A cyclist rides {distance} km in {hours} hours. Riding at the same speed, how many "
            "kilometres will the cyclist cover in {hours2} hours?",
            "{name} rowed {distance} km in {hours} hours at a steady pace. How far would {he} "
            "row in {hours2} hours at that pace?",
            "A slow mountain train covers {distance} km in {hours} hours. At that speed, how many"
            " km does it cover in {hours2} hours?",
            "At a constant speed, a boat goes {distance} km in {hours} hours. What distance, in "
            "km, does it travel in {hours2} hours?",
        ),
    ),
)
