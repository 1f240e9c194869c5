"""From an eval `results.jsonl` to summaries, tables and the comparison plot.

`group_rows` sorts result rows into (label, benchmark) -> problems -> samples (in sample order);
`majority_pairs` lists the answer pairs whose equivalence majority voting needs, so the command
can check them in one bounded batch with the grader; `summarize_all` turns everything into
`BenchmarkSummary`s (rstar2cli.reward.metrics). `render_tables` builds one rich table per
benchmark (metrics as rows, labels as columns) and `plot_accuracy` writes avg@n per benchmark per
label as a grouped bar chart (matplotlib, Agg), so checkpoints evaluated into one `--out`
(stages, say) sit side by side. `print_plan` says what a run is about to do; `report` is the end of
a run: every label of results.jsonl summarised into summary.json (`results.write_summary`), the
tables printed and eval.png written.

What it does not do: run models, grade responses (answer pairs go to `results.check_answer_pairs`)
or read and merge summary.json itself (`rstar2cli.eval.results`).
Tested in tests/cli/test_eval_grade_only.py (report from hand-written rows) and
tests/integration/test_eval_cli.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rstar2cli.records import GradedRecord
from rstar2cli.reward.metrics import BenchmarkSummary, Sample, summarize

Key = tuple[str, str]  # (label, benchmark)


def sample_of(row: GradedRecord) -> Sample:
    return Sample(
        correct=bool(row.get("correct")),
        extracted=row.get("extracted"),
        num_response_tokens=int(row.get("num_response_tokens", len(row.get("response_ids") or []))),
        tool_statuses=[str(c.get("status")) for c in row.get("tool_calls") or []],
        finish_reason=str(row.get("finish_reason")),
    )


def group_rows(rows: list[GradedRecord]) -> dict[Key, list[list[Sample]]]:
    """(label, benchmark) -> per problem (in first-seen order) its samples sorted by index.

    A (label, benchmark, id, sample) seen twice counts once (the first row wins)."""
    table: dict[Key, dict[str, dict[int, Sample]]] = {}
    for row in rows:
        key = (str(row.get("label")), str(row.get("benchmark")))
        per_problem = table.setdefault(key, {}).setdefault(str(row.get("id")), {})
        per_problem.setdefault(int(row.get("sample", 0)), sample_of(row))
    return {
        key: [[samples[s] for s in sorted(samples)] for samples in problems.values()]
        for key, problems in table.items()
    }


def majority_pairs(grouped: dict[Key, list[list[Sample]]]) -> set[tuple[str, str]]:
    """Pairs (earlier answer, later answer) of distinct answers within each problem."""
    pairs: set[tuple[str, str]] = set()
    for problems in grouped.values():
        for samples in problems:
            seen = list(dict.fromkeys(s.extracted for s in samples if s.extracted is not None))
            for i, a in enumerate(seen):
                for b in seen[i + 1 :]:
                    pairs.add((a, b))
    return pairs


def lookup_equivalence(verdicts: dict[tuple[str, str], bool]) -> Callable[[str, str], bool]:
    """An `equivalent(a, b)` answering from checked pairs (either order); identical strings match."""

    def equivalent(a: str, b: str) -> bool:
        return a == b or verdicts.get((a, b), False) or verdicts.get((b, a), False)

    return equivalent


def summarize_all(
    grouped: dict[Key, list[list[Sample]]], ks: list[int], equivalent: Callable[[str, str], bool]
) -> dict[Key, BenchmarkSummary]:
    return {key: summarize(problems, ks, equivalent) for key, problems in grouped.items()}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def render_tables(summaries: dict[Key, BenchmarkSummary], labels: list[str]) -> list[Any]:
    """One rich Table per benchmark; accuracy figures in percent."""
    from rich.table import Table

    tables = []
    for bench in dict.fromkeys(b for _, b in summaries):
        cols = [lab for lab in labels if (lab, bench) in summaries]
        table = Table(title=f"{bench}")
        table.add_column("metric")
        for lab in cols:
            table.add_column(lab, justify="right")
        rows = _table_rows([summaries[(lab, bench)] for lab in cols])
        for name, values in rows:
            table.add_row(name, *values)
        tables.append(table)
    return tables


def _table_rows(sums: list[BenchmarkSummary]) -> list[tuple[str, list[str]]]:
    rows = [
        ("problems / trajectories", [f"{s.num_problems} / {s.num_trajectories}" for s in sums]),
        ("avg@n (mean pass@1, %)", [_pct(s.avg_at_n) for s in sums]),
    ]
    for name in dict.fromkeys(k for s in sums for k in s.pass_at_k):
        rows.append((f"{name} (%)", [_pct(s.pass_at_k.get(name)) for s in sums]))
    for name in dict.fromkeys(k for s in sums for k in s.maj_at_k):
        rows.append((f"{name} (%)", [_pct(s.maj_at_k.get(name)) for s in sums]))
    rows += [
        ("mean response tokens", [f"{s.mean_response_tokens:.0f}" for s in sums]),
        ("tool calls / trajectory", [f"{s.tool_calls_per_trajectory:.2f}" for s in sums]),
        ("tool error rate (%)", [_pct(s.tool_error_rate) for s in sums]),
    ]
    for status in sorted({st for s in sums for st in s.tool_error_rate_by_status}):
        rows.append(
            (f"  {status} (%)", [_pct(s.tool_error_rate_by_status.get(status, 0.0)) for s in sums])
        )
    rows.append(
        (
            "finish reasons",
            [", ".join(f"{r} {c}" for r, c in s.finish_reasons.items()) for s in sums],
        )
    )
    return rows


def plot_accuracy(summaries: dict[Key, BenchmarkSummary], labels: list[str], path: Path) -> None:
    """Grouped bars: avg@n (%) per benchmark, one bar per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = list(dict.fromkeys(b for _, b in summaries))
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(benches) + 1.5), 3.6))
    for i, lab in enumerate(labels):
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(benches))]
        ys = [100 * summaries[(lab, b)].avg_at_n if (lab, b) in summaries else 0.0 for b in benches]
        bars = ax.bar(xs, ys, width=width, label=lab)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(benches)), benches)
    ax.set_ylabel("avg@n pass@1 (%)")
    ax.set_ylim(0, 105)
    ax.set_title("accuracy per benchmark")
    ax.legend(fontsize=8)
    fig.tight_layout()
    from rstar2cli.fileio import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


PLOT = "eval.png"


def print_plan(*, console: Any, plan: Any, settings: dict[str, Any], num_pending: int) -> None:
    """One line of settings, one per benchmark, and how many trajectories are left to run."""
    from rich.markup import escape

    from rstar2cli.eval.results import RESULTS

    where = (
        f"model {plan.model} ({settings['engines']} x {settings['engine']})"
        if plan.model
        else f"endpoint {', '.join(settings['endpoint'])}"
    )
    console.print(
        f"eval [bold]{escape(settings['label'])}[/]: {escape(where)}; "
        f"{settings['samples']} samples/problem, temperature {settings['temperature']}, "
        f"max {settings['max_turns']} turns, {settings['max_response_tokens']} response tokens, "
        f"k={settings['k']}, seed {settings['seed']}; "
        f"sandbox {', '.join(plan.sandbox_urls) or 'in-process'}"
    )
    for b in plan.benchmarks:
        skipped = (
            f" ({b.num_skipped} unusable rows skipped; first: {b.first_skip})"
            if b.num_skipped
            else ""
        )
        console.print(f"  {b.name}: {len(b.problems)} problems from {b.source}{skipped}")
    console.print(f"  {num_pending} trajectories to run -> {plan.out / RESULTS}")


def report(*, console: Any, out: Path, label: str, settings: dict[str, Any], ks: list[int]) -> None:
    """Summarise every label of OUT/results.jsonl into summary.json (`label` with `settings`),
    print one table per benchmark and write eval.png."""
    from rstar2cli.errors import UserError
    from rstar2cli.eval.results import RESULTS, SUMMARY, check_answer_pairs, write_summary
    from rstar2cli.records import read_graded

    rows = read_graded(out / RESULTS)
    if not rows:
        raise UserError(f"no results in {out / RESULTS}")
    grouped = group_rows(rows)
    labels = list(dict.fromkeys(lab for lab, _ in grouped))
    verdicts = check_answer_pairs(majority_pairs(grouped))
    summaries = summarize_all(grouped=grouped, ks=ks, equivalent=lookup_equivalence(verdicts))
    write_summary(out=out, label=label, settings=settings, summaries=summaries)
    for table in render_tables(summaries, labels):
        console.print(table)
    plot_accuracy(summaries=summaries, labels=labels, path=out / PLOT)
    console.print(f"wrote {out / SUMMARY} and {out / PLOT}")
