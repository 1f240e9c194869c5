"""Online length prediction from group siblings: the samples of one prompt predict each other.

The rollouts of one prompt (a GRPO group) share its difficulty, so how long the first ones ran
says how long the rest will. `SiblingLengths` keeps, per group, each started sibling's response
length: final for the finished, so far (a lower bound) for the rest.

The estimate: a group's lengths are taken as log-normal, log L ~ N(mu, sigma). The Kaplan-Meier
product-limit estimator turns the group's finished and unfinished lengths into the share of
siblings that finished below each finished length (an unfinished sibling counts as "at least
this long": dropping it would bias the estimate short, since the first to finish are the
shortest); each finished length x at share q is a point (probit(q), log x) that should lie on
the line mu + sigma * probit(q). With three or more finished points the group's own line is
fitted; with fewer, its mu is fitted with sigma pooled over the groups that have a line (a prior
of `PRIOR_SIGMA` before any has). A group none of whose samples has finished counts its longest
as the next to finish (share 1 / (n + 1)), a floor that rises while they run. `predict(key)` is
the median of that distribution above `key`'s own length so far, capped at its budget.

What it does not do: read tokens or prompts (lengths only), learn across steps, or decide
anything (the scheduler ranks and places trajectories by these numbers). Pure and synchronous.
Tested in tests/unit/test_predict.py.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from statistics import NormalDist

# NOTE: the within-prompt spread of log lengths assumed until some group has three finished
# samples to measure it; after that, the median of the measured groups' spreads is used.
PRIOR_SIGMA = 0.5
_NORMAL = NormalDist()


class SiblingLengths:
    """Response lengths of started trajectories, by group; estimates from the siblings."""

    def __init__(self) -> None:
        self._group: dict[Hashable, Hashable] = {}
        self._members: dict[Hashable, list[Hashable]] = {}
        self._length: dict[Hashable, int] = {}  # response tokens: so far, or final when done
        self._done: set[Hashable] = set()
        self._fit: dict[Hashable, tuple[float, float, float | None] | None] = {}  # see _fit_line
        self._sigmas: dict[Hashable, float] = {}  # groups with their own line -> its sigma
        self._pooled_sigma = PRIOR_SIGMA
        self._median: dict[Hashable, float | None] = {}  # predict_group(group), cached
        # predict(key), cached with what it was computed from: its group's updates, the pooled
        # sigma's changes, and the key's own length and cap
        self._version: dict[Hashable, int] = {}
        self._pooled_version = 0
        self._memo: dict[Hashable, tuple[int, int, int, float, float | None]] = {}

    def add(self, key: Hashable, group: Hashable) -> None:
        """`key` belongs to `group`; it counts once it has started (`update`)."""
        self._group[key] = group
        self._members.setdefault(group, [])

    def update(self, key: Hashable, response_tokens: int, done: bool = False) -> None:
        """`key` has produced `response_tokens` so far (all of them, when `done`)."""
        group = self._group[key]
        if key not in self._length:
            self._members[group].append(key)
        self._length[key] = response_tokens
        self._fit.pop(group, None)
        self._median.pop(group, None)
        self._version[group] = self._version.get(group, 0) + 1
        if done:
            self._done.add(key)
            line = self._line(group)
            if line is not None and line[2] is not None:
                self._sigmas[group] = line[2]
                ordered = sorted(self._sigmas.values())
                if ordered[len(ordered) // 2] != self._pooled_sigma:
                    self._pooled_sigma = ordered[len(ordered) // 2]
                    self._median.clear()
                    self._pooled_version += 1

    def num_started(self, group: Hashable) -> int:
        return len(self._members.get(group, ()))

    def predict(self, key: Hashable, max_tokens: float = math.inf) -> float | None:
        """`key`'s predicted final response length (at most `max_tokens`); None: none of its
        group has produced a token yet."""
        group, length = self._group[key], self._length.get(key, 0)
        stamp = (self._version.get(group, 0), self._pooled_version, length, max_tokens)
        memo = self._memo.get(key)
        if memo is None or memo[:4] != stamp:
            memo = (*stamp, self.predict_group(group, length, max_tokens))
            self._memo[key] = memo
        return memo[4]

    def group_median(self, group: Hashable) -> float | None:
        """`predict_group(group)`, cached until the group or the pooled sigma changes."""
        if group not in self._median:
            self._median[group] = self.predict_group(group)
        return self._median[group]

    def predict_group(
        self, group: Hashable, at_least: int = 0, max_tokens: float = math.inf
    ) -> float | None:
        """The median length of `group`'s trajectories that run past `at_least` tokens; None
        when none of the group has produced a token yet."""
        line = self._line(group)
        if line is None:
            return None
        mean_y, mean_z, own_sigma = line
        sigma = own_sigma if own_sigma is not None else self._pooled_sigma
        mu = mean_y - sigma * mean_z
        below = _NORMAL.cdf((math.log(max(at_least, 1)) - mu) / sigma)
        median = math.exp(mu + sigma * _NORMAL.inv_cdf(min(below + (1 - below) / 2, 1 - 1e-9)))
        return max(min(median, max_tokens), at_least)

    def _line(self, group: Hashable) -> tuple[float, float, float | None] | None:
        if group not in self._fit:
            self._fit[group] = self._fit_line(group)
        return self._fit[group]

    def _fit_line(self, group: Hashable) -> tuple[float, float, float | None] | None:
        """The group's points' mean (log length, probit) and, with three or more finished, the
        fitted slope sigma (None: use the pooled one); None: no sibling has produced anything."""
        members = self._members.get(group, ())
        # finished before unfinished at a tie, as the product-limit estimator wants
        obs = sorted(
            (max(self._length[k], 1), k not in self._done)
            for k in members
            if self._length[k] > 0 or k in self._done
        )
        if not obs:
            return None
        points = _probit_points(obs)
        if not points:  # none finished: the longest so far is taken as the next to finish
            return math.log(obs[-1][0]), _NORMAL.inv_cdf(1 / (len(obs) + 1)), None
        mean_z = sum(z for z, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        szz = sum((z - mean_z) ** 2 for z, _ in points)
        szy = sum((z - mean_z) * (y - mean_y) for z, y in points)
        own = szy / szz if len(points) >= 3 and szz > 0 and szy > 0 else None
        return mean_y, mean_z, own


def _probit_points(obs: list[tuple[int, bool]]) -> list[tuple[float, float]]:
    """(probit of the share finished below it, log length) for each finished length, the share
    from the product-limit estimator over (length, unfinished) sorted by length (the midpoint of
    the estimator's step at that length)."""
    at_risk, surviving, points = len(obs), 1.0, []
    for length, unfinished in obs:
        if not unfinished:
            after = surviving * (1.0 - 1.0 / at_risk)
            share = 1.0 - (surviving + after) / 2
            points.append((_NORMAL.inv_cdf(share), math.log(length)))
            surviving = after
        at_risk -= 1
    return points
