"""Resample-on-Correct: pick which G of the 2G rollouts of a problem are trained on.

GRPO-RoC (rStar2-Agent, arXiv 2508.20722, section 3.2) oversamples 2G rollouts per problem and
down-samples them to G before computing advantages. The two classes are treated asymmetrically:

- negatives (reward 0) are kept uniformly at random, so the many ways of failing stay represented;
- positives (reward > 0) are filtered by a penalty p_total = p_err + p_format, so successes that
  stumbled through failed tool calls or a messy answer format are trained on less often.

Two modes:
- `paper`: negatives uniformly at random; positives drawn without replacement with probability
  proportional to 1 / p_total (p_err from the structured tool statuses); quotas ceil / floor.
- `release`: the public release's selection (microsoft/rStar, rstar2_agent/down_sample/roc.py),
  quirks included: the penalty is read from the response text (a tool response counts as an
  error when it contains the word "error", any case; p_format counts the assistant turns opened
  inside the response, so a one-turn answer gets 1), both classes are sorted by it (ties in
  group order) and cut at round(class share x G) (round half to even), lifted to the minimums;
  a group smaller than G is not trained on. No randomness. Where the release would stop on an assertion (counts
  that do not add up to G, for a group of another size than 2G), the group keeps what the counts
  give. tests/unit/test_roc.py compares it with a separate reading of the release on random
  groups.

Also here: the penalties themselves, and equal-reward group dropping (a group whose rewards are all
equal has zero advantages, hence no gradient, so it is dropped before the update).

What it deliberately does not do: touch tensors, grade answers or read files. Everything is a pure
function of small dataclasses and a random generator, and returns indices the caller uses to
gather its tensors. Tested in tests/unit/test_roc.py (hand-made groups, seeded statistics).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rstar2cli import protocol as P
from rstar2cli.records import GradedRecord

RocMode = Literal["paper", "release"]
ROC_MODES: tuple[str, ...] = ("paper", "release")

# NOTE: p_err when a trajectory made no tool call. The paper sets it to 0.5 so that a correct
# answer reached without the tool is neither as clean as a fully successful tool user nor as bad
# as one whose every call failed.
P_ERR_NO_TOOL_CALLS = 0.5


@dataclass(frozen=True)
class RolloutSummary:
    """What RoC needs to know about one graded trajectory.

    `tool_statuses` holds the structured status of every tool call in order ("ok", "error",
    "timeout", "memory", "output_limit", "parse_error", "sandbox_error", ...).
    """

    reward: float
    tool_statuses: Sequence[str] = ()
    num_answer_tags: int = 0
    num_turns: int = 1
    text: str = ""  # the whole response, tool outputs included (the `release` mode reads it)

    def __post_init__(self) -> None:
        # Accept a list for convenience, store a tuple so the summary stays hashable and frozen.
        object.__setattr__(self, "tool_statuses", tuple(self.tool_statuses))
        if self.num_answer_tags < 0 or self.num_turns < 0:
            raise ValueError(
                f"num_answer_tags and num_turns must be >= 0, got "
                f"{self.num_answer_tags} and {self.num_turns}"
            )

    @property
    def is_positive(self) -> bool:
        # Rewards are binary in the paper (1 correct, 0 otherwise); anything above 0 is a success.
        return self.reward > 0.0

    @classmethod
    def from_record(cls, record: GradedRecord) -> RolloutSummary:
        """Build from a graded trajectory record (`rstar2cli.records`); needs "reward"."""
        if record.get("reward") is None:
            raise ValueError(f"trajectory {record.get('id')!r} has no reward: grade it first")
        return cls(
            reward=float(record["reward"]),
            tool_statuses=tuple(str(call["status"]) for call in record.get("tool_calls", [])),
            num_answer_tags=int(record.get("num_answer_tags", 0)),
            num_turns=int(record.get("num_turns", 1)),
            text=str(record.get("text", "")),
        )


def is_errored(status: str) -> bool:
    """An errored tool call is any status other than "ok" (contract: timeouts, parse errors,
    sandbox errors all count; in rl-stage a trajectory with a sandbox error never reaches RoC:
    rstar2cli/rl/selection.py leaves it out). Only the structured status is read: a call that
    printed the word "error" to stdout but ran fine has status "ok" and is clean."""
    return status != "ok"


def tool_error_rate(tool_statuses: Sequence[str]) -> float:
    """p_err = errored tool calls / tool calls, or 0.5 when there were no tool calls."""
    if len(tool_statuses) == 0:
        return P_ERR_NO_TOOL_CALLS
    num_errored = sum(1 for status in tool_statuses if is_errored(status))
    return num_errored / len(tool_statuses)


def format_penalty(num_answer_tags: int, num_turns: int) -> float:
    """p_format = 1 without an <answer> tag, else min(1, (num_answer_tags - 1) / num_turns).

    One answer is clean (0); repeated answers are penalised relative to the number of turns.
    """
    if num_answer_tags <= 0:
        return 1.0
    # NOTE: a trajectory with an answer has at least one turn; max() only guards bad input.
    return min(1.0, (num_answer_tags - 1) / max(num_turns, 1))


def total_penalty(summary: RolloutSummary) -> float:
    """p_total = p_err + p_format, in [0, 2]; lower is cleaner."""
    return tool_error_rate(summary.tool_statuses) + format_penalty(
        summary.num_answer_tags, summary.num_turns
    )


def is_equal_reward_group(rewards: Sequence[float]) -> bool:
    """True when every reward of the group is the same (all correct or all wrong)."""
    return len(rewards) == 0 or min(rewards) == max(rewards)


def drop_equal_reward_groups(group_rewards: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the groups to keep: those whose rewards are not all equal.

    Such groups have zero advantage for every member (r == mean), so they only add compute.
    """
    return [i for i, rewards in enumerate(group_rewards) if not is_equal_reward_group(rewards)]


def as_numpy_rng(rng: np.random.Generator | int | Any) -> np.random.Generator:
    """A numpy Generator from a Generator, an int seed, or a torch.Generator.

    A torch.Generator is advanced by one draw, which seeds the numpy generator: the same torch
    generator state always gives the same selection.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
    if type(rng).__module__.startswith("torch"):
        import torch

        seed = int(torch.randint(0, 2**62, (1,), generator=rng).item())
        return np.random.default_rng(seed)
    raise TypeError(f"rng must be a numpy Generator, an int seed or a torch.Generator, not {rng!r}")


def class_quota(
    num_positive: int,
    num_negative: int,
    group_size: int,
    min_positive: int = 2,
    min_negative: int = 2,
) -> tuple[int, int]:
    """How many positives and negatives to keep when down-sampling to `group_size`.

    Needs num_positive + num_negative > group_size (the caller keeps everything otherwise).
    Start from the class ratio of the oversampled group, then lift each class to its minimum
    (or to all it has, when it has fewer).

    Rounding: the negative share G * N / n is rounded up and positives get the rest (so the
    positive share is rounded down). Positives are the class RoC is meant to be selective about;
    giving the fractional slot to the uniformly sampled negatives keeps the positive filter at
    least as strict as the exact ratio, and never hands a positive slot to a noisy success just
    because of rounding. Example: 5 positives of 32, G=16 -> 2.5 -> 2 positives, 14 negatives.
    """
    num_total = num_positive + num_negative
    if num_total <= group_size:
        raise ValueError(f"class_quota needs more than {group_size} rollouts, got {num_total}")
    num_keep_neg = -(-group_size * num_negative // num_total)  # ceil without floats
    num_keep_pos = group_size - num_keep_neg
    # Lift each class to its minimum; min_positive + min_negative <= group_size guarantees that
    # lifting one never pushes the other below its own minimum.
    num_keep_pos = max(num_keep_pos, min(min_positive, num_positive))
    num_keep_neg = max(group_size - num_keep_pos, min(min_negative, num_negative))
    num_keep_pos = group_size - num_keep_neg
    # Invariants: 0 <= keep <= available for both classes, and they sum to group_size.
    assert 0 <= num_keep_pos <= num_positive and 0 <= num_keep_neg <= num_negative
    return num_keep_pos, num_keep_neg


def sample_inverse_penalty(
    penalties: Sequence[float], num_keep: int, rng: np.random.Generator
) -> list[int]:
    """Draw `num_keep` positions without replacement, each draw with probability proportional
    to 1 / penalty among those not drawn yet (the `paper` mode).

    NOTE: p_total = 0 (no failed call, one answer) has an infinite weight 1/0. Taken literally as
    that limit, zero-penalty rollouts are drawn first (uniformly among themselves, their weights
    being equal), and only the slots left over go to the others in proportion to 1 / p_total.
    """
    order = rng.permutation(len(penalties))
    clean = [int(i) for i in order if penalties[i] == 0.0]
    noisy = [int(i) for i in order if penalties[i] != 0.0]
    if num_keep <= len(clean):
        return clean[:num_keep]
    chosen = list(clean)
    weights = [1.0 / penalties[i] for i in noisy]
    for _ in range(num_keep - len(chosen)):
        cumulative = np.cumsum(weights)
        pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        pick = min(pick, len(noisy) - 1)  # guards float round-off at the top end
        chosen.append(noisy.pop(pick))
        weights.pop(pick)
    return chosen


# the release's readings of a response text, tool outputs included (non-greedy, across lines)
_TOOL_RESPONSE = re.compile(
    re.escape(P.TOOL_RESPONSE_OPEN) + ".*?" + re.escape(P.TOOL_RESPONSE_CLOSE), re.DOTALL
)
_ANSWER = re.compile(re.escape(P.ANSWER_OPEN) + ".*?" + re.escape(P.ANSWER_CLOSE), re.DOTALL)
_ASSISTANT_TURN = re.compile(
    re.escape(P.IM_START + "assistant") + ".*?" + re.escape(P.IM_END), re.DOTALL
)


def release_penalty(text: str) -> float:
    """p_err + p_format as the public release reads them from a response text (`release` mode)."""
    responses = _TOOL_RESPONSE.findall(text)
    p_err = P_ERR_NO_TOOL_CALLS
    if responses:
        p_err = sum("error" in r.lower() for r in responses) / len(responses)
    num_closed = len(_ANSWER.findall(text))
    tags = (text.count(P.ANSWER_OPEN), text.count(P.ANSWER_CLOSE))
    num_turns = len(_ASSISTANT_TURN.findall(text))  # turns opened inside the response
    if 0 in tags or tags != (num_closed, num_closed) or num_turns == 0:
        return p_err + 1.0
    return p_err + min((num_closed - 1) / num_turns, 1.0)


def release_quota(
    num_positive: int, num_negative: int, group_size: int, min_positive: int, min_negative: int
) -> tuple[int, int]:
    """(positives, negatives) the release keeps of a group larger than `group_size`.

    NOTE: the release also keeps a whole group when both rounded shares are under their
    minimums; each rounding loses at most 1/2, so that needs min_positive + min_negative > G,
    which roc_downsample refuses: the branch is left out."""
    total = num_positive + num_negative
    keep_neg = round(num_negative * group_size / total)
    keep_pos = round(num_positive * group_size / total)
    if keep_neg <= min(min_negative, num_negative):
        keep_neg = min(min_negative, num_negative)
        keep_pos = group_size - keep_neg
    if keep_pos <= min(min_positive, num_positive):
        keep_pos = min(min_positive, num_positive)
        keep_neg = group_size - keep_pos
    return keep_pos, keep_neg


def release_selection(
    group: Sequence[RolloutSummary], group_size: int, min_positive: int, min_negative: int
) -> list[int]:
    """Indices (ascending) the release keeps: see the module docstring."""
    if len(group) < group_size:
        return []
    if len(group) == group_size:
        return list(range(len(group)))
    penalties = [release_penalty(s.text) for s in group]
    ranked = sorted(range(len(group)), key=lambda i: penalties[i])  # stable: ties in group order
    positives = [i for i in ranked if group[i].is_positive]
    negatives = [i for i in ranked if not group[i].is_positive]
    num_pos, num_neg = release_quota(
        num_positive=len(positives),
        num_negative=len(negatives),
        group_size=group_size,
        min_positive=min_positive,
        min_negative=min_negative,
    )
    return sorted(positives[:num_pos] + negatives[:num_neg])


def roc_downsample(
    group: Sequence[RolloutSummary],
    group_size: int,
    mode: RocMode = "paper",
    min_positive: int = 2,
    min_negative: int = 2,
    rng: np.random.Generator | int | Any = 0,
) -> list[int]:
    """Indices (ascending) of the rollouts of one problem to keep.

    `paper`: a group of `group_size` or fewer is kept whole; otherwise negatives are sampled
    uniformly and positives with probability ~ 1/p_total, with counts from `class_quota`.
    Deterministic given `rng` (a numpy Generator, a torch.Generator or an int seed).
    `release`: `release_selection` (see the module docstring; no randomness).
    """
    if mode not in ROC_MODES:
        raise ValueError(f"unknown RoC mode {mode!r}; expected one of {ROC_MODES}")
    if group_size < 1 or min_positive < 0 or min_negative < 0:
        raise ValueError("group_size must be >= 1 and the minimums >= 0")
    if min_positive + min_negative > group_size:
        raise ValueError(
            f"min_positive + min_negative ({min_positive} + {min_negative}) exceeds "
            f"group_size {group_size}"
        )
    if mode == "release":
        return release_selection(group, group_size, min_positive, min_negative)
    if len(group) <= group_size:
        return list(range(len(group)))
    gen = as_numpy_rng(rng)
    positives = [i for i, s in enumerate(group) if s.is_positive]
    negatives = [i for i, s in enumerate(group) if not s.is_positive]
    num_keep_pos, num_keep_neg = class_quota(
        num_positive=len(positives),
        num_negative=len(negatives),
        group_size=group_size,
        min_positive=min_positive,
        min_negative=min_negative,
    )
    kept_neg = gen.choice(len(negatives), size=num_keep_neg, replace=False).tolist()
    penalties = [total_penalty(group[i]) for i in positives]
    kept_pos = sample_inverse_penalty(penalties, num_keep_pos, gen)
    kept = [negatives[j] for j in kept_neg] + [positives[j] for j in kept_pos]
    return sorted(kept)


def tool_error_share(
    summaries: Iterable[RolloutSummary], positive_only: bool = True
) -> float | None:
    """Errored tool calls / tool calls pooled over the (correct, by default) trajectories.

    The quantity the paper tracks (its Figure 4: error share inside correct trajectories); None
    when those trajectories made no tool call at all.
    """
    statuses = [
        status
        for s in summaries
        if s.is_positive or not positive_only
        for status in s.tool_statuses
    ]
    if not statuses:
        return None
    return sum(1 for status in statuses if is_errored(status)) / len(statuses)
