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

    from rstar2cli.agent.inputs import check_model_folder, check_sandboxes, load_problems
    from rstar2cli.fileio import check_output_path, read_jsonl_if_exists
    from rstar2cli.rollout.jobs import make_items

    console = Console(highlight=False)
    check_output_path(out, inputs=(data,), suffix=".jsonl")
    args.check()
    check_model_folder(model)
    problems = load_problems(data, require_answer=False)
    if args.sandbox:
        check_sandboxes(args.sandbox, args.sandbox_token_file)
    stats_path = out.with_name(out.stem + ".stats.json")
    done = {(str(r.get("id")), int(r.get("sample", 0))) for r in read_jsonl_if_exists(out)}
    items = make_items(problems, args.samples, done)
    if not items:
        console.print(
            f"rollout: all {len(problems) * args.samples} trajectories already in {out}; nothing to do"
        )
        return
    fit = O.fit_to_model(
        console, "rollout", model, model, args, [i["question"] for i in items],
        args.max_response_tokens or None, O.ROLLOUT.max_response_tokens,
    )  # fmt: skip
    args = fit.args
    settings = args.sample_settings(O.model_fingerprint(model))
    O.start_run_state(stats_path, settings, args.run_settings(), len(done), str(out))
    if done:
        console.print(f"rollout: resuming: {len(done)} trajectories already in {out}")
    stats, sink = _run(console, model, args, items, fit, out)
    _report(console, out, stats_path, stats, sink, settings, args.run_settings())


def _run(
    console: Any, model: Path, args: O.RolloutArgs, items: list, fit: O.Fitted, out: Path
) -> tuple[Any, Any]:
    from rstar2cli.rollout.jobs import run_command_job

    spec = args.engine_spec(model)
    return run_command_job(
        "rollout",
        console,
        out,
        items,
        fit,
        lambda: spec.start(max_model_len=fit.max_model_len),
        args.sandbox,
        args.sched_config(),
    )


def _report(
    console: Any, out: Path, stats_path: Path, stats: Any, sink: Any, settings: dict, run: dict
) -> None:
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
        "settings": settings,
        "run": run,
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
