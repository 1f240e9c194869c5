"""Eval metrics on tiny hand-made cases; the expected numbers are worked out in the comments."""

from __future__ import annotations

import math

import pytest

from rstar2cli.reward.metrics import (
    Sample,
    avg_at_n,
    maj_at_k,
    majority,
    pass_at_k,
    pass_at_k_one,
    summarize,
    tool_error_rates,
)

T, F = True, False


def same_number(a: str, b: str) -> bool:
    return float(a) == float(b)


def test_avg_at_n_is_mean_of_per_problem_rates():
    # problem 1: 1/4 = 0.25; problem 2: 2/4 = 0.5; mean = 0.375
    assert avg_at_n([[T, F, F, F], [T, T, F, F]]) == pytest.approx(0.375)
    # unequal sample counts weigh problems equally: (1/1 + 0/3) / 2 = 0.5
    assert avg_at_n([[T], [F, F, F]]) == pytest.approx(0.5)
    assert avg_at_n([]) == 0.0


def test_pass_at_k_one_matches_the_combinatorial_formula():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k_one(4, 1, 2) == pytest.approx(0.5)
    # n=4, c=2, k=2: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6
    assert pass_at_k_one(4, 2, 2) == pytest.approx(5 / 6)
    # n=4, c=3, k=2: only one wrong sample, every pair has a right one -> 1
    assert pass_at_k_one(4, 3, 2) == 1.0
    assert pass_at_k_one(4, 0, 2) == 0.0
    # k=1 is the plain success rate: 3/16
    assert pass_at_k_one(16, 3, 1) == pytest.approx(3 / 16)
    # n=16, c=1, k=16: the one right sample is always drawn
    assert pass_at_k_one(16, 1, 16) == 1.0
    with pytest.raises(ValueError):
        pass_at_k_one(2, 1, 3)


def test_pass_at_k_is_unbiased_against_brute_force_subsets():
    # brute force over all C(5,3)=10 subsets of [T,F,T,F,F]: a subset misses only if it is the
    # three F's, 1 of 10 -> 0.9
    from itertools import combinations

    samples = [T, F, T, F, F]
    hits = [any(s) for s in combinations(samples, 3)]
    assert sum(hits) / len(hits) == pytest.approx(0.9)
    assert pass_at_k([samples], 3) == pytest.approx(0.9)


def test_pass_at_k_averages_problems_and_skips_short_ones():
    # (0.5 + 5/6) / 2 = 2/3; the 1-sample problem cannot give pass@2 and is left out
    assert pass_at_k([[T, F, F, F], [T, T, F, F], [T]], 2) == pytest.approx(2 / 3)
    # pass@1 equals avg@n
    data = [[T, F, F, F], [T, T, F, F]]
    assert pass_at_k(data, 1) == pytest.approx(avg_at_n(data))
    assert pass_at_k([[T]], 2) is None


def test_majority_groups_equivalent_answers():
    # "5" and "5.0" form one class of 2 votes against one "6": the class is correct
    assert majority(["5", "5.0", "6"], [T, T, F], same_number) is True
    # tie 1-1: the class voted first ("6", wrong) wins
    assert majority(["6", "5"], [F, T], same_number) is False
    assert majority(["5", "6"], [T, F], same_number) is True
    # no answer does not vote: the single "7" wins
    assert majority([None, None, "7"], [F, F, T], same_number) is True
    assert majority([None, None], [F, F], same_number) is False


def test_maj_at_k_uses_disjoint_blocks_in_order():
    def s(ans, ok):
        return Sample(correct=ok, extracted=ans)

    # problem A, k=2, 5 samples -> blocks [0,1] and [2,3]; sample 4 unused.
    #   block 1: "3","3" (right) -> right; block 2: "4" (wrong) then "3" (right): tie, "4" first ->
    #   wrong. Problem A scores 1/2.
    a = [s("3", T), s("3", T), s("4", F), s("3", T), s("3", T)]
    # problem B, k=2: one block "9","9" both wrong -> 0
    b = [s("9", F), s("9.0", F)]
    # problem C has one sample: no block of 2, left out. Mean over A, B = (0.5 + 0) / 2 = 0.25
    c = [s("1", T)]
    assert maj_at_k([a, b, c], 2, same_number) == pytest.approx(0.25)
    # k=1 is plain accuracy over the samples used: A 5/5... A = 4/5, B = 0, C = 1 -> 1.8/3 = 0.6
    assert maj_at_k([a, b, c], 1, same_number) == pytest.approx(0.6)
    assert maj_at_k([c], 2, same_number) is None


def test_maj_at_k_can_beat_avg_when_the_right_answer_is_the_mode():
    # 3 samples: "12", "12", "13" with "12" right: avg@3 = 2/3, maj@3 = 1
    samples = [Sample(T, "12"), Sample(T, "12"), Sample(F, "13")]
    assert maj_at_k([samples], 3, same_number) == 1.0
    assert avg_at_n([[x.correct for x in samples]]) == pytest.approx(2 / 3)


def test_tool_error_rates_by_status():
    # 8 calls: 5 ok, 2 error, 1 timeout -> error 2/8, timeout 1/8, "ok" not listed
    rates = tool_error_rates(["ok"] * 5 + ["error", "error", "timeout"])
    assert rates == {"error": pytest.approx(0.25), "timeout": pytest.approx(0.125)}
    assert tool_error_rates([]) == {}


def test_summarize_one_benchmark():
    # two problems, two samples each
    p1 = [
        Sample(
            T, "4", num_response_tokens=100, tool_statuses=["ok", "error"], finish_reason="answer"
        ),
        Sample(F, "5", num_response_tokens=300, tool_statuses=[], finish_reason="answer"),
    ]
    p2 = [
        Sample(F, None, num_response_tokens=50, tool_statuses=["timeout"], finish_reason="budget"),
        Sample(F, "1", num_response_tokens=150, tool_statuses=["ok"], finish_reason="answer"),
    ]
    summary = summarize([p1, p2], ks=[2], equivalent=same_number)
    assert summary.num_problems == 2 and summary.num_trajectories == 4
    # avg@2 = (1/2 + 0/2) / 2 = 0.25
    assert summary.avg_at_n == pytest.approx(0.25)
    # pass@2: p1 has a right sample (1.0), p2 none (0.0) -> 0.5
    assert summary.pass_at_k == {"pass@2": pytest.approx(0.5)}
    # maj@2: p1 "4" vs "5" tie, "4" (right) first -> 1; p2 only "1" votes (wrong) -> 0; mean 0.5
    assert summary.maj_at_k == {"maj@2": pytest.approx(0.5)}
    # tokens: (100 + 300 + 50 + 150) / 4 = 150
    assert summary.mean_response_tokens == pytest.approx(150.0)
    # 4 tool calls over 4 trajectories = 1.0; 2 of 4 not ok -> 0.5 (error 1/4, timeout 1/4)
    assert summary.tool_calls_per_trajectory == pytest.approx(1.0)
    assert summary.tool_error_rate == pytest.approx(0.5)
    assert summary.tool_error_rate_by_status == {"error": 0.25, "timeout": 0.25}
    assert summary.finish_reasons == {"answer": 3, "budget": 1}
    d = summary.to_dict()
    assert d["pass_at_k"]["pass@2"] == pytest.approx(0.5) and not math.isnan(d["avg_at_n"])
