"""Rollout helpers shared by `rl-stage` (training and held-out eval) and `filter-hard`.

- `drop_long_prompts`: problems whose prompt is over the length limit dropped (and counted).
- `request_seed_base`: the sampling seed namespace of one (seed, step): the agent loop mixes in
  the problem id, 1000 x sample and the turn, and `make_items` numbers samples p * n + s, so every request's seed is a
  function of (seed, step, problem position, sample, turn) and a rerun reproduces it.
- `rollout_and_grade`: the rollout core (`rstar2cli.scheduler.rollout.run_rollout`) plus the
  binary reward, returning records sorted by sample number (finish order is not reproducible).

What it does not do: start or stop engines and sandboxes (callers own them), write files.
Exercised by tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# NOTE: the agent loop's request seed is base + 1000 * sample + turn; 2**26 per step leaves room
# for 67k samples of up to 1000 turns each before two steps could share a seed.
_STEP_SPAN = 2**26
_EVAL_OFFSET = 2**14


def request_seed_base(seed: int, step: int, eval_pass: bool = False) -> int:
    """Seed namespace of one step's rollouts (or of the held-out eval after `step` steps)."""
    slot = step + (_EVAL_OFFSET if eval_pass else 0)
    return (seed % 2**20) * 2**40 + slot * _STEP_SPAN


def drop_long_prompts(
    problems: list[dict[str, Any]], tokenizer: Any, template: str, max_prompt_tokens: int
) -> tuple[list[dict[str, Any]], int]:
    """Problems whose rendered prompt fits `max_prompt_tokens`, and how many were dropped."""
    from rstar2cli.agent.loop import prompt_ids_for

    kept = [
        p
        for p in problems
        if len(prompt_ids_for(p["question"], tokenizer, template)) <= max_prompt_tokens
    ]
    return kept, len(problems) - len(kept)


def make_items(problems: list[dict[str, Any]], num_samples: int) -> list[dict[str, Any]]:
    """Rollout items: sample number p * num_samples + s for problem position p, sample s."""
    return [
        {**prob, "sample": p * num_samples + s}
        for p, prob in enumerate(problems)
        for s in range(num_samples)
    ]


async def rollout_and_grade(
    engines: list[Any],
    items: list[dict[str, Any]],
    tokenizer: Any,
    agent_config: Any,
    sched_config: Any,
    tools: Any,
    grader: Any,
    on_tick: Callable[[Any], None] | None = None,
) -> tuple[list[dict[str, Any]], Any, float]:
    """Roll out `items`, grade them; returns (records sorted by sample, RolloutStats, grade seconds).

    Each record gets "reward" (1.0 / 0.0) and "grade_status".
    """
    import time

    from rstar2cli.scheduler.rollout import run_rollout

    records: list[dict[str, Any]] = []
    stats = await run_rollout(
        engines,
        items,
        tokenizer,
        agent_config,
        sched_config,
        tools,
        on_record=records.append,
        on_tick=on_tick,
    )
    records.sort(key=lambda r: int(r["sample"]))
    began = time.perf_counter()
    results = grader.grade_batch(
        [(r["text"], r["answer"]) for r in records], [r["finish_reason"] for r in records]
    )
    for record, result in zip(records, results, strict=False):
        record["reward"] = 1.0 if result.correct else 0.0
        record["grade_status"] = result.status
    return records, stats, time.perf_counter() - began
