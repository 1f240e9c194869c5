"""Scripted trajectories for the scheduler benchmark's part (a) on real engines (scheduler_real.py).

The random tiny model cannot be asked to write tool calls, so part (a) scripts them: a
`ScriptedTrajectory` has the `agent.loop.Trajectory` surface `rollout.driver.run_rollout` drives,
with its turn lengths and tool calls (a sandbox job that sleeps a scripted time) fixed in advance;
generation, KV, preemption, sandbox and scheduling stay real. `real_workload` draws a
heavy-tailed multi-turn workload of them (turns up to `max_response`, 1-4 turns, lognormal tool
latencies; the samples of one prompt share its difficulty). Nothing here starts an engine.
Exercised only by the benchmark itself (it needs real engines).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2cli.engines.base import GenOutput, SamplingSpec
    from sandboxd.wire import Job, JobResult


class ScriptedTrajectory:
    """The `agent.loop.Trajectory` surface with scripted turn lengths and tool calls."""

    def __init__(
        self, item: dict[str, Any], prompt_ids: list[int], tokenizer: Any, max_response: int
    ) -> None:
        from rstar2cli import protocol as P

        self.P, self.tok, self.item = P, tokenizer, item
        self.prompt_ids, self.response_ids = list(prompt_ids), list[int]()
        self.turns: list[int] = item["turns"]
        self.tool_s: list[float] = item["tool_s"]
        self.turn, self.turn_left = 0, self.turns[0]
        self.max_response = max_response
        self.stop_id = tokenizer.convert_tokens_to_ids(P.IM_END)
        self.finish_reason: str | None = None
        self.num_tool_calls = 0

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def sampling_spec(self, max_tokens: int | None = None) -> SamplingSpec:
        from rstar2cli.engines.base import SamplingSpec

        left = self.max_response - len(self.response_ids)
        cap = min(self.turn_left, left, max_tokens or left)
        return SamplingSpec(
            max_tokens=max(cap, 1),
            temperature=1.0,
            seed=hash((self.item["id"], self.item["sample"])) % 10**6,
        )

    def on_generated(self, out: GenOutput) -> str:
        if out.finish_reason in ("error", "abort"):
            return self.finish("engine_error")
        self.response_ids += out.token_ids
        self.turn_left -= len(out.token_ids)
        if out.token_ids and out.token_ids[-1] == self.stop_id:
            self.turn_left = 0  # the model ended its turn early: fine, a real outcome
        if len(self.response_ids) >= self.max_response:
            return self.finish("budget")
        if self.turn_left > 0:
            return "generate"
        if self.turn + 1 < len(self.turns):
            return "tool"
        return self.finish("answer")

    def tool_job(self) -> Job:
        from sandboxd.wire import Job

        return Job(
            code=f"import time\ntime.sleep({self.tool_s[self.turn]:.3f})\nprint({self.turn} * 7)"
        )

    def on_tool_result(self, result: JobResult) -> str:
        self.num_tool_calls += 1
        chunk = self.P.render_tool_response(
            self.P.format_tool_output(result.status, result.stdout, result.stderr)
        )
        ids = self.tok.encode(chunk, add_special_tokens=False)
        self.turn += 1
        self.turn_left = self.turns[self.turn]
        if len(self.response_ids) + len(ids) >= self.max_response:
            return self.finish("budget")
        self.response_ids += ids
        return "generate"

    def finish(self, reason: str) -> str:
        self.finish_reason = reason
        return "done"

    def record(self) -> dict[str, Any]:
        return {
            "id": self.item["id"],
            "sample": self.item["sample"],
            "num_tokens": self.num_tokens,
            "finish_reason": self.finish_reason,
        }


def real_workload(
    *, num_prompts: int, num_samples: int, max_response: int, seed: int
) -> list[dict[str, Any]]:
    """Part (a)'s items: per prompt `num_samples` samples (its group), each with its scripted
    turn lengths (`turns`) and tool latencies (`tool_s`)."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    for p in range(num_prompts):
        difficulty = rng.lognormvariate(math.log(max_response / 5), 0.7)
        for s in range(num_samples):
            total = int(min(max_response, max(16, difficulty * rng.lognormvariate(0, 0.5))))
            num_turns = min(4, 1 + int(rng.expovariate(1.0) * total / (max_response / 4)))
            cuts = sorted(rng.random() for _ in range(num_turns - 1))
            turns = [
                max(4, int(total * (b - a)))
                for a, b in zip([0.0, *cuts], [*cuts, 1.0], strict=False)
            ]
            tool_s = [
                min(3.0, rng.lognormvariate(math.log(0.3) - 0.5, 1.0)) for _ in range(num_turns - 1)
            ]
            items.append(
                {
                    "id": f"p{p}",  # the problem: its samples are one group
                    "sample": s,
                    "question": f"Problem {p}: compute {p}*{p + 7}.",
                    "turns": turns,
                    "tool_s": tool_s,
                }
            )
    return items
