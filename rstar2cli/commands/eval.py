"""`rstar2 eval`: avg@n, pass@k, maj@k and tool statistics of a checkpoint on math benchmarks.

Defaults are the paper's evaluation (section 5): 16 samples per problem at temperature 0.6, up to
30 turns and 30,000 response tokens, reported as avg@16 (mean pass@1). The public release's eval
scripts ran greedy with 5 turns without saying so; this command prints what it runs.

Flow: every input is checked first (benchmark names and files, model folder or `--endpoint`
answering `/v1/models`, each `--sandbox` answering /healthz, k <= n, settings consistent with
earlier results of the same label) and a bad one fails with one line before any engine starts.
Then trajectories go through the rollout core (`rstar2cli.scheduler.rollout.run_rollout`: the
KV-aware scheduler, the agent loop, the sandbox) on engines from `make_engines` (`--model`) or on
`EndpointEngine`s (`--endpoint`, any OpenAI-compatible server). Each finished trajectory is graded
with the training grader (the paper's rule: `\\boxed{}` inside `<answer>`; truncated -> wrong) and
appended to `--out/results.jsonl` (fsynced per batch). Rerunning skips (label, benchmark, id,
sample) already there. At the end every label in results.jsonl is summarised into
`summary.json`, one rich table per benchmark, and `eval.png` (avg@n per benchmark per label).

`--grade-only IN.jsonl --out OUT.jsonl` grades existing responses instead
(`rstar2cli.reward.grade_file`) and prints the accuracy.

Heavy imports happen inside functions. Tested in tests/cli/test_eval_grade_only.py and
tests/integration/test_eval_cli.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rstar2cli.errors import UserError

RESULTS = "results.jsonl"
SUMMARY = "summary.json"
PLOT = "eval.png"


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
        None, "--model", help="HF model folder to run on local engines."
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
    sandbox: list[str] | None = typer.Option(
        None,
        "--sandbox",
        metavar="URL",
        help="sandboxd URL (repeatable). None: an in-process sandbox.",
    ),
    n: int = typer.Option(16, "--n", min=1, help="Samples per problem (paper: 16)."),
    temperature: float = typer.Option(
        0.6, "--temperature", min=0.0, help="Sampling temperature (paper: 0.6)."
    ),
    max_turns: int = typer.Option(30, "--max-turns", min=1, help="Most model turns (paper: 30)."),
    max_response_tokens: int = typer.Option(
        30000,
        "--max-response-tokens",
        min=1,
        help="Response budget, model + tool tokens (paper: 30K).",
    ),
    k: list[int] | None = typer.Option(
        None, "--k", help="k for pass@k and maj@k (repeatable; default n)."
    ),
    engines: int = typer.Option(1, "--engines", min=1, help="Number of local inference engines."),
    engine: str = typer.Option("vllm", "--engine", help="Local engine kind: vllm | hf."),
    kv_cache_tokens: int | None = typer.Option(
        None,
        "--kv-cache-tokens",
        min=0,
        help="KV cache per local engine in tokens (0 or unset: the engine's default).",
    ),
    max_in_flight: int = typer.Option(
        64, "--max-in-flight", min=1, help="With --endpoint: most concurrent requests per server."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (per sample and turn)."),
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
) -> None:
    """Evaluate a checkpoint: avg@n / pass@k / maj@k and tool statistics on math benchmarks."""
    from rich.console import Console

    console = Console(highlight=False)
    if grade_only is not None:
        if benchmark or data or model or endpoint:
            raise UserError("--grade-only takes no --benchmark/--data/--model/--endpoint")
        _grade_only(console, grade_only, out)
        return
    ks = sorted(set(k or [n]))
    from rstar2cli.eval.plan import Plan, check_settings

    plan = Plan.check(
        benchmark or [],
        data or [],
        model,
        endpoint or [],
        tokenizer,
        sandbox or [],
        engine,
        out,
        ks,
        n,
    )
    if limit is not None:
        for bench in plan.benchmarks:
            bench.problems = bench.problems[:limit]
    from rstar2cli.agent.loop import AgentConfig
    from rstar2cli.scheduler.scheduler import SchedulerConfig

    agent_config = AgentConfig(
        max_turns=max_turns,
        max_response_tokens=max_response_tokens,
        temperature=temperature,
        seed=seed,
    )
    sched_config = SchedulerConfig(max_active_per_engine=max_in_flight if plan.endpoints else None)
    label = label or plan.default_label
    settings = dict(
        label=label,
        model=str(model) if model else None,
        endpoint=[e.base_url for e in plan.endpoints],
        benchmarks=[b.name for b in plan.benchmarks],
        n=n,
        k=ks,
        temperature=temperature,
        max_turns=max_turns,
        max_response_tokens=max_response_tokens,
        template=agent_config.template,
        seed=seed,
        engines=engines,
        engine=engine,
        sandbox=plan.sandbox_urls,
    )
    out = plan.out
    check_settings(out, label, settings)
    from rstar2cli.eval.results import pending_items

    items, owner = pending_items(plan.benchmarks, n, out / RESULTS, label)
    _print_plan(console, plan, settings, len(items))
    if items:
        import asyncio

        from rstar2cli.scheduler.engines import EngineSpec

        # NOTE: --kv-cache-tokens 0 means the engine's default size, as leaving it out does
        spec = EngineSpec(str(plan.model), engines, engine, None, kv_cache_tokens or None, seed)
        asyncio.run(_run(console, plan, items, owner, label, agent_config, sched_config, spec))
    _report(console, out, label, settings, ks)


def _print_plan(console: Any, plan: Any, settings: dict, num_pending: int) -> None:
    where = (
        f"model {settings['model']} ({settings['engines']} x {settings['engine']})"
        if plan.model
        else f"endpoint {', '.join(settings['endpoint'])}"
    )
    from rich.markup import escape

    console.print(
        f"eval [bold]{escape(settings['label'])}[/]: {escape(where)}; n={settings['n']} samples/problem, "
        f"temperature {settings['temperature']}, max {settings['max_turns']} turns, "
        f"{settings['max_response_tokens']} response tokens, k={settings['k']}, seed {settings['seed']}; "
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


async def _start_engines(plan: Any, tokenizer: Any, spec: Any, max_model_len: int) -> list[Any]:
    if plan.endpoints:
        from rstar2cli import protocol as P
        from rstar2cli.scheduler.endpoint_engine import EndpointEngine

        stop_id = int(tokenizer.convert_tokens_to_ids(P.IM_END))
        return [
            EndpointEngine(info, [stop_id], name=f"endpoint{i}")
            for i, info in enumerate(plan.endpoints)
        ]
    return spec.start(max_model_len)


async def _run(console, plan, items, owner, label, agent_config, sched_config, spec) -> None:
    from transformers import AutoTokenizer

    from rstar2cli.agent.loop import longest_prompt_tokens, make_tool_runner
    from rstar2cli.eval.results import ResultWriter
    from rstar2cli.scheduler.rollout import rollout_session, run_rollout
    from rstar2cli.ui import progress_bar

    tokenizer = AutoTokenizer.from_pretrained(plan.tokenizer_path)
    max_prompt = longest_prompt_tokens(
        (i["question"] for i in items), tokenizer, agent_config.template
    )
    writer = ResultWriter(plan.out / RESULTS, label, owner)
    try:
        async with rollout_session(
            lambda: _start_engines(
                plan, tokenizer, spec, max_prompt + agent_config.max_response_tokens
            ),
            make_tool_runner(plan.sandbox_urls, timeout_s=agent_config.tool_timeout_s or 10.0),
        ) as (engines, tools):
            with progress_bar("eval", console=console) as progress:
                task = progress.add_task("eval", total=len(items))

                def on_record(record: dict[str, Any]) -> None:
                    writer.add(record)
                    progress.advance(task)

                stats = await run_rollout(
                    engines,
                    items,
                    tokenizer,
                    agent_config,
                    sched_config,
                    tools,
                    on_record=on_record,
                )
    finally:
        writer.close()
    console.print(
        f"ran {writer.num_written} trajectories in {stats.makespan_s:.1f} s "
        f"({stats.tokens_per_s:.0f} generated tokens/s, {stats.num_tool_calls} tool calls); "
        f"correct {writer.num_correct}/{writer.num_written}"
    )
    from rich.markup import escape

    for e in engines:
        if getattr(e, "last_error", None):
            console.print(
                f"[yellow]{e.name}: {e.metrics()['num_errors']:.0f} failed requests, last: {escape(e.last_error)}[/]"
            )


# ---------------------------------------------------------------------------------------------
# reporting


def _report(console: Any, out: Path, label: str, settings: dict, ks: list[int]) -> None:
    import json

    from rstar2cli.eval import report as R
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
    earlier = {}
    if (out / SUMMARY).is_file():
        try:
            earlier = json.loads((out / SUMMARY).read_text()).get("labels", {})
        except json.JSONDecodeError:
            earlier = {}
    doc: dict[str, Any] = {"labels": {}}
    for lab in labels:
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


def _grade_only(console: Any, in_path: Path, out: Path | None) -> None:
    from rstar2cli.fileio import check_output_path
    from rstar2cli.reward.grade_file import grade_file

    if out is None or out.suffix.lower() != ".jsonl":
        raise UserError("--grade-only needs --out OUT.jsonl")
    if out.resolve() == in_path.resolve():
        raise UserError("--out must differ from the --grade-only input")
    if not in_path.is_file():
        raise UserError(f"file not found: {in_path}")
    check_output_path(out, inputs=(in_path,), suffix=".jsonl")
    report = grade_file(in_path, out)
    statuses = ", ".join(f"{s} {c}" for s, c in sorted(report.status_counts.items()))
    console.print(
        f"graded {report.num_graded}: accuracy {100 * report.accuracy:.1f}% "
        f"({report.num_correct}/{report.num_graded}) -> {out}  [{statuses}]",
        markup=False,
    )
