"""Word-problem templates about money: shopping, pay, bills and savings.

Each template's numbers are drawn so every division in it is exact or is meant to round (a
remainder, a rounding-up), and so the answer is a positive integer. Written from everyday life
for this project; see `rstar2cli.data.words.generate` for how they are split and checked.
"""

from __future__ import annotations

import random

from rstar2cli.data.words.template import Numbers, WordTemplate, pick_not_dividing


def _change(r: random.Random) -> Numbers:
    count, price = r.randint(12, 48), r.randint(13, 79)
    paid = (count * price // 100 + r.randint(1, 3)) * 100
    return {"count": count, "price": price, "paid": paid}


def _discount(r: random.Random) -> Numbers:
    # NOTE: a price that is a multiple of 20 makes any multiple-of-5 percent a whole number
    return {
        "price": 20 * r.randint(2, 19),
        "percent": r.choice((10, 15, 20, 25, 30, 40)),
        "count": r.randint(2, 9),
    }


def _leftover_budget(r: random.Random) -> Numbers:
    price = r.randint(7, 46)
    return {"budget": pick_not_dividing(r, lo=150, hi=999, by=price), "price": price}


def _classes(r: random.Random) -> Numbers:
    return {"fee": r.randint(20, 90), "price": r.randint(8, 25), "budget": r.randint(200, 700)}


def _packs(r: random.Random) -> Numbers:
    pack = r.randint(6, 24)
    return {"pack": pack, "needed": pick_not_dividing(r, lo=100, hi=900, by=pack)}


def _savings(r: random.Random) -> Numbers:
    rent, food = 25 * r.randint(24, 56), 10 * r.randint(25, 60)
    return {
        "salary": 50 * r.randint((rent + food) // 50 + 2, 90),
        "rent": rent,
        "food": food,
        "months": r.randint(3, 12),
    }


def _split_bill(r: random.Random) -> Numbers:
    people, share = r.randint(3, 12), r.randint(18, 75)
    tip = r.randint(5, people * share // 4)  # NOTE: at most a third of the bill
    return {"people": people, "bill": people * share - tip, "tip": tip}


def _plans(r: random.Random) -> Numbers:
    b_monthly = r.randint(15, 45)
    return {
        "a_monthly": b_monthly + r.randint(3, 15),
        "setup": r.randint(20, 80),
        "b_monthly": b_monthly,
        "months": r.randint(6, 24),
    }


def _quarter(r: random.Random) -> Numbers:
    money = 4 * r.randint(30, 245)
    return {"money": money, "spent": r.randint(10, money * 3 // 4 - 10)}


MONEY_TEMPLATES: tuple[WordTemplate, ...] = (
    WordTemplate(
        key="shop_change",
        setting="shopping",
        draw=_change,
        answer=lambda v: v["paid"] - v["count"] * v["price"],
        steps=("cost = count * price", "change = paid - cost", "print(change)"),
        phrasings=(
            "{name} buys {count} mugs for a café at {price} dollars each and pays with {paid} "
            "dollars. How much change does {he} get back, in dollars?",
            "At a kitchen shop, mugs cost ${price} apiece. {name} hands the cashier ${paid} for "
            "{count} mugs. How many dollars of change should {he} receive?",
            "How much change is due to {name}, in dollars, after paying {paid} dollars for "
            "{count} mugs that cost {price} dollars each?",
            "{name} paid with {paid} dollars. {He} bought {count} mugs, and each mug was {price} "
            "dollars. What change, in dollars, did {he} get?",
        ),
    ),
    WordTemplate(
        key="shop_two_items",
        setting="shopping",
        draw=lambda r: {
            "shirts": r.randint(3, 19),
            "shirt_price": r.randint(17, 64),
            "socks": r.randint(5, 30),
            "sock_price": r.randint(4, 12),
        },
        answer=lambda v: v["shirts"] * v["shirt_price"] + v["socks"] * v["sock_price"],
        steps=(
            "shirt_cost = shirts * shirt_price",
            "sock_cost = socks * sock_price",
            "total = shirt_cost + sock_cost",
            "print(total)",
        ),
        phrasings=(
            "For the new season, a shop orders {shirts} shirts at {shirt_price} dollars each and "
            "{socks} pairs of socks at {sock_price} dollars a pair. What does the whole order cost "
            "in dollars?",
            "Socks cost {sock_price} dollars a pair and shirts cost {shirt_price} dollars each. "
            "{name} buys {socks} pairs of socks and {shirts} shirts for a sports club. How many "
            "dollars does {he} spend?",
            "A dance school buys uniforms: {shirts} shirts costing {shirt_price} dollars apiece "
            "and {socks} pairs of socks costing {sock_price} dollars per pair. How much money "
            "does the school pay?",
            "{name} spent money on {shirts} shirts, each priced at {shirt_price} dollars, plus "
            "{socks} pairs of socks at {sock_price} dollars per pair. Find the total amount {he} "
            "spent in dollars.",
        ),
    ),
    WordTemplate(
        key="shop_discount",
        setting="shopping",
        draw=_discount,
        answer=lambda v: (v["price"] - v["price"] * v["percent"] // 100) * v["count"],
        steps=(
            "discount = price * percent // 100",
            "sale_price = price - discount",
            "total = sale_price * count",
            "print(total)",
        ),
        phrasings=(
            "A jacket normally costs {price} dollars. During a sale every jacket is {percent}% "
            "off. How much do {count} jackets cost at the sale price, in dollars?",
            "{name} wants {count} jackets for {his} hiking group. The shop takes {percent}% off "
            "the regular price of {price} dollars per jacket. What will {he} pay in total, in "
            "dollars?",
            "A store marks down its {price}-dollar jackets by {percent}% for one weekend. {name} "
            "buys {count} of them. How many dollars does {he} spend?",
            "With {percent}% off, how many dollars do {count} jackets cost if one jacket is "
            "regularly priced at {price} dollars?",
        ),
    ),
    WordTemplate(
        key="budget_leftover",
        setting="shopping",
        draw=_leftover_budget,
        answer=lambda v: v["budget"] % v["price"],
        steps=("left = budget % price", "print(left)"),
        phrasings=(
            "{name} has {budget} dollars and buys as many board games as possible at {price} "
            "dollars each. How many dollars are left over?",
            "Board games sell for {price} dollars each. If {name} spends {his} {budget} dollars "
            "on as many games as {he} can afford, how much money remains?",
            "Notebooks are {price} dollars each. {name} buys as many as {his} {budget} dollars "
            "allow. How many dollars does {he} keep?",
            "A toy store prices each board game at {price} dollars. {name} brings {budget} "
            "dollars and buys the largest number of games {he} can. What amount, in dollars, is "
            "left?",
        ),
    ),
    WordTemplate(
        key="class_budget",
        setting="sports",
        draw=_classes,
        answer=lambda v: (v["budget"] - v["fee"]) // v["price"],
        steps=("after_fee = budget - fee", "classes = after_fee // price", "print(classes)"),
        phrasings=(
            "A climbing gym charges a {fee} dollar joining fee and then {price} dollars per "
            "class. {name} has {budget} dollars to spend. How many classes can {he} take?",
            "{name} has a budget of {budget} dollars for yoga. The studio asks for a one-time fee "
            "of {fee} dollars, and each class is {price} dollars. What is the largest number of "
            "classes {he} can pay for?",
            "Swimming lessons cost {price} dollars each, plus a registration fee of {fee} dollars"
            " paid once. How many lessons can {name} pay for with {budget} dollars?",
            "Each dance class costs {price} dollars after a sign-up fee of {fee} dollars. With "
            "{budget} dollars, how many classes can {name} attend at most?",
        ),
    ),
    WordTemplate(
        key="restaurant_order",
        setting="cooking",
        draw=lambda r: {
            "crates": r.randint(6, 40),
            "crate_price": r.randint(14, 38),
            "sacks": r.randint(3, 25),
            "sack_price": r.randint(9, 27),
            "delivery": r.randint(15, 60),
        },
        answer=lambda v: (
            v["crates"] * v["crate_price"] + v["sacks"] * v["sack_price"] + v["delivery"]
        ),
        steps=(
            "tomato_cost = crates * crate_price",
            "onion_cost = sacks * sack_price",
            "total = tomato_cost + onion_cost + delivery",
            "print(total)",
        ),
        phrasings=(
            "A restaurant orders {crates} crates of tomatoes at {crate_price} dollars a crate and "
            "{sacks} sacks of onions at {sack_price} dollars a sack. Delivery costs {delivery} "
            "dollars. What is the total bill in dollars?",
            "The delivery fee is {delivery} dollars. On top of that, a cook buys {sacks} sacks of "
            "onions for {sack_price} dollars each and {crates} crates of tomatoes for "
            "{crate_price} dollars each. How much is paid altogether?",
            "A café pays {delivery} dollars for delivery, {crate_price} dollars for each of "
            "{crates} crates of tomatoes, and {sack_price} dollars for each of {sacks} sacks of "
            "onions. What is the total cost in dollars?",
            "How many dollars does a kitchen spend on {crates} crates of tomatoes priced at "
            "{crate_price} dollars per crate, {sacks} onion sacks priced at {sack_price} dollars "
            "per sack, and a {delivery} dollar delivery charge?",
        ),
    ),
    WordTemplate(
        key="packs_needed",
        setting="shopping",
        draw=_packs,
        answer=lambda v: -(-v["needed"] // v["pack"]),
        steps=("import math", "packs = math.ceil(needed / pack)", "print(packs)"),
        phrasings=(
            "Paper cups come in packs of {pack}. A school fair needs {needed} cups. How many "
            "packs must the organisers buy?",
            "For a street party, {name} needs {needed} paper plates. Plates are sold only in "
            "packs of {pack}. What is the fewest packs {he} can buy?",
            "Balloons are sold in bags of {pack}. How many bags does {name} need to buy to get "
            "{needed} balloons for a festival?",
            "How many packs of {pack} napkins are needed to have at least {needed} napkins?",
        ),
    ),
    WordTemplate(
        key="weekday_wage",
        setting="work",
        draw=lambda r: {
            "rate": r.randint(12, 38),
            "hours": r.randint(4, 9),
            "weeks": r.randint(2, 12),
        },
        answer=lambda v: v["rate"] * v["hours"] * 5 * v["weeks"],
        steps=(
            "daily = rate * hours",
            "weekly = daily * 5",
            "total = weekly * weeks",
            "print(total)",
        ),
        phrasings=(
            "{name} earns ${rate} an hour at a bike repair shop. {He} works {hours} hours "
            "every weekday. How much does {he} earn in {weeks} weeks?",
            "Working {hours} hours on each weekday for {weeks} weeks, a warehouse helper is paid "
            "{rate} dollars per hour. What are the total earnings in dollars?",
            "How many dollars does {name} earn in {weeks} weeks at a library job that pays {rate}"
            " dollars an hour for {hours} hours on every weekday?",
            "A part-time tutor works {hours} hours a day, Monday to Friday, at {rate} dollars per "
            "hour. How many dollars does the tutor make over {weeks} weeks?",
        ),
    ),
    WordTemplate(
        key="monthly_savings",
        setting="work",
        draw=_savings,
        answer=lambda v: (v["salary"] - v["rent"] - v["food"]) * v["months"],
        steps=(
            "spent = rent + food",
            "saved = salary - spent",
            "total = saved * months",
            "print(total)",
        ),
        phrasings=(
            "{name} earns {salary} dollars a month. {He} pays {rent} dollars for rent and {food} "
            "dollars for food each month and saves the rest. How much does {he} save in {months} "
            "months?",
            "Each month {name} spends {food} dollars on groceries and {rent} dollars on rent out "
            "of a monthly income of {salary} dollars. Whatever is left goes into savings. What "
            "are {his} savings after {months} months, in dollars?",
            "A cook's take-home pay is {salary} dollars each month. Rent takes {rent} dollars and"
            " food takes {food} dollars; the rest is saved. How much is saved over {months} "
            "months?",
            "After {months} months, how many dollars has a nurse saved if the nurse earns "
            "{salary} dollars monthly, pays {rent} dollars in rent, and spends {food} dollars on "
            "food, saving everything else?",
        ),
    ),
    WordTemplate(
        key="sales_commission",
        setting="work",
        draw=lambda r: {
            "base": 50 * r.randint(16, 50),
            "percent": r.choice((2, 3, 4, 5, 6, 8, 10, 12)),
            "sales": 100 * r.randint(20, 300),
        },
        answer=lambda v: v["base"] + v["sales"] * v["percent"] // 100,
        steps=("commission = sales * percent // 100", "total = base + commission", "print(total)"),
        phrasings=(
            "A furniture salesperson gets a base pay of {base} dollars a month plus {percent}% "
            "of sales. This month the sales were {sales} dollars. What is the total pay in "
            "dollars?",
            "{name} sold {sales} dollars' worth of phones this month. {He} keeps {percent}% of "
            "{his} sales as commission on top of a {base} dollar base salary. How much does {he} "
            "earn this month?",
            "On top of {his} {base} dollar monthly wage, {name} receives {percent}% of the value "
            "of the cars {he} sells. {He} sold cars worth {sales} dollars this month. What is "
            "{his} pay for the month?",
            "How much is a month's pay, in dollars, for an agent whose fixed salary is {base} "
            "dollars and who earns {percent}% commission on {sales} dollars of sales?",
        ),
    ),
    WordTemplate(
        key="split_bill",
        setting="cooking",
        draw=_split_bill,
        answer=lambda v: (v["bill"] + v["tip"]) // v["people"],
        steps=("total = bill + tip", "share = total // people", "print(share)"),
        phrasings=(
            "{people} friends eat out. The bill is {bill} dollars and they leave a {tip} dollar "
            "tip. They split the total equally. How much does each friend pay?",
            "A team dinner costs {bill} dollars, plus {tip} dollars for the tip. If the {people} "
            "team members share the cost evenly, how many dollars does each one pay?",
            "The {people} members of a book club order food for {bill} dollars and add a {tip} "
            "dollar tip. Sharing the cost equally, how much does each member pay?",
            "A tip of {tip} dollars is added to a {bill} dollar restaurant bill, and the sum is "
            "divided equally among {people} coworkers. What is each person's share?",
        ),
    ),
    WordTemplate(
        key="plan_difference",
        setting="home",
        draw=_plans,
        answer=lambda v: (v["a_monthly"] - v["b_monthly"]) * v["months"] + v["setup"],
        steps=(
            "plan_a = a_monthly * months + setup",
            "plan_b = b_monthly * months",
            "difference = plan_a - plan_b",
            "print(difference)",
        ),
        phrasings=(
            "Phone plan A costs {a_monthly} dollars a month plus a {setup} dollar setup fee. Plan "
            "B costs {b_monthly} dollars a month with no fee. Over {months} months, how many more "
            "dollars does plan A cost?",
            "{name} compares two gym memberships for {months} months. One costs {a_monthly} "
            "dollars monthly and has a {setup} dollar start fee; the other is {b_monthly} dollars "
            "monthly. What is the difference in total cost, in dollars?",
            "Over {months} months, how much cheaper is an internet plan at {b_monthly} dollars "
            "per month than one at {a_monthly} dollars per month that also charges {setup} "
            "dollars to connect?",
        ),
    ),
    WordTemplate(
        key="quarter_spent",
        setting="shopping",
        draw=_quarter,
        answer=lambda v: v["money"] - v["money"] // 4 - v["spent"],
        steps=("quarter = money // 4", "left = money - quarter - spent", "print(left)"),
        phrasings=(
            "{name} has {money} dollars. {He} spends a quarter of it on a concert ticket and "
            "{spent} dollars on dinner. How much money does {he} have left?",
            "Out of {money} dollars of birthday money, {name} spends {spent} dollars on books and "
            "one fourth of the {money} dollars on a game. How many dollars remain?",
            "{name} takes {money} dollars to a fair. {He} spends one quarter of the money on "
            "rides and {spent} dollars on food. How many dollars does {he} bring home?",
            "A club had {money} dollars in its account. It used one quarter of the money for a "
            "trip and {spent} dollars for snacks. What is left in the account, in dollars?",
        ),
    ),
    WordTemplate(
        key="rent_increase",
        setting="home",
        draw=lambda r: {"rent": 100 * r.randint(5, 18), "percent": r.randint(2, 10)},
        answer=lambda v: (v["rent"] + v["rent"] * v["percent"] // 100) * 12,
        steps=(
            "increase = rent * percent // 100",
            "new_rent = rent + increase",
            "total = new_rent * 12",
            "print(total)",
        ),
        phrasings=(
            "{name} pays {rent} dollars of rent each month. Next year the rent goes up by "
            "{percent}%. How much rent will {he} pay in total next year?",
            "A shop's monthly rent of {rent} dollars is raised by {percent}% for the coming "
            "year. What will the shop pay in rent over the twelve months of that year, in "
            "dollars?",
            "The monthly rent for a studio is {rent} dollars. If it rises by {percent}% starting "
            "in January, how many dollars of rent are paid from January to December?",
            "After a {percent}% increase, what is a full year of rent, in dollars, if the rent "
            "used to be {rent} dollars per month?",
        ),
    ),
)
