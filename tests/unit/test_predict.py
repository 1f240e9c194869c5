"""Sibling length prediction on hand-made groups, with the expected numbers worked out below.

Notation: probit = the standard normal's inverse CDF; probit(1/6) = -0.9674, probit(1/4) =
-0.6745. A group's finished lengths sit at the midpoints of the product-limit estimator's steps.
"""

import math

import pytest

from rstar2cli.scheduler.predict import PRIOR_SIGMA, SiblingLengths


def group(lengths, done, name="g"):
    s = SiblingLengths()
    for i, (n, d) in enumerate(zip(lengths, done, strict=True)):
        s.add((name, i), name)
        s.update((name, i), n, done=d)
    return s


def test_finished_siblings_predict_their_median_and_spread():
    # 100, 200, 400 all finished: shares 1/6, 1/2, 5/6 -> probits -0.967, 0, 0.967, so the line
    # through (probit, log length) has mu = log 200 and sigma = log 2 / 0.967 = 0.7165.
    s = group([100, 200, 400], [True] * 3)
    assert s.predict_group("g") == pytest.approx(200)
    # past 400 (the 83rd percentile): the median of what is left, the 91.7th percentile, z =
    # 1.383: 200 * exp(0.7165 * 1.383) = 538.7
    assert s.predict_group("g", at_least=400) == pytest.approx(538.7, abs=0.1)


def test_unfinished_siblings_count_as_at_least_their_length():
    # one of three finished at 100: its share is 1/6, not 1/2 as if the other two were dropped,
    # so the median is 100 * exp(0.5 * 0.967) = 162.2 (sigma: the prior), not 100
    s = group([100, 300, 300], [True, False, False])
    assert s.predict_group("g") == pytest.approx(100 * math.exp(PRIOR_SIGMA * 0.9674), abs=0.1)
    # a sibling already at 300 is predicted past it: the median above 300 of that line
    assert s.predict(("g", 1)) == pytest.approx(361.2, abs=0.2)


def test_none_finished_takes_the_longest_as_next_to_finish_and_rises_as_they_run():
    s = group([0, 0, 0], [False] * 3)
    assert s.predict_group("g") is None  # nothing produced yet: nothing to say
    for i, n in enumerate([100, 200, 300]):
        s.update(("g", i), n)
    # share 1/4 at 300: 300 * exp(0.5 * 0.6745) = 420.3
    assert s.predict_group("g") == pytest.approx(420.3, abs=0.1)
    s.update(("g", 2), 600)
    assert s.predict_group("g") == pytest.approx(840.6, abs=0.2)
    assert s.predict(("g", 0), max_tokens=500) == 500  # never past its budget


def test_a_group_with_a_line_lends_its_spread_to_groups_without_one():
    s = group([100, 200, 400], [True] * 3)  # sigma 0.7165 (first test)
    for i, (n, d) in enumerate([(100, True), (150, False), (150, False)]):
        s.add(("h", i), "h")
        s.update(("h", i), n, done=d)
    # one finished at share 1/6: 100 * exp(0.7165 * 0.967) = 200
    assert s.predict_group("h") == pytest.approx(200, abs=0.1)
    assert s.num_started("h") == 3 and s.num_started("g") == 3
