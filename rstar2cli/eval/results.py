"""An eval `--out` folder's two files: results.jsonl (what is still to run) and summary.json.

- `pending_items`: the (problem, sample) items of a label not yet in results.jsonl (resume rule:
  a finished (label, benchmark, id, sample) is never run again), plus problem id -> benchmark.
  A row of results.jsonl is the graded trajectory record (`rstar2cli.records.GradedRecord`)
  with its eval keys `label`, `benchmark` and `num_response_tokens`.
- `check_answer_pairs`: equivalence of answer pairs (for maj@k) through the grader's bounded
  worker processes, so a pathological answer cannot stall the report.
- summary.json: `{"labels": {label: {"settings", "benchmarks"}}}`. `record_settings` writes a
  label's settings before anything runs (so an interrupted run's results are still checked
  against them: `earlier_settings`); `write_summary` merges this run's summaries with the labels
  already there, keeping each other label's recorded settings.

What it does not do: run models, compute metrics (`rstar2cli.eval.eval_report`) or print.
Tested through tests/cli/test_eval_grade_only.py and tests/integration/test_eval_cli.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2cli.reward.metrics import BenchmarkSummary

RESULTS = "results.jsonl"
SUMMARY = "summary.json"


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


def read_summary(out: Path) -> dict[str, Any]:
    """OUT/summary.json, or `{"labels": {}}` when it is missing or not a summary."""
    import json

    try:
        doc = json.loads((out / SUMMARY).read_text())
    except (OSError, json.JSONDecodeError):
        return {"labels": {}}
    return doc if isinstance(doc, dict) and isinstance(doc.get("labels"), dict) else {"labels": {}}


def earlier_settings(out: Path, label: str) -> dict[str, Any] | None:
    """The settings summary.json holds for `label` (None: a new label)."""
    import json

    try:
        doc = json.loads((out / SUMMARY).read_text())
        settings = doc["labels"][label]["settings"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
    return settings if isinstance(settings, dict) else None


def record_settings(out: Path, label: str, settings: dict[str, Any]) -> None:
    """The label's settings go into summary.json before anything runs, so an interrupted run's
    results are still checked against them on the next run."""
    from rstar2cli.fileio import write_json_atomic

    doc = read_summary(out)
    doc.setdefault("labels", {}).setdefault(label, {})["settings"] = settings
    write_json_atomic(out / SUMMARY, doc)


def write_summary(
    out: Path,
    label: str,
    settings: dict[str, Any],
    summaries: dict[tuple[str, str], BenchmarkSummary],
) -> None:
    """summary.json with every label it already names and every label of `summaries` ((label,
    benchmark) -> summary): `label` with `settings`, the others with their recorded settings."""
    from rstar2cli.fileio import write_json_atomic

    labels = dict.fromkeys(lab for lab, _ in summaries)
    earlier = read_summary(out)["labels"]
    doc: dict[str, Any] = {"labels": {}}
    for lab in dict.fromkeys([*earlier, *labels]):
        lab_settings = settings if lab == label else earlier.get(lab, {}).get("settings")
        doc["labels"][lab] = {
            "settings": lab_settings,
            "benchmarks": {b: s.to_dict() for (lb, b), s in summaries.items() if lb == lab},
        }
    write_json_atomic(out / SUMMARY, doc)
