"""Scripted trajectories for the scheduler benchmark's part (a) on real engines (scheduler/real.py).

The random tiny model cannot be asked to write tool calls, so part (a) scripts them: a
`ScriptedTrajectory` has the `agent.loop.Trajectory` surface `rollout.driver.run_rollout` drives,
with its turn lengths and tool calls (a job that sleeps a scripted time: `ScriptedJob`, run by
the sandbox or, sleeping in the event loop, by `SleepTools`) fixed in advance; generation, KV,
preemption and scheduling stay real. `real_workload` draws a
heavy-tailed multi-turn workload of them (turns up to `max_response`, 1-4 turns, lognormal tool
latencies; the samples of one prompt share its difficulty); `replay_items` makes them from a
recorded workload (benchmarks/sim/replay.py), to be run with `forced=True`: each turn then has
exactly its recorded length (`SamplingSpec.ignore_eos`), each tool call sleeps its recorded
latency and prints digits sized so that its response chunk has about the recorded token count.
NOTE: a chunk's tokens on the engine are those of the sandbox's real answer, re-tokenized; they
equal the recorded count only where the engine's tokenizer spells each digit as one token (the
project's tiny tokenizer and Qwen's do) and the count exceeds the chunk's frame.
`warm_up` puts a run's prompts in every engine's prefix cache before it is timed.
Nothing here starts an engine. Tested in tests/unit/test_replay.py (with a fake tokenizer);
on real engines only by the benchmark itself.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandboxd.wire import Job, JobResult

if TYPE_CHECKING:
    from benchmarks.sim.replay import Replay
    from rstar2cli.engines.base import GenOutput, SamplingSpec


@dataclass
class ScriptedJob(Job):
    """A scripted tool call: its code sleeps `sleep_s` and prints `stdout`."""

    sleep_s: float = 0.0
    stdout: str = ""


class SleepTools:
    """An `agent.tools.ToolRunner` for scripted calls that only waits: each `ScriptedJob` sleeps
    its latency in the event loop and answers what its code would print. On a cluster the
    sandbox runs on CPU nodes of its own; on this host its forks would take the engines' cores
    (4 engines on 2 cores: a 6 ms call took 0.3-1.1 s), a cost the simulator does not model."""

    async def run_batch(
        self, jobs: list[Job], on_result: Callable[[int, JobResult], None] | None = None
    ) -> list[JobResult]:
        async def one(i: int, job: Job) -> JobResult:
            assert isinstance(job, ScriptedJob), "SleepTools runs scripted calls only"
            await asyncio.sleep(job.sleep_s)
            result = JobResult(
                status="ok", stdout=job.stdout, stderr="", exit_code=0, duration_s=job.sleep_s
            )
            if on_result is not None:
                on_result(i, result)
            return result

        return list(await asyncio.gather(*(one(i, j) for i, j in enumerate(jobs))))

    async def close(self) -> None:
        pass


class ScriptedTrajectory:
    """The `agent.loop.Trajectory` surface with scripted turn lengths and tool calls.

    `forced`: every turn runs to its scripted length (the engine ignores `<|im_end|>`); else a
    turn may end early where the model writes it. An item with `chunks` (tool-response tokens
    after each turn) has its tools print `chunk_digits` digits; without, `turn * 7`."""

    def __init__(
        self,
        item: dict[str, Any],
        prompt_ids: list[int],
        tokenizer: Any,
        max_response: int,
        forced: bool = False,
    ) -> None:
        from rstar2cli import protocol as P

        self.P, self.tok, self.item, self.forced = P, tokenizer, item, forced
        self.prompt_ids, self.response_ids = list(prompt_ids), list[int]()
        self.turns: list[int] = item["turns"]
        self.tool_s: list[float] = item["tool_s"]
        self.chunks: list[int] | None = item.get("chunks")
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
            ignore_eos=self.forced,
        )

    def on_generated(self, out: GenOutput) -> str:
        if out.finish_reason in ("error", "abort"):
            return self.finish("engine_error")
        if out.finish_reason == "length" and not out.token_ids:
            return self.finish("budget")  # the engine's context limit: asking again gets nothing
        self.response_ids += out.token_ids
        self.turn_left -= len(out.token_ids)
        if not self.forced and out.token_ids and out.token_ids[-1] == self.stop_id:
            self.turn_left = 0  # the model ended its turn early: fine, a real outcome
        if len(self.response_ids) >= self.max_response:
            return self.finish("budget")
        if self.turn_left > 0:
            return "generate"
        if self.turn + 1 < len(self.turns):
            return "tool"
        return self.finish("answer")

    def tool_job(self) -> ScriptedJob:
        printed = str(self.turn * 7)
        if self.chunks is not None:
            printed = "0" * chunk_digits(self.chunks[self.turn], self.tok)
        sleep_s = round(self.tool_s[self.turn], 3)
        return ScriptedJob(
            code=f"import time\ntime.sleep({sleep_s})\nprint({printed!r})",
            sleep_s=sleep_s,
            stdout=printed + "\n",
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


def chunk_digits(chunk_tokens: int, tokenizer: Any) -> int:
    """Digits a tool prints so that its response chunk has about `chunk_tokens` tokens: the
    count less the chunk's frame (its tokens around a one-digit output, less that digit); at
    least one."""
    from rstar2cli import protocol as P

    one = P.render_tool_response(P.format_tool_output("ok", "0\n", ""))
    frame = len(tokenizer.encode(one, add_special_tokens=False)) - 1
    return max(1, chunk_tokens - frame)


def replay_items(replays: list[Replay], tokenizer: Any) -> list[dict[str, Any]]:
    """Items that play recorded trajectories (`sim.replay.Replay`) on real engines, for
    `ScriptedTrajectory(..., forced=True)`: their turns, tool latencies and tool-response
    tokens (`chunks`), and a question padded with digits to about the recorded prompt length
    (after a per-group head, so only the samples of one prompt share a prompt prefix)."""
    from rstar2cli.agent.loop import prompt_ids_for

    items: list[dict[str, Any]] = []
    for r in replays:
        head = f"Problem {r.group}: "
        pad = max(0, r.prompt_tokens - len(prompt_ids_for(head, tokenizer)))
        items.append(
            {
                "id": str(r.group),
                "sample": r.sample,
                "question": head + "0" * pad,
                "turns": list(r.turns),
                "chunks": list(r.chunks),
                "tool_s": list(r.tool_s),
            }
        )
    return items


async def warm_up(engines: list[Any], sandbox: Any, items: list[dict], tok: Any) -> None:
    """Start the sandbox (if it runs the tools) and put every prompt in every engine's prefix
    cache, so the first policy measured pays no start-up cost the later ones skip."""
    from rstar2cli.agent.loop import prompt_ids_for
    from rstar2cli.engines.base import SamplingSpec

    if not isinstance(sandbox, SleepTools):
        await sandbox.run_batch([Job("print(1)"), Job("print(2)")])
    prompts = {i["question"]: prompt_ids_for(i["question"], tok) for i in items}
    spec = SamplingSpec(max_tokens=1)
    await asyncio.gather(
        *(
            e.generate(f"warm{j}-{k}", ids, spec)
            for j, e in enumerate(engines)
            for k, ids in enumerate(prompts.values())
        )
    )
