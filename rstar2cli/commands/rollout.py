"""`rstar2 rollout`: multi-turn, tool-using generation of trajectories to a jsonl file.

Checks its inputs first (a writable .jsonl `--out` that is not `--data`, a model folder with a
config.json, a data file with questions, a response budget the model can hold, every `--sandbox`
answering /healthz, the same sampling settings as the records already in `--out`) and fails with
one line before starting any engine. Then it runs the rollout job (`rstar2cli.rollout.jobs`):
`--samples` per problem through the scheduler, the agent loop and the tools, with a live progress
line, appending one trajectory record per line to `--out` (fsynced per batch). Records of problems
with an answer are graded (the paper's binary rule, read from the model's own text). Rerunning
with the same `--out` runs only the (id, sample) pairs not there yet; Ctrl-C keeps what finished
and exits 130. Run settings and statistics go to `<out stem>.stats.json` (settings at the start,
statistics at the end) and to the table printed at the end.

Heavy imports (vllm, transformers, torch, ray) happen inside the function.
Tested in tests/integration/test_rollout_cli.py and tests/cli/test_bad_outputs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rstar2cli import options as O


@O.rollout_options(
    samples=1,
    samples_help="each one graded when the problem has an answer",
    max_turns=O.ROLLOUT.max_turns,
    max_response_tokens=O.ROLLOUT.max_response_tokens,
    temperature=O.ROLLOUT.temperature,
)
def rollout(
    model: Path = O.MODEL,
    data: Path = typer.Option(
        ..., "--data", help="Problems: .parquet/.jsonl/.json with 'question' (and 'answer', 'id')."
    ),
    out: Path = typer.Option(
        ..., "--out", help="Trajectory records, one JSON line each (appended; resumable)."
    ),
    *,
    args: O.RolloutArgs,
) -> None:
    """Roll out tool-using trajectories with the KV-cache-aware scheduler."""
    from rich.console import Console

    from rstar2cli.fileio import read_jsonl_if_exists
    from rstar2cli.rollout.jobs import make_items
    from rstar2cli.rollout.resume import model_fingerprint, start_run_state

    console = Console(highlight=False)
    problems = _check_inputs(model=model, data=data, out=out, args=args)
    stats_path = out.with_name(out.stem + ".stats.json")
    done = {(str(r.get("id")), int(r.get("sample", 0))) for r in read_jsonl_if_exists(out)}
    items = make_items(problems=problems, num_samples=args.samples, done=done)
    if not items:
        console.print(
            f"rollout: all {len(problems) * args.samples} trajectories already in {out}; nothing to do"
        )
        return
    fit = O.fit_to_model(
        console=console,
        name="rollout",
        model=model,
        tokenizer_path=model,
        args=args,
        questions=[i["question"] for i in items],
        requested=args.max_response_tokens or None,
        default=O.ROLLOUT.max_response_tokens,
    )
    args = fit.args
    state = {"settings": args.sample_settings(model_fingerprint(model)), "run": args.run_settings()}
    start_run_state(
        stats_path=stats_path,
        settings=state["settings"],
        run=state["run"],
        num_done=len(done),
        what=str(out),
    )
    if done:
        console.print(f"rollout: resuming: {len(done)} trajectories already in {out}")
    stats, sink = _run(console=console, model=model, items=items, fit=fit, out=out)
    _report(console=console, out=out, stats_path=stats_path, stats=stats, sink=sink, state=state)


def _check_inputs(
    *, model: Path, data: Path, out: Path, args: O.RolloutArgs
) -> list[dict[str, Any]]:
    """Every check before the model loads (one line each); the problems."""
    from rstar2cli.data.loading import load_problems
    from rstar2cli.fileio import check_output_path
    from rstar2cli.preflight import check_model_folder, check_sandboxes

    check_output_path(out, inputs=(data,), suffix=".jsonl")
    args.check()
    args.check_local_speculation()
    check_model_folder(model)
    problems = load_problems(data, require_answer=False)
    if args.sandbox:
        check_sandboxes(args.sandbox, args.sandbox_token_file)
    return problems


def _run(*, console: Any, model: Path, items: list, fit: O.Fitted, out: Path) -> tuple[Any, Any]:
    from rstar2cli.rollout.jobs import run_command_job

    spec = fit.args.engine_spec(model)
    return run_command_job(
        name="rollout",
        console=console,
        out=out,
        items=items,
        fit=fit,
        start_engines=lambda: spec.start(max_model_len=fit.max_model_len),
        tool_urls=fit.args.sandbox,
        sched_config=fit.args.sched_config(),
    )


def _report(
    *, console: Any, out: Path, stats_path: Path, stats: Any, sink: Any, state: dict[str, Any]
) -> None:
    """The statistics as a table, and joined to the run's `state` (its settings) in `stats_path`."""
    from rich.table import Table

    from rstar2cli.fileio import write_json_atomic

    rows = [
        ("trajectories written", str(sink.num_written)),
        ("makespan", f"{stats.makespan_s:.1f} s"),
        ("generated tokens/s", f"{stats.tokens_per_s:.1f}"),
        ("engine idle fraction", f"{stats.idle_fraction:.1%}"),
        ("preemptions", f"{stats.num_preemptions:.0f}"),
        ("tool calls", str(stats.num_tool_calls)),
        ("mean tool latency", f"{stats.mean_tool_latency_s * 1000:.0f} ms"),
        ("finish reasons", ", ".join(f"{k} {v}" for k, v in sorted(sink.finish_counts.items()))),
    ]
    if sink.num_graded:
        rows.append(("reward (graded)", f"{sink.num_correct}/{sink.num_graded}"))
    table = Table(title=f"rollout ({stats.policy} scheduler) -> {out}")
    table.add_column("")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    summary = {
        **state,
        "makespan_s": stats.makespan_s,
        "tokens_per_s": stats.tokens_per_s,
        "idle_fraction": stats.idle_fraction,
        "engine_busy_s": stats.engine_busy_s,
        "num_preemptions": stats.num_preemptions,
        "num_migrations": stats.num_migrations,
        "num_tool_calls": stats.num_tool_calls,
        "mean_tool_latency_s": stats.mean_tool_latency_s,
        "finish_reasons": sink.finish_counts,
        "kv_samples": stats.kv_samples,
        "draft_tokens": stats.drafts[0],
        "accepted_draft_tokens": stats.drafts[1],
        "draft_acceptance": stats.draft_acceptance,
    }
    write_json_atomic(stats_path, summary)
