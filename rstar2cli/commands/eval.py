"""`rstar2 eval`: avg@n, pass@k, maj@k and tool statistics of a checkpoint on math benchmarks.

Defaults are the paper's evaluation (section 5): 16 samples per problem at temperature 0.6, up to
30 turns and 30,000 response tokens (clipped to the model's context, with a warning, when it is
shorter), reported as avg@16 (mean pass@1). The public release's eval scripts ran greedy with 5
turns without saying so; this command prints what it runs.

Flow: every input is checked first (benchmark names and files, model folder or `--endpoint`
answering `/v1/models`, each `--sandbox` answering /healthz, k <= n, a budget the model holds,
the same model and sampling settings as earlier results of the same label) and a bad one fails
with one line before any engine starts. The label's settings go into summary.json at once. Then
the rollout job (`rstar2cli.rollout.jobs`: the KV-aware scheduler, the agent loop, the sandbox, the
training grader reading the model's own text) runs on engines from the engine spec (`--model`) or
on `EndpointEngine`s (`--endpoint`, any OpenAI-compatible server), appending graded rows to
`--out/results.jsonl` (fsynced per batch). Rerunning skips (label, benchmark, id, sample) already
there; Ctrl-C keeps what finished and exits 130. At the end every label in results.jsonl is
summarised into `summary.json`, one rich table per benchmark, and `eval.png` (avg@n per benchmark
per label).

`--grade-only IN.jsonl --out OUT.jsonl` grades existing responses instead
(`rstar2cli.reward.grade_file`) and prints the accuracy; an existing OUT needs `--force`.

Heavy imports happen inside functions. Tested in tests/cli/test_eval_grade_only.py,
tests/cli/test_reward_leak.py and tests/integration/test_eval_cli.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rstar2cli import options as O
from rstar2cli.errors import UserError

RESULTS = "results.jsonl"
SUMMARY = "summary.json"
PLOT = "eval.png"


@O.rollout_options(
    samples=O.EVAL_SAMPLES,
    samples_help="paper: 16; avg@n averages them",
    max_turns=O.EVAL_MAX_TURNS,
    max_response_tokens=O.EVAL_MAX_RESPONSE_TOKENS,
    temperature=O.EVAL_TEMPERATURE,
)
def eval_cmd(
    benchmark: list[str] | None = typer.Option(
        None,
        "--benchmark",
        metavar="NAME",
        help="Known set (repeatable): aime24, aime25, hmmt25, math500, gsm8k, amc23, gpqa-diamond.",
    ),
    data: list[Path] | None = typer.Option(
        None,
        "--data",
        metavar="PATH",
        help="Local .jsonl/.json/.parquet in any schema prepare-data reads (repeatable).",
    ),
    model: Path | None = typer.Option(
        None, "--model", metavar="CKPT", help="HF model folder to run on local engines."
    ),
    endpoint: list[str] | None = typer.Option(
        None,
        "--endpoint",
        metavar="URL",
        help="OpenAI-compatible server (e.g. `vllm serve`) instead of --model (repeatable).",
    ),
    tokenizer: Path | None = typer.Option(
        None,
        "--tokenizer",
        help="With --endpoint: tokenizer folder (default: the served model id).",
    ),
    k: list[int] | None = typer.Option(
        None, "--k", metavar="K", help="k for pass@k and maj@k (repeatable; default: --samples)."
    ),
    max_in_flight: int = typer.Option(
        64, "--max-in-flight", min=1, help="With --endpoint: most concurrent requests per server."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output folder (results.jsonl, summary.json, eval.png); OUT.jsonl with --grade-only.",
    ),
    label: str | None = typer.Option(
        None,
        "--label",
        help="Name of this checkpoint in the results (default: the model folder name).",
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Evaluate only the first N problems of each benchmark."
    ),
    grade_only: Path | None = typer.Option(
        None,
        "--grade-only",
        metavar="IN.jsonl",
        help="Grade existing responses (fields response, answer) into --out OUT.jsonl; no model.",
    ),
    force: bool = typer.Option(
        False, "--force", help="With --grade-only: overwrite an existing OUT.jsonl."
    ),
    *,
    args: O.RolloutArgs,
) -> None:
    """Evaluate a checkpoint: avg@n / pass@k / maj@k and tool statistics on math benchmarks."""
    from rich.console import Console

    console = Console(highlight=False)
    if grade_only is not None:
        if benchmark or data or model or endpoint:
            raise UserError("--grade-only takes no --benchmark/--data/--model/--endpoint")
        _grade_only(console, grade_only, out, force)
        return
    args.check()
    if endpoint and args.speculative:
        raise UserError(
            "--speculative is for the engines eval starts; an --endpoint server decodes as it "
            "was started"
        )
    ks = sorted(set(k or [args.samples]))
    from rstar2cli.eval.plan import Plan

    plan = Plan.check(
        benchmark or [], data or [], model, endpoint or [], tokenizer, args.sandbox, args.engine, out,
        ks, args.samples, sandbox_token_file=args.sandbox_token_file,
    )  # fmt: skip
    if limit is not None:
        for bench in plan.benchmarks:
            bench.problems = bench.problems[:limit]
    label = label or plan.default_label
    from rstar2cli.eval.results import pending_items

    items, owner = pending_items(plan.benchmarks, args.samples, plan.out / RESULTS, label)
    fit = None
    if items:
        fit = O.fit_to_model(
            console, "eval", plan.model or plan.tokenizer_path, plan.tokenizer_path, args,
            [i["question"] for i in items], args.max_response_tokens or None, O.EVAL_MAX_RESPONSE_TOKENS,
        )  # fmt: skip
        args = fit.args
    settings = _settings(plan, args, label, ks, args.max_response_tokens or None)
    _record_settings(plan.out, label, settings)
    _print_plan(console, plan, settings, len(items))
    if fit is not None:
        cap = max_in_flight if plan.endpoints else None
        _run(console, plan, items, owner, label, args.sched_config(max_active_per_engine=cap), fit)
    _report(console, plan.out, label, settings, ks)


def _settings(
    plan: Any, args: O.RolloutArgs, label: str, ks: list[int], requested: int | None
) -> dict[str, Any]:
    """Everything about this label's run; the sample-defining part must match earlier results
    of the label (`check_same_settings`, one line otherwise)."""
    from rstar2cli.eval.plan import earlier_settings

    earlier = earlier_settings(plan.out, label)
    if plan.model is not None:
        source = O.model_fingerprint(plan.model)
    else:
        source = "endpoint " + " ".join(e.model_id for e in plan.endpoints)
    if args.max_response_tokens == 0:  # nothing runs now: keep what the label ran with
        budget = requested or (earlier or {}).get("max_response_tokens") or 0
        import dataclasses

        args = dataclasses.replace(args, max_response_tokens=budget or O.EVAL_MAX_RESPONSE_TOKENS)
    sample = args.sample_settings(source)
    O.check_same_settings(
        earlier, sample, f"label {label!r} in {plan.out}", "use another --label or --out"
    )
    return {
        "label": label,
        **sample,
        **args.run_settings(),
        "k": ks,
        "endpoint": [e.base_url for e in plan.endpoints],
        "benchmarks": [b.name for b in plan.benchmarks],
    }


def _record_settings(out: Path, label: str, settings: dict[str, Any]) -> None:
    """The label's settings go into summary.json before anything runs, so an interrupted run's
    results are still checked against them on the next run."""
    from rstar2cli.fileio import write_json_atomic

    doc = _read_summary(out)
    doc.setdefault("labels", {}).setdefault(label, {})["settings"] = settings
    write_json_atomic(out / SUMMARY, doc)


def _read_summary(out: Path) -> dict[str, Any]:
    import json

    try:
        doc = json.loads((out / SUMMARY).read_text())
    except (OSError, json.JSONDecodeError):
        return {"labels": {}}
    return doc if isinstance(doc, dict) and isinstance(doc.get("labels"), dict) else {"labels": {}}


def _print_plan(console: Any, plan: Any, settings: dict, num_pending: int) -> None:
    where = (
        f"model {plan.model} ({settings['engines']} x {settings['engine']})"
        if plan.model
        else f"endpoint {', '.join(settings['endpoint'])}"
    )
    from rich.markup import escape

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


# ---------------------------------------------------------------------------------------------
# running


def _start_engines(plan: Any, fit: Any) -> list[Any]:
    if plan.endpoints:
        from rstar2cli import protocol as P
        from rstar2cli.engines.endpoint_engine import EndpointEngine

        stop_id = int(fit.tokenizer.convert_tokens_to_ids(P.IM_END))
        return [
            EndpointEngine(info, [stop_id], name=f"endpoint{i}")
            for i, info in enumerate(plan.endpoints)
        ]
    return fit.args.engine_spec(plan.model).start(max_model_len=fit.max_model_len)


def _run(console, plan, items, owner, label, sched, fit) -> None:
    from rstar2cli.rollout.jobs import run_command_job

    def decorate(record: dict[str, Any]) -> dict[str, Any]:
        return {
            "label": label,
            "benchmark": owner[record["id"]],
            **record,
            "num_response_tokens": len(record["response_ids"]),
        }

    stats, sink = run_command_job(
        "eval",
        console,
        plan.out / RESULTS,
        items,
        fit,
        lambda: _start_engines(plan, fit),
        plan.sandbox_urls,
        sched,
        decorate=decorate,
    )
    console.print(
        f"ran {sink.num_written} trajectories in {stats.makespan_s:.1f} s "
        f"({stats.tokens_per_s:.0f} generated tokens/s, {stats.num_tool_calls} tool calls); "
        f"correct {sink.num_correct}/{sink.num_written}"
    )


# ---------------------------------------------------------------------------------------------
# reporting


def _report(console: Any, out: Path, label: str, settings: dict, ks: list[int]) -> None:
    from rstar2cli.eval import eval_report as R
    from rstar2cli.eval.results import check_answer_pairs
    from rstar2cli.fileio import read_jsonl_if_exists, write_json_atomic

    rows = read_jsonl_if_exists(out / RESULTS)
    if not rows:
        raise UserError(f"no results in {out / RESULTS}")
    grouped = R.group_rows(rows)
    labels = list(dict.fromkeys(lab for lab, _ in grouped))
    summaries = R.summarize_all(
        grouped, ks, R.lookup_equivalence(check_answer_pairs(R.majority_pairs(grouped)))
    )
    earlier = _read_summary(out)["labels"]
    doc: dict[str, Any] = {"labels": {}}
    for lab in dict.fromkeys([*earlier, *labels]):
        lab_settings = settings if lab == label else earlier.get(lab, {}).get("settings")
        doc["labels"][lab] = {
            "settings": lab_settings,
            "benchmarks": {b: s.to_dict() for (lb, b), s in summaries.items() if lb == lab},
        }
    write_json_atomic(out / SUMMARY, doc)
    for table in R.render_tables(summaries, labels):
        console.print(table)
    R.plot_accuracy(summaries, labels, out / PLOT)
    console.print(f"wrote {out / SUMMARY} and {out / PLOT}")


def _grade_only(console: Any, in_path: Path, out: Path | None, force: bool) -> None:
    from rstar2cli.fileio import check_output_path, refuse_overwrite
    from rstar2cli.reward.grade_file import grade_file

    if out is None or out.suffix.lower() != ".jsonl":
        raise UserError("--grade-only needs --out OUT.jsonl")
    if out.resolve() == in_path.resolve():
        raise UserError("--out must differ from the --grade-only input")
    if not in_path.is_file():
        raise UserError(f"file not found: {in_path}")
    check_output_path(out, inputs=(in_path,), suffix=".jsonl")
    refuse_overwrite([out], force)
    report = grade_file(in_path, out)
    statuses = ", ".join(f"{s} {c}" for s, c in sorted(report.status_counts.items()))
    console.print(
        f"graded {report.num_graded}: accuracy {100 * report.accuracy:.1f}% "
        f"({report.num_correct}/{report.num_graded}) -> {out}  [{statuses}]",
        markup=False,
    )
