"""`rstar2 rollout`: multi-turn, tool-using generation of trajectories to a jsonl file.

Checks its inputs first (a writable .jsonl `--out` that is not `--data`, a model folder with a
config.json, a data file with questions, every `--sandbox` answering /healthz) and fails with one
line before starting any engine. Then it starts `--engines` engines
(`rstar2cli.scheduler.engines.make_engines`: vLLM or transformers, in-process or as Ray actors),
rolls out `--n` samples per problem through the scheduler (`rstar2cli.scheduler.rollout`) with a
live progress display, and appends one trajectory record per line to `--out`, flushed and fsynced
per batch. When the data has answers each record also gets `reward` (the paper's binary rule:
`\\boxed{}` inside `<answer>`). Rerunning with the same `--out` skips (id, sample) pairs already
there. Run statistics (makespan, idle fraction, preemptions, tokens/s, tool latency) go to the
table printed at the end and to `<out stem>.stats.json`.

Heavy imports (vllm, transformers, torch, ray) happen inside the function.
Tested in tests/integration/test_rollout_cli.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from rstar2cli.agent.inputs import check_model_folder, check_sandboxes, load_problems
from rstar2cli.errors import UserError
from rstar2cli.fileio import check_output_path
from rstar2cli.scheduler.scheduler import SchedulerConfig

_FLUSH_EVERY = 16
_FLUSH_EVERY_S = 2.0


def rollout(
    model: Path = typer.Option(..., "--model", help="HF model folder (weights + tokenizer)."),
    data: Path = typer.Option(
        ..., "--data", help="Problems: .parquet/.jsonl/.json with 'question' (and 'answer', 'id')."
    ),
    out: Path = typer.Option(
        ..., "--out", help="Trajectory records, one JSON line each (appended)."
    ),
    n: int = typer.Option(1, "--n", min=1, help="Samples (rollouts) per problem."),
    engines: int = typer.Option(1, "--engines", min=1, help="Number of inference engines."),
    engine: str = typer.Option("vllm", "--engine", help="Engine kind: vllm | hf."),
    sandbox: list[str] | None = typer.Option(
        None,
        "--sandbox",
        metavar="URL",
        help="sandboxd URL (repeatable). None: an in-process sandbox.",
    ),
    scheduler: str = typer.Option(
        "kv", "--scheduler", help="kv (KV-cache-aware) | static | least-requests."
    ),
    kv_mode: str = typer.Option(
        "incremental",
        "--kv-mode",
        help="kv scheduler reservation: incremental (context + next step) | "
        "full (the paper's prompt + max response) | per_turn.",
    ),
    kv_overcommit: float = typer.Option(
        SchedulerConfig.kv_overcommit,
        "--kv-overcommit",
        min=1.0,
        max=2.0,
        help="incremental/per_turn: reserve up to this multiple of each engine's KV (most "
        "requests end before using their whole step); 1.0 never lets an engine preempt.",
    ),
    max_turns: int = typer.Option(
        10, "--max-turns", min=1, help="Most model turns per trajectory."
    ),
    max_response_tokens: int = typer.Option(
        8192, "--max-response-tokens", min=1, help="Response budget (model + tool tokens)."
    ),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (per sample and turn)."),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Run engines as Ray actors: 'local' or a cluster address."
    ),
    template: str = typer.Option("paper", "--template", help="Prompt template: paper | release."),
    kv_cache_tokens: int | None = typer.Option(
        None,
        "--kv-cache-tokens",
        min=0,
        help="KV cache per engine in tokens (0 or unset: the engine's default).",
    ),
    max_tool_output_chars: int = typer.Option(
        256,
        "--max-tool-output-chars",
        min=0,
        help="Tool output kept per call (middle cut); 0 keeps all.",
    ),
    tool_timeout_s: float = typer.Option(
        10.0, "--tool-timeout", help="Seconds per tool call (> 0)."
    ),
) -> None:
    """Roll out tool-using trajectories with the KV-cache-aware scheduler."""
    from rich.console import Console

    from rstar2cli.agent.loop import AgentConfig

    console = Console(highlight=False)
    check_output_path(out, inputs=(data,), suffix=".jsonl")
    if engine not in ("vllm", "hf"):
        raise UserError(f"--engine must be vllm or hf, got {engine!r}")
    if tool_timeout_s <= 0:
        raise UserError(f"--tool-timeout must be > 0 seconds, got {tool_timeout_s}")
    try:
        sched_config = SchedulerConfig(
            policy=scheduler, kv_mode=kv_mode, kv_overcommit=kv_overcommit
        )
        agent_config = AgentConfig(
            max_turns=max_turns,
            max_response_tokens=max_response_tokens,
            temperature=temperature,
            seed=seed,
            template=template,
            max_tool_output_chars=max_tool_output_chars or None,
            tool_timeout_s=tool_timeout_s,
        )
        from rstar2cli.protocol import render_prompt

        render_prompt("", template)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    check_model_folder(model)
    problems = load_problems(data, require_answer=False)
    urls = list(sandbox or [])
    if urls:
        check_sandboxes(urls)
    items = _pending_items(problems, n, out)
    if not items:
        console.print(
            f"rollout: all {len(problems) * n} trajectories already in {out}; nothing to do"
        )
        return
    settings = dict(
        model=str(model),
        data=str(data),
        n=n,
        engines=engines,
        engine=engine,
        sandbox=urls,
        scheduler=scheduler,
        kv_mode=kv_mode,
        kv_overcommit=kv_overcommit,
        max_turns=max_turns,
        max_response_tokens=max_response_tokens,
        temperature=temperature,
        seed=seed,
        template=template,
        ray_address=ray_address,
        kv_cache_tokens=kv_cache_tokens,
    )
    import asyncio

    from rstar2cli.scheduler.engines import EngineSpec

    # NOTE: --kv-cache-tokens 0 means the engine's default size, as leaving it out does
    spec = EngineSpec(str(model), engines, engine, ray_address, kv_cache_tokens or None, seed)
    asyncio.run(_run(console, spec, items, out, urls, agent_config, sched_config, settings))


def _pending_items(problems: list[dict[str, Any]], n: int, out: Path) -> list[dict[str, Any]]:
    from rstar2cli.fileio import read_jsonl_if_exists

    done = {(str(r.get("id")), r.get("sample")) for r in read_jsonl_if_exists(out)}
    return [{**p, "sample": s} for p in problems for s in range(n) if (p["id"], s) not in done]


class _Writer:
    """Buffers records; grades them when references exist; appends + fsyncs per batch."""

    def __init__(self, out: Path):
        from rstar2cli.fileio import JsonlAppender

        self.appender = JsonlAppender(out)
        self.buffer: list[dict[str, Any]] = []
        self.grader: Any = None
        self.last_flush = time.monotonic()
        self.num_written = 0
        self.num_correct = 0
        self.finish_counts: dict[str, int] = {}

    def add(self, record: dict[str, Any]) -> None:
        self.buffer.append(record)
        reason = record["finish_reason"]
        self.finish_counts[reason] = self.finish_counts.get(reason, 0) + 1
        if len(self.buffer) >= _FLUSH_EVERY or time.monotonic() - self.last_flush > _FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self._grade(self.buffer)
            self.appender.write_batch(self.buffer)
            self.num_written += len(self.buffer)
            self.buffer = []
        self.last_flush = time.monotonic()

    def _grade(self, rows: list[dict[str, Any]]) -> None:
        graded = [r for r in rows if r.get("answer") is not None]
        if not graded:
            return
        if self.grader is None:
            from rstar2cli.reward.grader import Grader

            self.grader = Grader(num_workers=1, strict=True)
        items = [(r["text"], r["answer"]) for r in graded]
        results = self.grader.grade_batch(items, [r["finish_reason"] for r in graded])
        for row, result in zip(graded, results, strict=False):
            row["reward"] = 1.0 if result.correct else 0.0
            self.num_correct += int(result.correct)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.appender.close()
            if self.grader is not None:
                self.grader.close()


async def _run(console, spec, items, out, urls, agent_config, sched_config, settings) -> None:
    from transformers import AutoTokenizer

    from rstar2cli.agent.loop import longest_prompt_tokens, make_tool_runner
    from rstar2cli.scheduler.rollout import rollout_session, run_rollout

    tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
    max_prompt = longest_prompt_tokens(
        (i["question"] for i in items), tokenizer, agent_config.template
    )
    writer = _Writer(out)
    try:
        async with rollout_session(
            lambda: spec.start(max_prompt + agent_config.max_response_tokens),
            make_tool_runner(urls, timeout_s=agent_config.tool_timeout_s or 10.0),
        ) as (engines, tools):
            with _Progress(console, len(items)) as progress:

                def on_record(record: dict[str, Any]) -> None:
                    writer.add(record)
                    progress.done()

                stats = await run_rollout(
                    engines,
                    items,
                    tokenizer,
                    agent_config,
                    sched_config,
                    tools,
                    on_record=on_record,
                    on_tick=progress.tick,
                )
    finally:
        writer.close()
    _report(console, out, stats, writer, settings)


class _Progress:
    """A rich progress bar: trajectories done, tool calls in flight, KV use per engine."""

    def __init__(self, console: Any, total: int):
        from rstar2cli.ui import progress_bar

        self.progress = progress_bar("rollout", "{task.description}", console=console)
        self.task = self.progress.add_task("starting", total=total)

    def __enter__(self) -> _Progress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def done(self) -> None:
        self.progress.advance(self.task)

    def tick(self, snap: Any) -> None:
        kv = " ".join(
            f"e{i} {led / cap:.0%}/{eng / cap:.0%}"
            for i, (led, eng, cap) in enumerate(
                zip(
                    snap.ledger_used_tokens,
                    snap.engine_used_tokens,
                    snap.capacity_tokens,
                    strict=False,
                )
            )
        )
        self.progress.update(
            self.task, description=f"tools {snap.num_tool_in_flight} | KV reserved/used {kv}"
        )


def _report(console: Any, out: Path, stats: Any, writer: _Writer, settings: dict) -> None:
    from rich.table import Table

    from rstar2cli.fileio import write_json_atomic

    rows = [
        ("trajectories written", str(writer.num_written)),
        ("makespan", f"{stats.makespan_s:.1f} s"),
        ("generated tokens/s", f"{stats.tokens_per_s:.1f}"),
        ("engine idle fraction", f"{stats.idle_fraction:.1%}"),
        ("preemptions", f"{stats.num_preemptions:.0f}"),
        ("tool calls", str(stats.num_tool_calls)),
        ("mean tool latency", f"{stats.mean_tool_latency_s * 1000:.0f} ms"),
        ("finish reasons", ", ".join(f"{k} {v}" for k, v in sorted(writer.finish_counts.items()))),
    ]
    if writer.grader is not None:
        rows.append(("reward (graded)", f"{writer.num_correct}/{writer.num_written}"))
    table = Table(title=f"rollout ({stats.policy} scheduler) -> {out}")
    table.add_column("")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    summary = {
        "settings": settings,
        "makespan_s": stats.makespan_s,
        "tokens_per_s": stats.tokens_per_s,
        "idle_fraction": stats.idle_fraction,
        "engine_busy_s": stats.engine_busy_s,
        "num_preemptions": stats.num_preemptions,
        "num_migrations": stats.num_migrations,
        "num_tool_calls": stats.num_tool_calls,
        "mean_tool_latency_s": stats.mean_tool_latency_s,
        "finish_reasons": writer.finish_counts,
        "kv_samples": stats.kv_samples,
    }
    write_json_atomic(out.with_name(out.stem + ".stats.json"), summary)
