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
per label): `rstar2cli.eval.results` reads, merges and writes the two files, and
`rstar2cli.eval.eval_report` turns the rows into summaries, tables and the plot.

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
from rstar2cli.eval.results import RESULTS

BENCHMARK = typer.Option(
    None,
    "--benchmark",
    metavar="NAME",
    help="Known set (repeatable): aime24, aime25, hmmt25, math500, gsm8k, amc23, gpqa-diamond.",
)
DATA = typer.Option(
    None,
    "--data",
    metavar="PATH",
    help="Local .jsonl/.json/.parquet in any schema prepare-data reads (repeatable).",
)
MODEL = typer.Option(
    None, "--model", metavar="CKPT", help="HF model folder to run on local engines."
)
ENDPOINT = typer.Option(
    None,
    "--endpoint",
    metavar="URL",
    help="OpenAI-compatible server (e.g. `vllm serve`) instead of --model (repeatable).",
)
TOKENIZER = typer.Option(
    None,
    "--tokenizer",
    help="With --endpoint: tokenizer folder (default: the served model id).",
)
K = typer.Option(
    None, "--k", metavar="K", help="k for pass@k and maj@k (repeatable; default: --samples)."
)
MAX_IN_FLIGHT = typer.Option(
    64, "--max-in-flight", min=1, help="With --endpoint: most concurrent requests per server."
)
OUT = typer.Option(
    None,
    "--out",
    help="Output folder (results.jsonl, summary.json, eval.png); OUT.jsonl with --grade-only.",
)
LABEL = typer.Option(
    None,
    "--label",
    help="Name of this checkpoint in the results (default: the model folder name).",
)
LIMIT = typer.Option(
    None, "--limit", min=1, help="Evaluate only the first N problems of each benchmark."
)
GRADE_ONLY = typer.Option(
    None,
    "--grade-only",
    metavar="IN.jsonl",
    help="Grade existing responses (fields response, answer) into --out OUT.jsonl; no model.",
)
FORCE = typer.Option(False, "--force", help="With --grade-only: overwrite an existing OUT.jsonl.")


@O.rollout_options(
    samples=O.EVAL_SAMPLES,
    samples_help="paper: 16; avg@n averages them",
    max_turns=O.EVAL_MAX_TURNS,
    max_response_tokens=O.EVAL_MAX_RESPONSE_TOKENS,
    temperature=O.EVAL_TEMPERATURE,
)
def eval_cmd(
    benchmark: list[str] | None = BENCHMARK,
    data: list[Path] | None = DATA,
    model: Path | None = MODEL,
    endpoint: list[str] | None = ENDPOINT,
    tokenizer: Path | None = TOKENIZER,
    k: list[int] | None = K,
    max_in_flight: int = MAX_IN_FLIGHT,
    out: Path | None = OUT,
    label: str | None = LABEL,
    limit: int | None = LIMIT,
    grade_only: Path | None = GRADE_ONLY,
    force: bool = FORCE,
    *,
    args: O.RolloutArgs,
) -> None:
    """Evaluate a checkpoint: avg@n / pass@k / maj@k and tool statistics on math benchmarks."""
    from rich.console import Console

    console = Console(highlight=False)
    if grade_only is not None:
        if benchmark or data or model or endpoint:
            raise UserError("--grade-only takes no --benchmark/--data/--model/--endpoint")
        _grade_only(console=console, in_path=grade_only, out=out, force=force)
        return
    args.check()
    if not endpoint:  # an endpoint server decodes as it was started (EvalPlan.check)
        args.check_local_speculation()
    ks = sorted(set(k or [args.samples]))
    from rstar2cli.preflight import EvalPlan

    plan = EvalPlan.check(
        names=benchmark or [],
        files=data or [],
        model=model,
        endpoints=endpoint or [],
        tokenizer=tokenizer,
        out=out,
        ks=ks,
        args=args,
    )
    if limit is not None:
        for bench in plan.benchmarks:
            bench.problems = bench.problems[:limit]
    label = label or plan.default_label
    _evaluate(
        console=console, plan=plan, args=args, label=label, ks=ks, max_in_flight=max_in_flight
    )


def _evaluate(
    *, console: Any, plan: Any, args: O.RolloutArgs, label: str, ks: list[int], max_in_flight: int
) -> None:
    """Run what `label` still lacks of the plan's samples, then summarise every label."""
    from rstar2cli.eval import eval_report as R
    from rstar2cli.eval.results import pending_items, record_settings

    items, owner = pending_items(
        benchmarks=plan.benchmarks, n=args.samples, results=plan.out / RESULTS, label=label
    )
    fit = None
    if items:
        fit = O.fit_to_model(
            console=console,
            name="eval",
            model=plan.model or plan.tokenizer_path,
            tokenizer_path=plan.tokenizer_path,
            args=args,
            questions=[i["question"] for i in items],
            requested=args.max_response_tokens or None,
            default=O.EVAL_MAX_RESPONSE_TOKENS,
        )
        args = fit.args
    settings = _settings(
        plan=plan, args=args, label=label, ks=ks, requested=args.max_response_tokens or None
    )
    record_settings(out=plan.out, label=label, settings=settings)
    R.print_plan(console=console, plan=plan, settings=settings, num_pending=len(items))
    if fit is not None:
        cap = max_in_flight if plan.endpoints else None
        _run(
            console=console,
            plan=plan,
            items=items,
            owner=owner,
            label=label,
            sched=args.sched_config(max_active_per_engine=cap),
            fit=fit,
        )
    R.report(console=console, out=plan.out, label=label, settings=settings, ks=ks)


def _settings(
    plan: Any, args: O.RolloutArgs, label: str, ks: list[int], requested: int | None
) -> dict[str, Any]:
    """Everything about this label's run; the sample-defining part must match earlier results
    of the label (`check_same_settings`, one line otherwise)."""
    from rstar2cli.eval.results import earlier_settings
    from rstar2cli.rollout.resume import check_same_settings, model_fingerprint

    earlier = earlier_settings(plan.out, label)
    if plan.model is not None:
        source = model_fingerprint(plan.model)
    else:
        source = "endpoint " + " ".join(e.model_id for e in plan.endpoints)
    if args.max_response_tokens == 0:  # nothing runs now: keep what the label ran with
        budget = requested or (earlier or {}).get("max_response_tokens") or 0
        import dataclasses

        args = dataclasses.replace(args, max_response_tokens=budget or O.EVAL_MAX_RESPONSE_TOKENS)
    sample = args.sample_settings(source)
    check_same_settings(
        earlier=earlier,
        now=sample,
        where=f"label {label!r} in {plan.out}",
        fix="use another --label or --out",
    )
    return {
        "label": label,
        **sample,
        **args.run_settings(),
        "k": ks,
        "endpoint": [e.base_url for e in plan.endpoints],
        "benchmarks": [b.name for b in plan.benchmarks],
    }


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


def _run(
    *,
    console: Any,
    plan: Any,
    items: list[dict[str, Any]],
    owner: dict[str, str],
    label: str,
    sched: Any,
    fit: O.Fitted,
) -> None:
    from rstar2cli.records import GradedRecord
    from rstar2cli.rollout.jobs import run_command_job

    def decorate(record: GradedRecord) -> GradedRecord:
        return {
            "label": label,
            "benchmark": owner[record["id"]],
            **record,
            "num_response_tokens": len(record["response_ids"]),
        }

    stats, sink = run_command_job(
        name="eval",
        console=console,
        out=plan.out / RESULTS,
        items=items,
        fit=fit,
        start_engines=lambda: _start_engines(plan, fit),
        tool_urls=plan.sandbox_urls,
        sched_config=sched,
        decorate=decorate,
    )
    console.print(
        f"ran {sink.num_written} trajectories in {stats.makespan_s:.1f} s "
        f"({stats.tokens_per_s:.0f} generated tokens/s, {stats.num_tool_calls} tool calls); "
        f"correct {sink.num_correct}/{sink.num_written}"
    )


def _grade_only(*, console: Any, in_path: Path, out: Path | None, force: bool) -> None:
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
