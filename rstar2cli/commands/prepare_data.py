"""`rstar2 prepare-data`: a HF dataset id or a local jsonl/json/parquet -> a normalised parquet.

Reads the rows, hands them to `rstar2cli.data.dataset_normalize` (schema detection, answer extraction,
integer-only, dedupe, 8-gram decontamination), writes `id, question, answer, source, meta` and
every unusable row, with its reason, to a rejects jsonl: both atomically and only when the run
succeeds (a failed run writes nothing). `--synthetic NAME` writes a generated task set
(`rstar2cli.data.synthetic`: arith, or words with its reference solutions in `meta`) instead. Prints a summary table.
`datasets` and `pyarrow` are imported inside the function so `rstar2 --help` stays instant.
Tested in tests/cli/test_prepare_data.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import typer

from rstar2cli.errors import UserError
from rstar2cli.fileio import check_output_path, refuse_overwrite

_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
# options that only one of the two modes reads: given to the other, they would be ignored
_SOURCE_ONLY = (
    "config",
    "split",
    "question_field",
    "answer_field",
    "integer_only",
    "dedupe",
    "decontaminate",
    "rejects",
)
_SYNTHETIC_ONLY = ("num", "seed")


def prepare_data(
    ctx: typer.Context,
    source: str | None = typer.Option(
        None,
        "--source",
        metavar="ID|FILE",
        help="HF dataset id (with --config/--split) or a local .jsonl/.json/.parquet file.",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Output parquet (columns id, question, answer, source, meta)."
    ),
    config: str | None = typer.Option(None, "--config", help="HF dataset config name."),
    split: str = typer.Option("train", "--split", help="HF dataset split."),
    question_field: str | None = typer.Option(
        None, "--question-field", help="Field holding the question (dotted path allowed)."
    ),
    answer_field: str | None = typer.Option(
        None,
        "--answer-field",
        help="Field holding the answer (dotted path, e.g. reward_model.ground_truth); "
        "'#### n' and \\boxed{} inside it are extracted.",
    ),
    integer_only: bool = typer.Option(
        False, "--integer-only", help="Keep only integer answers (the paper's RL data rule)."
    ),
    dedupe: bool = typer.Option(
        True, "--dedupe/--no-dedupe", help="Drop repeated questions (normalised text)."
    ),
    decontaminate: list[str] | None = typer.Option(
        None,
        "--decontaminate",
        metavar="FILE|NAME",
        help="Eval set: a jsonl/json/parquet file or a benchmark name `rstar2 eval` knows "
        "(aime24, math500, ...); drop questions sharing an 8-gram with it. Repeatable.",
    ),
    synthetic: str | None = typer.Option(
        None,
        "--synthetic",
        metavar="NAME",
        help="Generate a synthetic task set (e.g. arith) instead of reading --source: the train "
        "split goes to --out, the test split beside it (x.parquet -> x.test.parquet).",
    ),
    num: int = typer.Option(
        1000, "--num", help="Synthetic: number of problems (train + test; ~20% test)."
    ),
    seed: int = typer.Option(0, "--seed", help="Synthetic: random seed."),
    rejects: Path | None = typer.Option(
        None,
        "--rejects",
        help="Rejects jsonl (row + reason). Default: next to --out, x.rejects.jsonl.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing outputs."),
) -> None:
    """Normalise a math dataset (or generate a synthetic one) into a parquet of problems."""
    from rich.console import Console

    from rstar2cli.data.dataset_normalize import NormalizeOptions

    console = Console(highlight=False)
    if (source is None) == (synthetic is None):
        raise UserError("give exactly one of --source or --synthetic")
    _refuse_other_modes_options(ctx, synthetic is not None)
    inputs = (source if source is not None and _is_local(source) else None, *(decontaminate or []))
    check_output_path(out, inputs, suffix=".parquet")
    if synthetic is not None:
        _write_synthetic(console=console, name=synthetic, num=num, seed=seed, out=out, force=force)
        return
    assert source is not None  # for the type checker; checked just above
    if _is_local(source) and not Path(source).is_file():
        raise UserError(f"file not found: {source}")
    rejects_path = rejects or out.with_name(out.stem + ".rejects.jsonl")
    _check_rejects_path(rejects_path, out, inputs)
    refuse_overwrite([out, rejects_path], force)
    options = NormalizeOptions(
        question_field=question_field,
        answer_field=answer_field,
        integer_only=integer_only,
        dedupe=dedupe,
        eval_grams=_eval_grams(decontaminate or []),
    )
    _prepare_source(
        console=console,
        source=source,
        config=config,
        split=split,
        out=out,
        rejects_path=rejects_path,
        options=options,
    )


def _refuse_other_modes_options(ctx: typer.Context, synthetic: bool) -> None:
    """One line naming the options on the command line that this mode (--synthetic or --source)
    would ignore."""
    names, mode, other = (
        (_SOURCE_ONLY, "--synthetic", "--source")
        if synthetic
        else (_SYNTHETIC_ONLY, "--source", "--synthetic")
    )
    params = {p.name: p for p in ctx.command.params}
    given = [
        "/".join([*params[n].opts, *getattr(params[n], "secondary_opts", [])])
        for n in names
        if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"
    ]
    if given:
        raise UserError(f"{', '.join(given)}: only with {other}; {mode} does not read it")


def _prepare_source(
    console: Any,
    source: str,
    config: str | None,
    split: str,
    out: Path,
    rejects_path: Path,
    options: Any,
) -> None:
    from rstar2cli.data import dataset_normalize as normalize
    from rstar2cli.fileio import write_jsonl_atomic

    rows, bad_lines, source_name = _load_source(source, config, split)
    result = _normalize_with_progress(console, rows, source_name, options)
    bad = [
        normalize.Reject(reason=normalize.INVALID_JSON, detail=why, row=None, line=line)
        for line, why in bad_lines
    ]
    all_rejects = bad + result.rejects
    num_read = len(rows) + len(bad_lines)
    _print_summary(
        console=console,
        source=source,
        num_read=num_read,
        num_kept=len(result.kept),
        rejects=all_rejects,
    )
    if not result.kept:
        counts = Counter(r.reason for r in all_rejects).most_common()
        why = ", ".join(f"{n} {reason}" for reason, n in counts)
        raise UserError(
            f"no usable rows in {source} ({num_read} read{': ' + why if why else ''}); "
            "nothing written"
        )
    # NOTE: both files are written only once the run has succeeded (each atomically), so a failed
    # run leaves no rejects file behind and never splits an earlier parquet from its rejects.
    _write_parquet(out, [p.to_row() for p in result.kept])
    write_jsonl_atomic(rejects_path, [r.to_row() for r in all_rejects])
    console.print(f"wrote {len(result.kept)} problems to {out}; rejects: {rejects_path}")


def _load_source(source: str, config: str | None, split: str) -> tuple[list[dict], list, str]:
    """(rows, bad jsonl lines, short source name). A path that exists or ends in a record suffix
    is a local file; anything else is a HF dataset id."""
    from rstar2cli.fileio import read_records

    path = Path(source)
    if _is_local(source):
        rows, bad_lines = read_records(path)
        return rows, bad_lines, path.stem
    from rstar2cli.data.loading import load_hub_dataset

    rows = load_hub_dataset(source, config, split, "--source")
    return rows, [], source.rsplit("/", 1)[-1]


def _is_local(source: str) -> bool:
    path = Path(source)
    return path.exists() or path.suffix.lower() in _LOCAL_SUFFIXES


def _eval_grams(sets: list[str]) -> set[tuple[str, ...]]:
    """8-grams of the eval questions: each set a local file or a benchmark `rstar2 eval` knows."""
    from rstar2cli.data import dataset_normalize as normalize
    from rstar2cli.eval.benchmarks import BENCHMARKS, load_benchmark
    from rstar2cli.fileio import read_records

    questions: list[str] = []
    for ref in sets:
        if ref in BENCHMARKS and not Path(ref).exists():
            questions += [p["question"] for p in load_benchmark(ref).problems]
            continue
        rows, _ = read_records(ref)
        found = [normalize.find_question(r)[0] for r in rows]
        questions += [q for q in found if q]
        if not any(found):
            raise UserError(f"--decontaminate {ref}: no questions found (problem/question/prompt)")
    return normalize.eval_ngrams(questions)


def _normalize_with_progress(console: Any, rows: list[dict], source_name: str, options: Any) -> Any:
    from rstar2cli.data import dataset_normalize as normalize
    from rstar2cli.ui import progress_bar

    with progress_bar("normalising", console=console, elapsed=False, transient=True) as progress:
        task = progress.add_task("rows", total=len(rows))
        return normalize.normalize_records(
            rows, source_name, options, on_row=lambda: progress.advance(task)
        )


def _print_summary(console: Any, source: str, num_read: int, num_kept: int, rejects: list) -> None:
    from rich.table import Table

    from rstar2cli.data.dataset_normalize import REJECT_REASONS

    console.print(f"prepare-data: {source}")
    table = Table()
    table.add_column("rows")
    table.add_column("count", justify="right")
    table.add_row("read", str(num_read))
    table.add_row("kept", str(num_kept))
    table.add_row("rejected", str(len(rejects)))
    counts = Counter(r.reason for r in rejects)
    for reason in REJECT_REASONS:
        table.add_row(f"  {reason}", str(counts[reason]))
    console.print(table)


def _write_synthetic(console: Any, name: str, num: int, seed: int, out: Path, force: bool) -> None:
    import json

    from rich.table import Table

    from rstar2cli.data.synthetic import make_synthetic

    test_out = out.with_name(out.stem + ".test.parquet")
    refuse_overwrite([out, test_out], force)
    train, test = make_synthetic(name, num, seed)
    for split_rows, path in ((train, out), (test, test_out)):
        _write_parquet(path, [{**r, "meta": json.dumps(r)} for r in split_rows])
    console.print(f"prepare-data: synthetic set {name!r}, seed {seed}")
    table = Table()
    table.add_column("split")
    table.add_column("problems", justify="right")
    table.add_column("file")
    table.add_row("train", str(len(train)), str(out))
    table.add_row("test", str(len(test)), str(test_out))
    console.print(table)


def _check_rejects_path(rejects_path: Path, out: Path, inputs: tuple) -> None:
    """The rejects file can be written, and is neither --out nor an input (one line if not)."""
    if rejects_path.resolve() == out.resolve():
        raise UserError(f"--rejects and --out are the same file: {out}")
    # NOTE: its own suffix, so any name is accepted; only the location and inputs are checked
    check_output_path(rejects_path, inputs, suffix=rejects_path.suffix.lower(), option="--rejects")


def _write_parquet(path: Path, rows: list[dict[str, str]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rstar2cli.fileio import atomic_path

    columns = ("id", "question", "answer", "source", "meta")
    schema = pa.schema([(c, pa.string()) for c in columns])
    table = pa.Table.from_pylist([{c: r[c] for c in columns} for r in rows], schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
