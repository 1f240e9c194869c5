"""The async rollout driver: the scheduler, the engines, the agent loop and the tools, together.

`run_rollout` turns items (`{"id", "sample", "question", "answer"}`) into trajectory records. Its
loop is: ask the `Scheduler` what may generate now, send those generate requests (each a task),
wait for the next event (a generation or a tool result), update the `Trajectory` and the
scheduler, repeat. A tool call goes to the sandbox the moment its turn is parsed (`ToolBatcher`),
so a trajectory waiting for its tool never blocks an engine, and freed KV is handed to the next
trajectory at once (real-time refill). A sampler task records KV use over time (ledger and
engine-reported) and calls `on_tick` for progress displays. A failed request ends its trajectory
(`engine_error`); an engine that died (`errors.EngineDead`) or refuses a request the user must
change (a `UserError`) ends the run, raised to the caller, with the records finished before it
already handed to `on_record` and nothing after it. With `stop_when` a run ends early, between
requests, and hands back what it cut (partial rollout; `carried` takes them up again).

`rollout_session` holds the engines and the tool runner for a command's run and always shuts
both down. What it does not do: files, grading or printing (the `rollout` command does), or
choose engines (the scheduler does). `RolloutStats` holds what the benchmark reports: makespan,
per-engine busy time and idle fraction, preemptions (from engines' `metrics()`), tokens/s, tool
latency.
Tested with scripted engines in tests/unit/test_agent_loop.py and for real in
tests/integration/test_rollout_cli.py.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from rstar2cli.agent.loop import AgentConfig, Next, Trajectory, prompt_ids_for, shared_prompt_prefix
from rstar2cli.agent.tools import ToolBatcher, ToolRunner
from rstar2cli.errors import UserError
from rstar2cli.records import TrajectoryRecord
from rstar2cli.scheduler.scheduler import Scheduler, SchedulerConfig, Status


@dataclass
class Snapshot:
    """Live state for a progress display."""

    elapsed_s: float
    num_done: int
    num_total: int
    num_tool_in_flight: int
    ledger_used_tokens: list[int]
    engine_used_tokens: list[int]
    capacity_tokens: list[int]


@dataclass
class RolloutStats:
    policy: str
    kv_mode: str
    num_trajectories: int
    makespan_s: float
    num_generated_tokens: int
    engine_busy_s: list[float]
    num_preemptions: float
    num_migrations: int
    num_tool_calls: int
    tool_latency_s: list[float] = field(repr=False)
    kv_samples: list[tuple[float, list[int], list[int]]] = field(repr=False)
    max_ledger_used_tokens: list[int] = field(default_factory=list)
    capacity_tokens: list[int] = field(default_factory=list)
    # speculative decoding in this run: draft tokens verified, accepted, tried (RUN_COUNTERS)
    drafts: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # trajectories a `stop_when` run cut, each ready for its next generate request
    unfinished: list[Any] = field(default_factory=list, repr=False)

    @property
    def draft_acceptance(self) -> float | None:
        """The chance a draft token was accepted once the ones before it were (what
        benchmarks/scheduler/bench.py --sim-spec takes); None: nothing was drafted."""
        drafted, accepted, tried = self.drafts
        return accepted / max(tried, 1.0) if drafted else None

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def idle_fraction(self) -> float:
        total = self.makespan_s * len(self.engine_busy_s)
        return 1.0 - sum(self.engine_busy_s) / total if total > 0 else 0.0

    @property
    def mean_tool_latency_s(self) -> float:
        lat = self.tool_latency_s
        return sum(lat) / len(lat) if lat else 0.0


# the engines' counters a run reports its own share of: preemptions, then speculative decoding's
# draft tokens verified, accepted and tried (reached with every earlier draft token accepted)
RUN_COUNTERS = (
    "num_preemptions",
    "num_draft_tokens",
    "num_accepted_draft_tokens",
    "num_tried_draft_tokens",
)


def _counter_totals(engines: list[Any]) -> list[float]:
    """Each of RUN_COUNTERS as the engines' metrics have it now, summed over `engines`."""
    metrics = [e.metrics() for e in engines]
    return [sum(float(m.get(key, 0.0)) for m in metrics) for key in RUN_COUNTERS]


@asynccontextmanager
async def rollout_session(
    start_engines: Callable[[], list[Any] | Awaitable[list[Any]]], tool_runner: ToolRunner
) -> AsyncIterator[tuple[list[Any], ToolBatcher]]:
    """Engines and a tool batcher for one run of `run_rollout` (or many, as rl-stage does).

    On exit, error or interrupt included, the tool runner is closed and every engine that started
    is shut down, so no engine process or sandbox pool outlives the command; if the command is
    killed outright, `rstar2cli.procguard` kills them.
    """
    from rstar2cli.procguard import guard_descendants

    engines: list[Any] = []
    try:
        # NOTE: a stop asked for since the command armed its handlers lands here, not after an
        # engine start that may take minutes (a signal during the start ends it: procguard)
        await asyncio.sleep(0)
        started = start_engines()
        engines = await started if inspect.isawaitable(started) else started
        # NOTE: engine cores, Ray daemons and actors started so far die with this process, even
        # under kill -9 (they would otherwise live on under PID 1)
        guard_descendants()
        yield engines, ToolBatcher(tool_runner)
    finally:
        await tool_runner.close()
        for engine in engines:
            await engine.shutdown()


async def run_rollout(
    engines: list[Any],
    items: list[dict[str, Any]],
    tokenizer: Any,
    agent_config: AgentConfig,
    sched_config: SchedulerConfig,
    tools: ToolBatcher,
    on_record: Callable[[TrajectoryRecord], None],
    on_tick: Callable[[Snapshot], None] | None = None,
    sample_every_s: float = 0.5,
    make_trajectory: Callable[[dict[str, Any], list[int]], Any] | None = None,
    carried: Sequence[Trajectory] = (),
    stop_when: Callable[[], bool] | None = None,
) -> RolloutStats:
    """Roll out every item; `on_record` gets each finished trajectory record, in finish order.

    `make_trajectory(item, prompt_ids)` replaces `agent.loop.Trajectory` with another object of
    the same surface (benchmarks/scheduler/bench.py plays scripted workloads through real engines).
    Partial rollout: `carried` are trajectories an earlier run cut, going on from where they stand
    (under this run's `agent_config`); once `stop_when()` is true (asked after every event), no
    request is sent, the requests and tool calls in flight are waited for (a finished trajectory
    among them is still a record), and the rest are returned in `RolloutStats.unfinished`, each
    ready for its next generate request. In-flight requests are waited for, not aborted, so no
    engine is still generating for this run when it returns (the weights may change next); with
    `kv_mode` incremental each request is at most `step_tokens` long.
    """
    run = _Run(
        engines=engines,
        tokenizer=tokenizer,
        agent_config=agent_config,
        sched_config=sched_config,
        tools=tools,
        on_record=on_record,
    )
    if make_trajectory is not None:
        run.make_trajectory = make_trajectory
    for key, item in enumerate(items):
        run.add(key, item)
    for key, traj in enumerate(carried, start=len(items)):
        run.add_started(key, traj)
    run.stop_when = stop_when
    counted_before = _counter_totals(engines)
    sampler = asyncio.create_task(run.sample(on_tick, sample_every_s))
    try:
        await run.loop()
    finally:
        sampler.cancel()
        for task in list(run.tasks):
            task.cancel()
    run.take_sample(on_tick)
    return run.stats(
        sched_config, counted_before=counted_before, num_trajectories=len(items) + len(carried)
    )


def _siblings(item: dict[str, Any]) -> Any:
    """The scheduler's group for an item: the samples of one problem are siblings, and it
    predicts lengths from them."""
    return (item.get("benchmark"), item["id"]) if "id" in item else None


class _Run:
    """State of one `run_rollout` call."""

    def __init__(
        self,
        engines: list[Any],
        tokenizer: Any,
        agent_config: AgentConfig,
        sched_config: SchedulerConfig,
        tools: ToolBatcher,
        on_record: Callable[[TrajectoryRecord], None],
    ) -> None:
        self.engines = engines
        self.tokenizer = tokenizer
        self.config = agent_config
        self.tools = tools
        self.on_record = on_record
        # NOTE: one block size for the ledger; engines of one run share a model and a build
        block = max(e.kv_block_size_tokens() for e in engines)
        self.capacity_tokens = [e.kv_capacity_tokens() for e in engines]
        # engines with a prefix cache hold the system prompt's whole blocks once for every
        # request: the ledger counts them once per engine
        shared = 0
        if all(getattr(e, "shares_prefixes", False) for e in engines):
            shared = shared_prompt_prefix(tokenizer, agent_config.template) // block * block
        self.sched = Scheduler(
            self.capacity_tokens,
            sched_config,
            block_size_tokens=block,
            shared_prefix_tokens=shared,
        )
        self.trajs: dict[int, Trajectory] = {}
        self.events: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.num_steps: dict[int, int] = {}
        self.num_generated_tokens = 0
        self.kv_samples: list[tuple[float, list[int], list[int]]] = []
        self.tool_latency_offset = len(tools.latencies_s)
        self._prompt_cache: dict[str, list[int]] = {}
        self.start = time.monotonic()
        self.make_trajectory: Callable[[dict[str, Any], list[int]], Any] = lambda item, ids: (
            Trajectory(item, ids, tokenizer, agent_config)
        )
        self.stop_when: Callable[[], bool] | None = None

    def add(self, key: int, item: dict[str, Any]) -> None:
        question = str(item["question"])
        if question not in self._prompt_cache:
            self._prompt_cache[question] = prompt_ids_for(
                question, self.tokenizer, self.config.template
            )
        prompt_ids = self._prompt_cache[question]
        self.trajs[key] = self.make_trajectory(item, prompt_ids)
        self.sched.add(key, len(prompt_ids), self.config.max_response_tokens, _siblings(item))

    def add_started(self, key: int, traj: Trajectory) -> None:
        """A trajectory cut by an earlier run: its context so far counts as its prompt."""
        traj.config = self.config
        self.trajs[key] = traj
        self.sched.add(key, traj.num_tokens, traj.remaining_tokens, _siblings(traj.item))

    async def loop(self) -> None:
        self.start = time.monotonic()
        stopping = False
        while not self.sched.all_done:
            stopping = stopping or (self.stop_when is not None and self.stop_when())
            # NOTE: a finished task leaves `tasks` in a done callback that may not have run yet
            in_flight = any(not task.done() for task in self.tasks)
            if stopping and not in_flight and self.events.empty():
                return  # nothing in flight: what is left is cut
            if not stopping:
                for d in self.sched.schedule():
                    assert isinstance(d.key, int)  # this run's keys are item indices
                    self._spawn(self._generate(d.key, d.engine, d.max_tokens))
                if self.events.empty() and all(task.done() for task in self.tasks):
                    raise RuntimeError(self._stalled())
            kind, key, payload = await self.events.get()
            if kind == "fatal":
                raise payload
            if kind == "gen":
                self._on_generated(key, payload)
            else:
                self._on_tool(key, payload)

    def _stalled(self) -> str:
        """What to say when nothing is in flight and the scheduler starts nothing: every event
        comes from a task, so the loop would otherwise wait forever."""
        left = [s for s in self.sched.slots.values() if s.status is not Status.DONE]
        return (
            f"the scheduler placed none of the {len(left)} unfinished trajectories and nothing is "
            f"in flight (policy {self.sched.config.policy}, kv_mode {self.sched.config.kv_mode}); "
            "stopping instead of waiting forever"
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _generate(self, key: int, engine: int, max_tokens: int) -> None:
        traj = self.trajs[key]
        step = self.num_steps.get(key, 0)
        self.num_steps[key] = step + 1
        try:
            out = await self.engines[engine].generate(
                f"t{key}-s{step}", traj.context_ids, traj.sampling_spec(max_tokens)
            )
        except UserError as exc:  # the engine died or refused: no request there can succeed
            self.events.put_nowait(("fatal", key, exc))
            return
        except Exception:  # noqa: BLE001 - a failed request ends this trajectory only
            out = None
        self.events.put_nowait(("gen", key, out))

    async def _tool(self, key: int, job: Any) -> None:
        try:
            result = await self.tools.run(job)
        except UserError as exc:  # the sandbox refused this client: no call can succeed
            self.events.put_nowait(("fatal", key, exc))
            return
        self.events.put_nowait(("tool", key, result))

    def _on_generated(self, key: int, out: Any) -> None:
        traj = self.trajs[key]
        if out is None:
            nxt = traj.finish("engine_error")
        else:
            self.num_generated_tokens += len(out.token_ids)
            nxt = traj.on_generated(out)
        status = {Next.DONE: Status.DONE, Next.TOOL: Status.TOOL, Next.GENERATE: Status.WAITING}[
            nxt
        ]
        self.sched.on_generated(key, traj.num_tokens, status)
        if nxt == Next.DONE:
            self._emit(key)
        elif nxt == Next.TOOL:
            job = traj.tool_job()
            if job is None:  # malformed call: answered at once, no sandbox round trip
                self._on_tool(key, None)
            else:
                self._spawn(self._tool(key, job))

    def _on_tool(self, key: int, result: Any) -> None:
        traj = self.trajs[key]
        if traj.on_tool_result(result) == Next.DONE:
            self.sched.finish(key)
            self._emit(key)
        else:
            self.sched.on_tool_done(key, traj.num_tokens)

    def _emit(self, key: int) -> None:
        traj = self.trajs.pop(key)
        self.on_record(traj.record())

    async def sample(self, on_tick: Callable[[Snapshot], None] | None, every_s: float) -> None:
        while True:
            self.take_sample(on_tick)
            await asyncio.sleep(every_s)

    def stats(
        self, sched_config: SchedulerConfig, counted_before: list[float], num_trajectories: int
    ) -> RolloutStats:
        """What the run did, its engines' counters taken against `counted_before`."""
        preemptions, *drafts = (
            a - b for a, b in zip(_counter_totals(self.engines), counted_before, strict=True)
        )
        s = self.sched
        return RolloutStats(
            policy=sched_config.policy,
            kv_mode=sched_config.kv_mode,
            num_trajectories=num_trajectories,
            makespan_s=time.monotonic() - self.start,
            num_generated_tokens=self.num_generated_tokens,
            engine_busy_s=[s.busy_s(e) for e in range(len(self.engines))],
            num_preemptions=preemptions,
            num_migrations=s.num_migrations,
            num_tool_calls=len(self.tools.latencies_s) - self.tool_latency_offset,
            tool_latency_s=self.tools.latencies_s[self.tool_latency_offset :],
            kv_samples=self.kv_samples,
            max_ledger_used_tokens=[self._with_prefix(u) for u in s.ledger.max_used_tokens],
            drafts=(drafts[0], drafts[1], drafts[2]),
            capacity_tokens=list(self.capacity_tokens),
            unfinished=list(self.trajs.values()),
        )

    def _with_prefix(self, ledger_tokens: int) -> int:
        """An engine's ledger use as KV: its reservations and, under any, the shared prefix."""
        return ledger_tokens + (self.sched.shared_prefix_tokens if ledger_tokens else 0)

    def take_sample(self, on_tick: Callable[[Snapshot], None] | None) -> None:
        n = len(self.engines)
        ledger = [self._with_prefix(self.sched.ledger.used(e)) for e in range(n)]
        engine_used = [int(e.kv_used_tokens()) for e in self.engines]
        elapsed = time.monotonic() - self.start
        self.kv_samples.append((elapsed, ledger, engine_used))
        if on_tick is not None:
            on_tick(
                Snapshot(
                    elapsed_s=elapsed,
                    num_done=self.sched.num_done,
                    num_total=len(self.sched.slots),
                    num_tool_in_flight=self.tools.num_in_flight,
                    ledger_used_tokens=ledger,
                    engine_used_tokens=engine_used,
                    capacity_tokens=list(self.capacity_tokens),
                )
            )
