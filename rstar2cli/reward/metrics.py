"""Evaluation metrics over graded trajectories: pure functions, no I/O, no grading.

- `avg_at_n`: mean over problems of (correct samples / samples): the paper's "avg@16 pass@1".
- `pass_at_k`: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k) per problem,
  averaged over problems. Problems with fewer than k samples are left out (the estimator needs
  n >= k); `pass_at_k` returns None when no problem has k samples.
- `maj_at_k`: majority vote over extracted answers. Samples are taken in order in disjoint blocks
  of k (n // k blocks per problem, the rest unused); in each block answers are grouped by an
  equivalence test the caller supplies, the largest group wins (ties: the group whose first
  member came first), and the block counts as correct when the winning group's answer is correct.
  Samples without an answer do not vote; a block where nobody answered is wrong.
- `summarize`: the table row of one benchmark: the above plus mean response tokens, tool calls per
  trajectory, tool error rate per status, finish reasons.

What it does not do: decide correctness or equivalence (the grader does; `maj_at_k` takes the
equivalence as a function so the command can answer it from a batch of bounded checks).
Tested in tests/unit/test_metrics.py with hand-worked cases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from math import comb
from typing import Any


@dataclass
class Sample:
    """One graded trajectory, as the metrics see it."""

    correct: bool
    extracted: str | None = None
    num_response_tokens: int = 0
    tool_statuses: list[str] = field(default_factory=list)
    finish_reason: str = "answer"


def avg_at_n(correct_by_problem: list[list[bool]]) -> float:
    """Mean over problems of the fraction of correct samples (avg@n = mean pass@1)."""
    rates = [sum(c) / len(c) for c in correct_by_problem if c]
    return sum(rates) / len(rates) if rates else 0.0


def pass_at_k_one(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of one problem: P(at least one of k draws without replacement is right)."""
    if k < 1 or k > num_samples:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={num_samples}")
    if num_samples - num_correct < k:
        return 1.0  # every k-subset holds a correct sample
    return 1.0 - comb(num_samples - num_correct, k) / comb(num_samples, k)


def pass_at_k(correct_by_problem: list[list[bool]], k: int) -> float | None:
    """Mean unbiased pass@k over the problems that have at least k samples."""
    values = [pass_at_k_one(len(c), sum(c), k) for c in correct_by_problem if len(c) >= k]
    return sum(values) / len(values) if values else None


def majority(
    answers: list[str | None], correct: list[bool], equivalent: Callable[[str, str], bool]
) -> bool:
    """Is the majority answer of one block correct? Groups answers with `equivalent`."""
    groups: list[list[int]] = []  # indices of samples, one list per equivalence class
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        for group in groups:
            if equivalent(answers[group[0]], answer):  # type: ignore[arg-type]
                group.append(i)
                break
        else:
            groups.append([i])
    if not groups:
        return False
    # NOTE: max() keeps the first of equal sizes, i.e. the class whose first vote came first.
    winner = max(groups, key=len)
    return correct[winner[0]]


def maj_at_k(
    samples_by_problem: list[list[Sample]], k: int, equivalent: Callable[[str, str], bool]
) -> float | None:
    """Mean over problems (with >= k samples) of the majority-vote accuracy of their k-blocks."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    values = []
    for samples in samples_by_problem:
        blocks = [samples[i : i + k] for i in range(0, len(samples) - k + 1, k)]
        if not blocks:
            continue
        hits = [
            majority([s.extracted for s in b], [s.correct for s in b], equivalent) for b in blocks
        ]
        values.append(sum(hits) / len(hits))
    return sum(values) / len(values) if values else None


def tool_error_rates(statuses: Iterable[str]) -> dict[str, float]:
    """Fraction of all tool calls per non-"ok" status (the tool statuses: `sandboxd.wire.STATUSES` and the agent loop's parse_error)."""
    counts = Counter(statuses)
    total = sum(counts.values())
    if not total:
        return {}
    return {s: n / total for s, n in sorted(counts.items()) if s != "ok"}


@dataclass
class BenchmarkSummary:
    num_problems: int
    num_trajectories: int
    avg_at_n: float
    pass_at_k: dict[str, float | None]  # "pass@4" -> value
    maj_at_k: dict[str, float | None]  # "maj@4" -> value
    mean_response_tokens: float
    tool_calls_per_trajectory: float
    tool_error_rate: float  # any status other than "ok"
    tool_error_rate_by_status: dict[str, float]
    finish_reasons: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    samples_by_problem: list[list[Sample]],
    ks: list[int],
    equivalent: Callable[[str, str], bool],
) -> BenchmarkSummary:
    """All metrics of one benchmark; `samples_by_problem` lists each problem's samples in order."""
    flat = [s for samples in samples_by_problem for s in samples]
    correct = [[s.correct for s in samples] for samples in samples_by_problem]
    statuses = [status for s in flat for status in s.tool_statuses]
    num = len(flat)
    return BenchmarkSummary(
        num_problems=sum(1 for samples in samples_by_problem if samples),
        num_trajectories=num,
        avg_at_n=avg_at_n(correct),
        pass_at_k={f"pass@{k}": pass_at_k(correct, k) for k in ks},
        maj_at_k={f"maj@{k}": maj_at_k(samples_by_problem, k, equivalent) for k in ks},
        mean_response_tokens=sum(s.num_response_tokens for s in flat) / num if num else 0.0,
        tool_calls_per_trajectory=len(statuses) / num if num else 0.0,
        tool_error_rate=sum(1 for s in statuses if s != "ok") / len(statuses) if statuses else 0.0,
        tool_error_rate_by_status=tool_error_rates(statuses),
        finish_reasons=dict(sorted(Counter(s.finish_reason for s in flat).items())),
    )
