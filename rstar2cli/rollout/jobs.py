"""One rollout job: the path `rollout`, `eval`, `filter-hard` and `rl-stage` all take.

A job turns problems into graded trajectory records:

    make_items      sample s = 0..n-1 of every problem, pairs already done skipped
    run_rollout     the KV-aware scheduler, the agent loop and the tools on the engines
                    (`rstar2cli.rollout.driver`)
    GradedSink      the paper's binary reward, read from the model's own text only, then the rows
                    go to the caller's writer

Seeds: a request's sampling seed is a function of (seed, pass, problem id, sample, turn):
`seed_base(seed, step)` names the pass (a command's run is step 0; rl-stage's step k is k, its
held-out eval after k steps another namespace) and `agent.loop.sample_seed` mixes in the rest.
The same problem, sample and seed therefore draw the same stream in every command.

Reward hacking guard: grading reads `graded_text(record)`, the model-authored turns (loss mask 1)
with their tool calls cut out, never the tool output. A tool that prints
`<answer>\\boxed{42}</answer>` earns nothing.

`run_command_job` is the whole run of a one-shot command: engines and tools up, one progress line,
and interrupts. Ctrl-C or SIGTERM stops the run: records finished before it are written, nothing
finishing after it is (an engine killed by the same Ctrl-C cannot turn unfinished work into
`engine_error` rows), and `Interrupted` (exit 130) tells the user to rerun, which resumes. An
engine that dies (`errors.EngineDead`) stops the run the same way, with a one-line error (exit 2)
that says to rerun; one that refuses a request (a `UserError`) stops it with its own error.

What it does not do: parse options (`rstar2cli.options`), check inputs (`rstar2cli.preflight`),
or decide what a row looks like on disk (callers pass `decorate` and `write`).
Tested in tests/unit/test_rollout_job.py (scripted engine, real in-process sandbox, real grader)
and through each command's integration test.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2cli import protocol as P
from rstar2cli.errors import EngineDead, UserError
from rstar2cli.records import GradedRecord, TrajectoryRecord

if TYPE_CHECKING:
    from rstar2cli.agent.loop import AgentConfig
    from rstar2cli.scheduler.scheduler import SchedulerConfig

# NOTE: the agent loop's request seed is base + 1000 * sample + turn; 2**26 per step leaves room
# for 67k samples of up to 1000 turns each before two steps could share a seed. Layout of a base:
# seed (bits 41+) | eval pass (bit 40) | step (bits 26-39, so up to 16384 steps).
_STEP_SPAN = 2**26
_MAX_STEPS = 2**14
_EVAL_BIT = 2**40


class Interrupted(UserError):
    """Ctrl-C or SIGTERM during a run: finished work is kept, the command exits 130."""

    exit_code = 130


def scheduler_config(settings: Any, **extra: Any) -> SchedulerConfig:
    """The scheduler's settings from a command's shared options or an RL recipe's rollout
    section: both name the policy `scheduler` and the rest as SchedulerConfig does."""
    from rstar2cli.scheduler.scheduler import SchedulerConfig

    return SchedulerConfig(
        policy=settings.scheduler,
        kv_mode=settings.kv_mode,
        kv_overcommit=settings.kv_overcommit,
        admission=settings.admission,
        tail_kv_fraction=settings.tail_kv_fraction,
        **extra,
    )


def seed_base(seed: int, step: int = 0, eval_pass: bool = False) -> int:
    """Seed namespace of one pass: a command's run (step 0), an RL step, or its held-out eval."""
    if not 0 <= step < _MAX_STEPS:
        raise ValueError(f"step must be in [0, {_MAX_STEPS}), got {step}")
    return (seed % 2**20) * 2 * _EVAL_BIT + (_EVAL_BIT if eval_pass else 0) + step * _STEP_SPAN


def make_items(
    problems: list[dict[str, Any]],
    num_samples: int,
    done: Iterable[tuple[str, int]] = (),
) -> list[dict[str, Any]]:
    """Rollout items: samples 0..num_samples-1 of each problem, in problem order, minus `done`
    (id, sample) pairs (what a resumed run already wrote). A problem listed twice (an RL batch
    that wraps around its epoch) gets samples num_samples..2*num_samples-1 the second time, so
    (id, sample) stays a unique key and each sample its own seed."""
    finished = set(done)
    seen: dict[str, int] = {}
    items = []
    for p in problems:
        pid = str(p["id"])
        first = seen.get(pid, 0) * num_samples
        seen[pid] = seen.get(pid, 0) + 1
        for s in range(first, first + num_samples):
            if (pid, s) not in finished:
                items.append({**p, "sample": s})
    return items


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


def graded_text(record: TrajectoryRecord) -> str:
    """What the answer is read from: the model's own turns, tool calls cut out."""
    return P.answer_region(record["model_text"])


class GradedSink:
    """Takes finished records (`add`), grades those with a reference and hands rows to `write`
    in batches (every `flush_every` records or `flush_every_s` seconds; None: only on `flush`).

    A graded row (`records.GradedRecord`) gets `reward` (1.0 / 0.0), `correct`, `grade_status`
    and `extracted` (the answer the grader read). `decorate(row)` shapes what `write` gets (a
    caller's fields added, or a shorter row). Without `write`, rows collect in `rows`. After
    `close_intake()` (an interrupt) records are counted in `num_dropped`, not kept.
    """

    def __init__(
        self,
        grader: Any,
        write: Callable[[Sequence[Mapping[str, Any]]], None] | None = None,
        decorate: Callable[[GradedRecord], Mapping[str, Any]] | None = None,
        flush_every: int | None = 16,
        flush_every_s: float = 2.0,
    ):
        self.grader, self.write, self.decorate = grader, write, decorate
        self.flush_every, self.flush_every_s = flush_every, flush_every_s
        self.rows: list[GradedRecord] = []
        self.buffer: list[TrajectoryRecord] = []
        self.last_flush = time.monotonic()
        self.num_written = self.num_graded = self.num_correct = self.num_dropped = 0
        self.finish_counts: dict[str, int] = {}
        self.grade_s = 0.0
        self.accepting = True

    def add(self, record: TrajectoryRecord) -> None:
        if not self.accepting:
            self.num_dropped += 1
            return
        self.buffer.append(record)
        reason = str(record["finish_reason"])
        self.finish_counts[reason] = self.finish_counts.get(reason, 0) + 1
        due = self.flush_every is not None and (
            len(self.buffer) >= self.flush_every
            or time.monotonic() - self.last_flush > self.flush_every_s
        )
        if due:
            self.flush()

    def close_intake(self) -> None:
        self.accepting = False

    def flush(self) -> None:
        if self.buffer:
            records, self.buffer = self.buffer, []
            rows = self._grade(records)
            if self.write is None:
                self.rows += rows
            elif self.decorate is None:
                self.write(rows)
            else:
                self.write([self.decorate(r) for r in rows])
            self.num_written += len(rows)
        self.last_flush = time.monotonic()

    def _grade(self, records: list[TrajectoryRecord]) -> list[GradedRecord]:
        """`records` in order, those with a reference answer graded (the others as they are)."""
        to_grade = [r for r in records if r.get("answer") is not None]
        if not to_grade:
            return [{**r} for r in records]
        began = time.perf_counter()
        results = self.grader.grade_batch(
            [(graded_text(r), str(r["answer"])) for r in to_grade],
            [r["finish_reason"] for r in to_grade],
        )
        graded: list[GradedRecord] = [
            {
                **record,
                "reward": 1.0 if result.correct else 0.0,
                "correct": bool(result.correct),
                "grade_status": result.status,
                "extracted": result.extracted,
            }
            for record, result in zip(to_grade, results, strict=True)
        ]
        self.num_graded += len(to_grade)
        self.num_correct += sum(1 for r in results if r.correct)
        self.grade_s += time.perf_counter() - began
        in_order = iter(graded)
        return [{**r} if r.get("answer") is None else next(in_order) for r in records]


async def rollout_and_grade(
    engines: list[Any],
    items: list[dict[str, Any]],
    tokenizer: Any,
    agent_config: Any,
    sched_config: Any,
    tools: Any,
    sink: GradedSink,
    on_tick: Callable[[Any], None] | None = None,
    on_record: Callable[[TrajectoryRecord], None] | None = None,
    carried: Sequence[Any] = (),
    stop_when: Callable[[], bool] | None = None,
) -> Any:
    """Roll `items` out on running engines into `sink` (flushed at the end); `on_record` is told
    of each finished record too. Returns the driver's `RolloutStats`. `carried` and `stop_when`:
    partial rollout (`driver.run_rollout`)."""
    from rstar2cli.rollout.driver import run_rollout

    def take(record: TrajectoryRecord) -> None:
        sink.add(record)
        if on_record is not None:
            on_record(record)

    stats = await run_rollout(
        engines=engines,
        items=items,
        tokenizer=tokenizer,
        agent_config=agent_config,
        sched_config=sched_config,
        tools=tools,
        on_record=take,
        on_tick=on_tick,
        carried=carried,
        stop_when=stop_when,
    )
    sink.flush()
    return stats


def in_item_order(rows: list[GradedRecord], items: list[dict[str, Any]]) -> list[GradedRecord]:
    """Rows sorted as their items were (finish order is not reproducible; item order is)."""
    rank = {(str(it["id"]), int(it["sample"])): i for i, it in enumerate(items)}
    return sorted(rows, key=lambda r: rank[(str(r["id"]), int(r["sample"]))])


def run_command_job(
    *,
    name: str,
    console: Any,
    out: Path,
    items: list[dict[str, Any]],
    fit: Any,
    start_engines: Callable[[], Any],
    tool_urls: list[str],
    sched_config: Any,
    decorate: Callable[[GradedRecord], Mapping[str, Any]] | None = None,
) -> tuple[Any, GradedSink]:
    """A one-shot command's run: engines and tools up, `items` rolled out with a progress line,
    graded rows (`decorate`d) appended to `out` as they finish, everything shut down. `fit` is the
    pre-flight's `options.Fitted` (tokenizer, resolved arguments). Returns (`RolloutStats`, the
    sink with its counts); raises `Interrupted` on Ctrl-C / SIGTERM after writing what had
    finished."""
    from rstar2cli.fileio import JsonlAppender
    from rstar2cli.reward.grader import Grader

    with Grader(num_workers=1, strict=True) as grader, JsonlAppender(out) as appender:
        sink = GradedSink(grader, write=appender.write_batch, decorate=decorate)
        agent_config = fit.args.agent_config(seed_base(fit.args.seed))
        job = _CommandRun(
            name=name,
            console=console,
            items=items,
            tokenizer=fit.tokenizer,
            agent_config=agent_config,
            sched_config=sched_config,
            sink=sink,
        )
        token_file = fit.args.sandbox_token_file
        stats = job.run(start_engines=start_engines, tool_urls=tool_urls, token_file=token_file)
        return stats, sink


class _CommandRun:
    """The event loop of `run_command_job`, and what an interrupt leaves behind."""

    def __init__(
        self,
        *,
        name: str,
        console: Any,
        items: list[dict[str, Any]],
        tokenizer: Any,
        agent_config: AgentConfig,
        sched_config: SchedulerConfig,
        sink: GradedSink,
    ) -> None:
        self.name, self.console, self.items = name, console, items
        self.tokenizer, self.agent_config, self.sched_config = tokenizer, agent_config, sched_config
        self.sink = sink
        self.stop = StopSignals()

    def run(
        self,
        start_engines: Callable[[], Any],
        tool_urls: list[str],
        token_file: Path | None = None,
    ) -> Any:
        try:
            return asyncio.run(self._main(start_engines, tool_urls, token_file))
        except BaseException as exc:
            stopped = self.stop.stopped(exc)  # an engine killed by the same Ctrl-C is no news
            if not stopped and not isinstance(exc, UserError):
                raise
            self.sink.close_intake()
            self.sink.flush()
            kept = (
                f"{self.sink.num_written} finished trajectories kept, "
                f"{len(self.items) - self.sink.num_written} not run; rerun the same command to "
                "resume"
            )
            if stopped:
                raise Interrupted(f"interrupted: {kept}") from None
            if isinstance(exc, EngineDead):
                raise EngineDead(f"{exc}; {kept}") from None
            raise  # a refusal: the same command would be refused again
        finally:
            self.stop.disarm()

    async def _main(
        self, start_engines: Callable[[], Any], tool_urls: list[str], token_file: Path | None
    ) -> Any:
        from rstar2cli.agent.tools import make_tool_runner
        from rstar2cli.rollout.driver import rollout_session

        self.stop.arm(self.sink.close_intake)
        tools = make_tool_runner(
            tool_urls, timeout_s=self.agent_config.tool_timeout_s, token_file=token_file
        )
        async with rollout_session(start_engines, tools) as (engines, batcher):
            with RolloutProgress(self.name, self.console, len(self.items)) as progress:
                stats = await rollout_and_grade(
                    engines=engines,
                    items=self.items,
                    tokenizer=self.tokenizer,
                    agent_config=self.agent_config,
                    sched_config=self.sched_config,
                    tools=batcher,
                    sink=self.sink,
                    on_tick=progress.tick,
                    on_record=lambda _: progress.done(),
                )
            _report_engine_errors(self.console, engines)
            _report_speculation(self.console, stats)
            return stats


def _report_engine_errors(console: Any, engines: list[Any]) -> None:
    from rich.markup import escape

    for e in engines:
        last = getattr(e, "last_error", None)
        if last:
            num = e.metrics().get("num_errors", 0)
            console.print(f"[yellow]{e.name}: {num:.0f} failed requests, last: {escape(last)}[/]")


def _report_speculation(console: Any, stats: Any) -> None:
    """One line on how speculative decoding went, when any engine drafted."""
    drafted, accepted, _ = stats.drafts
    if drafted:
        console.print(
            f"speculative decoding: {accepted:.0f} of {drafted:.0f} draft tokens accepted "
            f"({accepted / drafted:.0%}), {stats.draft_acceptance:.2f} of those tried"
        )


class StopSignals:
    """SIGINT and SIGTERM during a run: the first calls `before` and cancels the run's main task
    (its cleanup shuts the engines down); a second one raises KeyboardInterrupt at once.

    `arm()` inside the running loop's main task, `disarm()` once the loop is done (it puts the
    earlier handlers back). Armed even where the shell started the command with SIGINT ignored (a
    background job): a stop signal must stop the command cleanly (vLLM's engine processes never
    see SIGINT, procguard.start_deaf_to_sigint, but an engine of another kind may). `requested`
    tells the caller that an error came from such a stop (an engine that died of the same Ctrl-C
    while it started). Main thread only; elsewhere a no-op.
    """

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def arm(self, before: Callable[[], None] = lambda: None) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None

        def handler(signum: int, frame: Any) -> None:
            if self.requested:
                raise KeyboardInterrupt  # asked twice: stop now
            self.requested = True
            before()
            loop.call_soon_threadsafe(task.cancel)

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, handler)

    def disarm(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def stopped(self, exc: BaseException) -> bool:
        """Did the run end because of a stop signal?"""
        return self.requested or isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError))


class RolloutProgress:
    """One progress line for every rollout: trajectories done, tool calls in flight, KV use
    (reserved by the scheduler / used by the engine) per engine."""

    def __init__(self, name: str, console: Any, total: int):
        from rstar2cli.ui import progress_bar

        self.progress = progress_bar(name, "{task.description}", console=console)
        self.task = self.progress.add_task("starting", total=total)

    def __enter__(self) -> RolloutProgress:
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
