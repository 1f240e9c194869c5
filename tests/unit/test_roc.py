"""Resample-on-Correct: penalties, group dropping, class quotas, both selection modes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from rstar2cli import protocol as P
from rstar2cli.rl import roc
from rstar2cli.rl.roc import (
    RolloutSummary,
    class_quota,
    drop_equal_reward_groups,
    format_penalty,
    roc_downsample,
    sample_inverse_penalty,
    tool_error_rate,
    tool_error_share,
    total_penalty,
)


def pos(statuses: list[str], num_answer_tags: int = 1, num_turns: int = 2) -> RolloutSummary:
    return RolloutSummary(1.0, statuses, num_answer_tags, num_turns)


def neg(statuses: list[str] | None = None) -> RolloutSummary:
    return RolloutSummary(0.0, statuses or ["ok"], 1, 2)


# ---------------------------------------------------------------- penalties


def test_tool_error_rate_counts_every_status_but_ok():
    # 2 of 4 calls not "ok" -> 0.5
    assert tool_error_rate(["ok", "ok", "error", "timeout"]) == 0.5
    # parse_error and sandbox_error count too: 2 of 3
    assert tool_error_rate(["ok", "parse_error", "sandbox_error"]) == pytest.approx(2 / 3)
    # memory and output_limit as well: 2 of 2
    assert tool_error_rate(["memory", "output_limit"]) == 1.0
    assert tool_error_rate(["ok"]) == 0.0


def test_tool_error_rate_without_tool_calls_is_one_half():
    assert tool_error_rate([]) == 0.5


def test_printed_error_word_does_not_count_only_status_is_read():
    # The call printed "error" but ran fine: status "ok", so p_err = 0.
    record = {
        "id": "t1",
        "reward": 1.0,
        "tool_calls": [{"status": "ok", "duration_s": 0.1, "code": "print('error')"}],
        "text": "stdout: error\n<answer>\\boxed{3}</answer>",
        "num_turns": 2,
        "num_answer_tags": 1,
    }
    summary = RolloutSummary.from_record(record)
    assert summary.tool_statuses == ("ok",)
    assert tool_error_rate(summary.tool_statuses) == 0.0
    assert total_penalty(summary) == 0.0


def test_from_record_needs_a_reward():
    with pytest.raises(ValueError, match="no reward"):
        RolloutSummary.from_record({"id": "t2", "tool_calls": [], "num_turns": 1})


@pytest.mark.parametrize(
    ("num_answer_tags", "num_turns", "expected"),
    [
        (0, 3, 1.0),  # no <answer> at all
        (1, 3, 0.0),  # exactly one answer: clean
        (2, 4, 0.25),  # (2 - 1) / 4
        (3, 2, 1.0),  # (3 - 1) / 2 = 1.0
        (5, 2, 1.0),  # (5 - 1) / 2 = 2.0, capped at 1
    ],
)
def test_format_penalty(num_answer_tags, num_turns, expected):
    assert format_penalty(num_answer_tags, num_turns) == expected


def test_total_penalty_adds_both():
    # p_err = 1/4 (one timeout of four), p_format = (2 - 1) / 4 -> 0.25 + 0.25
    assert total_penalty(pos(["ok", "ok", "timeout", "ok"], 2, 4)) == 0.5
    # no tool call (0.5) and no answer (1.0)
    assert total_penalty(RolloutSummary(0.0, [], 0, 1)) == 1.5


# ---------------------------------------------------------------- group dropping


def test_drop_equal_reward_groups_keeps_mixed_groups_only():
    groups = [[1.0, 1.0, 1.0], [0.0, 0.0], [1.0, 0.0, 1.0], [0.0], [0.0, 1.0]]
    assert drop_equal_reward_groups(groups) == [2, 4]


# ---------------------------------------------------------------- quotas


@pytest.mark.parametrize(
    ("num_positive", "num_negative", "group_size", "expected"),
    [
        (16, 16, 16, (8, 8)),  # exact ratio 1:1
        (20, 12, 16, (10, 6)),  # negatives 16 * 12 / 32 = 6 exactly
        (5, 27, 16, (2, 14)),  # negatives 13.5 -> 14 (rounded up), positives get 2
        (3, 29, 16, (2, 14)),  # negatives 14.5 -> 15, positives 1 -> lifted to min 2
        (1, 31, 16, (1, 15)),  # 15.5 -> 16 negatives; the only positive is still kept
        (30, 2, 16, (14, 2)),  # negatives 1 -> lifted to min 2
        (32, 0, 16, (16, 0)),  # all positive
        (0, 32, 16, (0, 16)),  # all negative
    ],
)
def test_class_quota(num_positive, num_negative, group_size, expected):
    assert class_quota(num_positive, num_negative, group_size) == expected


# ---------------------------------------------------------------- down-sampling


def _mixed_group() -> list[RolloutSummary]:
    # 8 rollouts: 5 positives with various penalties, 3 negatives.
    return [
        pos(["ok", "ok"]),  # 0: p 0.0
        neg(["error"]),  # 1
        pos(["ok", "error"]),  # 2: p 0.5
        pos([]),  # 3: p 0.5 (no tool call)
        neg(),  # 4
        pos(["error", "timeout"], 3, 2),  # 5: p 1.0 + 1.0 = 2.0
        pos(["ok", "ok", "ok", "parse_error"]),  # 6: p 0.25
        neg(["sandbox_error"]),  # 7
    ]


def test_downsample_returns_sorted_unique_indices_with_quota():
    group = _mixed_group()
    for seed in range(50):
        kept = roc_downsample(group, group_size=4, mode="paper", rng=seed)
        assert kept == sorted(set(kept)) and len(kept) == 4
        # quota: negatives ceil(4 * 3 / 8) = 2, positives 2
        assert sum(group[i].is_positive for i in kept) == 2


def _response(outputs: list[str], answers: int, closed: bool = True) -> str:
    """A response text as the agent loop decodes it: one model turn per tool output and a last
    one, the tool outputs in masked chunks between them, `answers` answer blocks at the end."""
    turns = ["<reason>think" + P.IM_END for _ in outputs]
    last = "</reason>" + "<answer>\\boxed{1}</answer>" * answers
    if not closed:
        last += "<answer>\\boxed{2}"
    chunks = [t + P.render_tool_response(o) for t, o in zip(turns, outputs, strict=True)]
    return "".join(chunks) + last + P.IM_END


def _blocks(text: str, opening: str, closing: str) -> list[str]:
    """Non-overlapping opening...closing spans, leftmost first, each closed by the nearest
    closing after its opening (the release's non-greedy patterns), found by scanning."""
    out, at = [], 0
    while (start := text.find(opening, at)) >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        out.append(text[start : end + len(closing)])
        at = end + len(closing)
    return out


def _reference_release(rewards: list[float], texts: list[str], n: int, min_neg: int, min_pos: int):
    """The public release's down-sampling of one group, re-derived from its description, written
    apart from rstar2cli.rl.roc: the set of positions it trains on."""

    def penalty(text: str) -> float:
        calls = _blocks(text, "<tool_response>", "</tool_response>")
        err = sum("error" in c.lower() for c in calls) / len(calls) if calls else 0.5
        opened, shut = text.count("<answer>"), text.count("</answer>")
        pairs = len(_blocks(text, "<answer>", "</answer>"))
        turns = len(_blocks(text, "<|im_start|>assistant", "<|im_end|>"))
        if opened == 0 or shut == 0 or opened != pairs or shut != pairs or turns == 0:
            return err + 1.0
        return err + min((pairs - 1) / turns, 1.0)

    size = len(rewards)
    if size < n:
        return set()
    if size == n:
        return set(range(size))
    weights = np.array([penalty(t) for t in texts])
    order = np.argsort(weights, kind="stable")
    zero = [int(i) for i in order if rewards[i] <= 0]
    nonzero = [int(i) for i in order if rewards[i] > 0]
    n_zero, n_nonzero = round(len(zero) * n / size), round(len(nonzero) * n / size)
    if n_zero < min_neg and n_nonzero < min_pos:  # unreachable when min_neg + min_pos <= n
        return set(range(size))
    if n_zero <= min(min_neg, len(zero)):
        n_zero = min(min_neg, len(zero))
        n_nonzero = n - n_zero
    if n_nonzero <= min(min_pos, len(nonzero)):
        n_nonzero = min(min_pos, len(nonzero))
        n_zero = n - n_nonzero
    return set(nonzero[:n_nonzero]) | set(zero[:n_zero])


def test_release_mode_matches_a_separate_reading_of_the_release_on_random_groups():
    """2,000 random groups (sizes around and at 2G, any mix of rewards, tool outputs with and
    without the word "error", one or two answers, an unclosed one): `release` keeps exactly the
    positions a separate re-implementation of the release's selection keeps."""
    rng = np.random.default_rng(0)
    outputs = ["42", "Traceback: ZeroDivisionError", "no error here", "Execution timed out.", "7"]
    for _ in range(2000):
        g = int(rng.choice([4, 8, 8, 8, 7, 12]))
        size = int(rng.choice([g - 1, g, 2 * g, 2 * g, 2 * g + 1]))
        rewards = [float(rng.random() < rng.random()) for _ in range(size)]
        texts = [
            _response(
                [str(rng.choice(outputs)) for _ in range(int(rng.integers(0, 4)))],
                answers=int(rng.choice([0, 1, 1, 2])),
                closed=bool(rng.random() < 0.9),
            )
            for _ in range(size)
        ]
        group = [RolloutSummary(r, text=t) for r, t in zip(rewards, texts, strict=True)]
        min_pos, min_neg = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        kept = roc_downsample(group, g, "release", min_positive=min_pos, min_negative=min_neg)
        assert set(kept) == _reference_release(rewards, texts, g, min_neg, min_pos)
        assert kept == sorted(kept)


def test_release_mode_sorts_both_classes_by_a_penalty_read_from_the_text():
    """8 rollouts, G = 4, minimums 2 + 2. Rewards 1 1 0 0 0 0 0 0: round(6 x 4 / 8) = 3
    negatives, round(2 x 4 / 8) = 1 positive, lifted to 2 positives and 2 negatives. Negatives
    are not drawn at random: the two with the lowest penalty stay (positions 6 and 7, whose tool
    printed nothing with "error"; position 5 printed "no error here", which counts as one)."""
    clean = _response(["42"], answers=1)  # p_err 0, one answer over one later turn: 0
    worded = _response(["no error here"], answers=1)  # p_err 1: the word, not the status
    one_turn = _response([], answers=1)  # no tool call: 0.5, and no turn opened inside: +1
    texts = [clean, one_turn, worded, worded, worded, worded, clean, clean]
    rewards = [1.0, 1.0] + [0.0] * 6
    group = [RolloutSummary(r, text=t) for r, t in zip(rewards, texts, strict=True)]
    assert roc.release_penalty(clean) == 0.0
    assert roc.release_penalty(worded) == 1.0
    assert roc.release_penalty(one_turn) == 1.5
    assert roc.release_penalty(_response(["Execution timed out."], answers=2)) == 1.0  # 0 + 1
    assert roc_downsample(group, 4, "release") == [0, 1, 6, 7]
    assert roc.release_quota(2, 6, 4, min_positive=2, min_negative=2) == (2, 2)
    # round half to even: 5 positives of 16 for G = 8 -> 2.5 -> 2; 11 -> 5.5 -> 6
    assert roc.release_quota(5, 11, 8, min_positive=2, min_negative=2) == (2, 6)


def test_paper_mode_prefers_zero_penalty_first():
    # Two clean positives (p 0) and two noisy ones; 2 positive slots -> always the clean ones.
    group = [pos(["ok"]), pos(["error"]), neg(), pos(["ok", "ok"]), pos([], 0), neg()]
    for seed in range(50):
        kept = roc_downsample(group, group_size=4, mode="paper", rng=seed)
        assert [i for i in kept if group[i].is_positive] == [0, 3]


def test_paper_mode_frequencies_follow_inverse_penalty():
    # G = 2 of 4: negatives ceil(2 * 2 / 4) = 1, positives 1 (minimums of 1 each).
    # Positive 0: one error in 4 calls, one answer -> p 0.25, weight 4.
    # Positive 1: one error in 2 calls (0.5) + two answers in 2 turns (0.5) -> p 1.0, weight 1.
    # One draw in proportion to 1/p: P(keep 0) = 4 / 5 = 0.8, P(keep 1) = 0.2.
    # Over 2000 seeded draws the std of a frequency is sqrt(0.8 * 0.2 / 2000) ~ 0.009; the
    # tolerance 0.04 is over 4 std. Negatives are uniform: each kept with probability 0.5.
    group = [pos(["ok", "error", "ok", "ok"]), pos(["ok", "error"], 2, 2), neg(), neg()]
    counts = Counter()
    num_draws = 2000
    for seed in range(num_draws):
        kept = roc_downsample(group, 2, "paper", min_positive=1, min_negative=1, rng=seed)
        counts.update(kept)
    assert counts[0] / num_draws == pytest.approx(0.8, abs=0.04)
    assert counts[1] / num_draws == pytest.approx(0.2, abs=0.04)
    assert counts[2] / num_draws == pytest.approx(0.5, abs=0.04)
    assert counts[0] + counts[1] == num_draws  # exactly one positive each time
    assert counts[0] > 3 * counts[1]  # the clean one is kept far more often


def test_inverse_penalty_sampling_without_replacement_matches_exact_inclusion():
    # Penalties 0.25, 0.5, 1.0 -> weights 4, 2, 1 (sum 7); keep 2 (sequential draws).
    # P(exclude idx 2) = P(first two are 0,1) = 4/7 * 2/3 + 2/7 * 4/5 = 64/105 -> incl 41/105
    # P(exclude idx 0) = 2/7 * 1/5 + 1/7 * 2/6 = 11/105 -> incl 94/105 ~ 0.895
    # incl idx 1 = 2 - 94/105 - 41/105 = 75/105 ~ 0.714
    # 2000 draws with one numpy Generator; tolerance 0.04 (std <= 0.011).
    rng = np.random.default_rng(123)
    counts = Counter()
    num_draws = 2000
    for _ in range(num_draws):
        counts.update(sample_inverse_penalty([0.25, 0.5, 1.0], 2, rng))
    assert counts[0] / num_draws == pytest.approx(94 / 105, abs=0.04)
    assert counts[1] / num_draws == pytest.approx(75 / 105, abs=0.04)
    assert counts[2] / num_draws == pytest.approx(41 / 105, abs=0.04)


def test_paper_mode_clean_positive_beats_noisy_in_a_large_group():
    # 2G = 8, G = 4: 4 positives, 4 negatives -> 2 of each.
    # Positive 0 is clean (p 0) and always kept; the other slot is drawn among
    # p 0.25 / 0.5 / 1.5 with weights 4 : 2 : 2/3 -> probabilities 0.6 / 0.3 / 0.1.
    group = [
        pos(["ok", "ok"]),
        neg(),
        pos(["ok", "ok", "ok", "error"]),
        neg(),
        pos(["ok", "timeout"]),
        neg(),
        pos(["error", "error"], 2, 2),  # 1.0 + 0.5
        neg(),
    ]
    counts = Counter()
    num_draws = 2000
    for seed in range(num_draws):
        counts.update(roc_downsample(group, 4, "paper", rng=seed))
    assert counts[0] == num_draws
    assert counts[2] / num_draws == pytest.approx(0.6, abs=0.04)
    assert counts[4] / num_draws == pytest.approx(0.3, abs=0.04)
    assert counts[6] / num_draws == pytest.approx(0.1, abs=0.04)


# ---------------------------------------------------------------- edge cases


def test_all_positive_group_keeps_the_cleanest():
    # 6 positives, G = 3: 3 clean ones (p 0) at 1, 3, 5 fill every slot.
    group = [pos(["error"]), pos(["ok"]), pos([]), pos(["ok"]), pos([], 0), pos(["ok"])]
    for seed in range(20):
        assert roc_downsample(group, 3, "paper", min_positive=1, min_negative=1, rng=seed) == [
            1,
            3,
            5,
        ]


def test_all_negative_group_is_uniform():
    # 4 negatives, G = 2: each kept with probability 1/2.
    group = [neg() for _ in range(4)]
    counts = Counter()
    for seed in range(2000):
        kept = roc_downsample(group, 2, "paper", min_positive=1, min_negative=1, rng=seed)
        assert len(kept) == 2
        counts.update(kept)
    for i in range(4):
        assert counts[i] / 2000 == pytest.approx(0.5, abs=0.04)


@pytest.mark.parametrize("mode", ["paper", "release"])
def test_fewer_positives_than_minimum_keeps_them_all(mode):
    # 1 positive (noisy, p 2.0) among 8, G = 4, min_positive = 2: the ratio gives it
    # 4 - ceil(4 * 7 / 8) = 0 slots; the minimum lifts it to min(2, 1) = 1.
    group = [neg() for _ in range(7)]
    group.insert(5, pos(["error"], 0))
    for seed in range(20):
        kept = roc_downsample(group, 4, mode, rng=seed)
        assert 5 in kept and len(kept) == 4


def test_no_tool_calls_positive_ranks_between_clean_and_noisy():
    # p: clean 0.0, no-tool 0.5, noisy 1.0: weights inf, 2, 1; with 2 positive slots the clean
    # one is always first, the no-tool one second in 2 draws of 3
    group = [pos(["ok"]), pos([]), pos(["error"]), neg(), neg(), neg(), neg(), neg()]
    second = Counter()
    for seed in range(300):
        kept = [i for i in roc_downsample(group, 4, "paper", rng=seed) if i < 3]
        assert kept[0] == 0 and len(kept) == 2
        second[kept[1]] += 1
    assert second[1] / 300 == pytest.approx(2 / 3, abs=0.08)


def test_group_not_larger_than_group_size_is_kept_whole():
    group = [pos(["error"]), neg(), pos([])]
    assert roc_downsample(group, 4, "paper", rng=0) == [0, 1, 2]
    assert roc_downsample(group, 3, "release", min_positive=1, min_negative=1, rng=0) == [0, 1, 2]
    # the release does not train on a group smaller than G
    assert roc_downsample(group, 4, "release", min_positive=1, min_negative=1) == []
    assert roc_downsample([], 4, rng=0) == []


def test_deterministic_for_seed_numpy_and_torch_generators():
    group = _mixed_group()
    assert roc_downsample(group, 4, rng=7) == roc_downsample(group, 4, rng=7)
    a = roc_downsample(group, 4, rng=np.random.default_rng(7))
    b = roc_downsample(group, 4, rng=np.random.default_rng(7))
    assert a == b
    ta = roc_downsample(group, 4, rng=torch.Generator().manual_seed(3))
    tb = roc_downsample(group, 4, rng=torch.Generator().manual_seed(3))
    assert ta == tb
    # different seeds do explore different subsets
    assert len({tuple(roc_downsample(group, 4, rng=s)) for s in range(30)}) > 1


def test_bad_arguments():
    group = _mixed_group()
    with pytest.raises(ValueError, match="unknown RoC mode"):
        roc_downsample(group, 4, mode="greedy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds"):
        roc_downsample(group, 3)  # default minimums 2 + 2 > 3
    with pytest.raises(TypeError):
        roc_downsample(group, 4, rng="seed")


def test_tool_error_share_inside_correct_trajectories():
    # positives' calls: [ok, ok] [ok, error] [] [error, timeout] [ok, ok, ok, parse_error]
    # -> 4 errored of 10; negatives' calls are ignored by default.
    group = _mixed_group()
    assert tool_error_share(group) == pytest.approx(0.4)
    # all: + [error], [ok], [sandbox_error] -> 6 of 13
    assert tool_error_share(group, positive_only=False) == pytest.approx(6 / 13)
    assert tool_error_share([pos([]), neg(["error"])]) is None
