"""The eval results file: what is still to run, and answer-pair checks.

- `pending_items`: the (problem, sample) items of a label not yet in results.jsonl (resume rule:
  a finished (label, benchmark, id, sample) is never run again), plus problem id -> benchmark.
  A row of results.jsonl is the graded trajectory record (`rstar2cli.rollout.jobs.GradedSink`)
  plus `label`, `benchmark` and `num_response_tokens`.
- `check_answer_pairs`: equivalence of answer pairs (for maj@k) through the grader's bounded
  worker processes, so a pathological answer cannot stall the report.

What it does not do: run models or print. Tested through tests/cli/test_eval_grade_only.py and
tests/integration/test_eval_cli.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_FLUSH_EVERY = 16
_FLUSH_EVERY_S = 2.0


def pending_items(
    benchmarks: list[Any], n: int, results: Path, label: str
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Items still to run for `label`, and problem id -> benchmark name."""
    from rstar2cli.fileio import read_jsonl_if_exists
    from rstar2cli.rollout.jobs import make_items

    done = {
        (r.get("benchmark"), str(r.get("id")), int(r.get("sample", 0)))
        for r in read_jsonl_if_exists(results)
        if r.get("label") == label
    }

    items: list[dict[str, Any]] = []
    owner: dict[str, str] = {}
    for bench in benchmarks:
        owner.update((p["id"], bench.name) for p in bench.problems)
        finished = {(pid, s) for b, pid, s in done if b == bench.name}
        items += make_items(bench.problems, n, finished)
    return items, owner


def check_answer_pairs(pairs: set[tuple[str, str]]) -> dict[tuple[str, str], bool]:
    """Is answer a equivalent to answer b, for each pair; hung or crashed checks say no."""
    if not pairs:
        return {}
    from rstar2cli.reward.grader import Grader

    ordered = sorted(pairs)
    with Grader(num_workers=1, strict=False, zero_truncated=False) as grader:
        results = grader.grade_batch([("\\boxed{" + a + "}", b) for a, b in ordered])
    return {pair: r.correct for pair, r in zip(ordered, results, strict=True)}
