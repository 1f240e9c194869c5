"""A discrete-event model of rollout engines, driven by the real `Scheduler` (cluster scale).

Used by benchmarks/scheduler.py part (b). Each simulated engine behaves like vLLM's scheduler in
the ways that matter here: continuous batching (requests join and leave between steps), a KV
capacity in tokens, recompute preemption when the running batch outgrows it (the newest request
loses its KV and is re-prefilled later, prompt + everything generated so far; the prefill stalls
the whole batch for that step), a prefix cache (a trajectory's next turn on the same engine
prefills only its new tokens), and a `max_num_seqs` cap. The prefix cache is bounded as in vLLM:
a finished request's blocks stay cached only while they are free and unclaimed, so the cache
lives in the KV the running batch does not use, and the least recently used entries are evicted
as the batch grows (an engine packed full of running requests loses the cached prefixes of the
trajectories waiting for tools; a ledger reservation does not pin them either). Step time is a cost model:

    step_s = a + b * batch + c * sum(context)      prefill_s = p * prefill tokens

with (a, b, c, p) fitted to the real engines of part (a). Time advances in macro steps: the batch
is constant until the first request in it finishes, KV runs out, or `MAX_MACRO_STEPS` pass
(arrivals wait at most that long). Tools run on an unbounded sandbox with sampled latencies.

What it does not model: chunked prefill interleaving, network, stragglers among engines.
"""

from __future__ import annotations

import heapq
import math
import random
import sys
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rstar2cli.scheduler.scheduler import Scheduler, SchedulerConfig, Status  # noqa: E402

MAX_MACRO_STEPS = 32


@dataclass
class Cost:
    a_s: float  # per step
    b_s: float  # per sequence in the batch, per step
    c_s: float  # per context token in the batch, per step (attention reads)
    p_s: float  # per prefilled token

    def step_s(self, batch: int, ctx_tokens: float) -> float:
        return self.a_s + self.b_s * batch + self.c_s * ctx_tokens


@dataclass
class SimTraj:
    prompt_tokens: int
    turns: list[int]  # model tokens per turn
    chunks: list[int]  # tool-response tokens after each turn but the last
    tool_s: list[float]
    turn: int = 0
    turn_left: int = 0
    response_tokens: int = 0

    def __post_init__(self) -> None:
        self.turn_left = self.turns[0]


def make_workload(
    num_prompts: int, num_samples: int, max_response: int, seed: int
) -> list[SimTraj]:
    """Heavy-tailed multi-turn rollouts; samples of one prompt share its difficulty."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        prompt = rng.randint(200, 600)
        difficulty = rng.lognormvariate(math.log(1500), 0.6)
        for _ in range(num_samples):
            total = int(min(max_response * 1.2, difficulty * rng.lognormvariate(0, 0.6)))
            total = max(total, 32)
            num_turns = min(10, 1 + int(rng.expovariate(1.0) * total / 1500))
            cuts = sorted(rng.random() for _ in range(num_turns - 1))
            parts = [b - a for a, b in zip([0.0, *cuts], [*cuts, 1.0], strict=False)]
            turns = [max(8, int(total * f)) for f in parts]
            chunks = [rng.randint(30, 200) for _ in range(num_turns - 1)]
            tool_s = [
                min(30.0, rng.lognormvariate(math.log(0.3) - 0.5, 1.0))
                for _ in range(num_turns - 1)
            ]
            out.append(SimTraj(prompt, turns, chunks, tool_s))
    return out


@dataclass
class _Req:
    key: int
    ctx: int  # context now (prompt + response so far, incl. tokens made in this request)
    left: int  # tokens still to produce in this request
    made: int = 0
    prefill: int = 0  # tokens to prefill before its first step here


@dataclass
class SimEngine:
    index: int
    capacity_tokens: int
    max_num_seqs: int
    running: list[_Req] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    # trajectory key -> context still cached here, least recently used first. vLLM keeps a finished
    # request's blocks only while they are free and unclaimed: the cache lives in the KV the running
    # batch does not use, and the oldest entries are evicted as the batch grows (`_evict`).
    cached: OrderedDict = field(default_factory=OrderedDict)
    num_cached_tokens: int = 0
    num_evicted_tokens: int = 0
    num_recomputed_tokens: int = 0  # re-prefilled after a preemption
    num_prefill_tokens: int = 0
    stepping: bool = False
    num_preemptions: int = 0
    busy_s: float = 0.0
    kv_token_s: float = 0.0  # integral of KV in use over time

    def kv_used(self) -> int:
        return sum(r.ctx for r in self.running)

    def cache_put(self, key: int, num_tokens: int) -> None:
        self.cache_take(key)
        self.cached[key] = num_tokens
        self.num_cached_tokens += num_tokens

    def cache_take(self, key: int) -> int:
        num = self.cached.pop(key, 0)
        self.num_cached_tokens -= num
        return num

    def evict(self, room_tokens: int) -> None:
        """Drop least recently used cached contexts until they fit in `room_tokens` of free KV."""
        while self.cached and self.num_cached_tokens > max(room_tokens, 0):
            _, num = self.cached.popitem(last=False)
            self.num_cached_tokens -= num
            self.num_evicted_tokens += num


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    busy_s: list[float]
    num_preemptions: int
    num_tokens: int
    mean_kv_use: float
    num_migrations: int
    num_prefill_tokens: int = 0

    @property
    def idle_fraction(self) -> float:
        return 1.0 - sum(self.busy_s) / (self.makespan_s * len(self.busy_s))


def simulate(
    workload: list[SimTraj],
    config: SchedulerConfig,
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> SimResult:
    trajs = [
        SimTraj(t.prompt_tokens, list(t.turns), list(t.chunks), list(t.tool_s)) for t in workload
    ]
    now = [0.0]
    sched = Scheduler([capacity_tokens] * num_engines, config, clock=lambda: now[0])
    engines = [SimEngine(i, capacity_tokens, max_num_seqs) for i in range(num_engines)]
    ctx = [t.prompt_tokens for t in trajs]
    for key, t in enumerate(trajs):
        sched.add(key, t.prompt_tokens, max_response)
    events: list = []
    seq = [0]

    def push(t: float, kind: str, payload: object) -> None:
        heapq.heappush(events, (t, seq[0], kind, payload))
        seq[0] += 1

    def dispatch() -> None:
        for d in sched.schedule():
            t = trajs[d.key]
            eng = engines[d.engine]
            # prefill is decided when the engine admits it (-1): what is still cached then is reused
            eng.waiting.append(_Req(d.key, ctx[d.key], min(t.turn_left, d.max_tokens), prefill=-1))
            if not eng.stepping:
                plan(eng)

    def plan(eng: SimEngine) -> None:
        while eng.waiting and len(eng.running) < eng.max_num_seqs:
            nxt = eng.waiting[0]
            if eng.kv_used() + nxt.ctx + 1 > eng.capacity_tokens and eng.running:
                break
            req = eng.waiting.popleft()
            if req.prefill < 0:
                req.prefill = req.ctx - min(eng.cache_take(req.key), req.ctx)
            eng.running.append(req)
        if not eng.running:
            eng.stepping = False
            return
        used = eng.kv_used()
        while used + len(eng.running) > eng.capacity_tokens and len(eng.running) > 1:
            victim = eng.running.pop()  # recompute preemption: the newest request loses its KV
            victim.prefill = victim.ctx
            eng.num_recomputed_tokens += victim.ctx
            eng.waiting.appendleft(victim)
            eng.num_preemptions += 1
            used -= victim.ctx
        batch = len(eng.running)
        room = max(1, (eng.capacity_tokens - used) // batch)
        k = max(1, min(min(r.left for r in eng.running), MAX_MACRO_STEPS, room))
        eng.evict(eng.capacity_tokens - used - batch * k)  # the batch's growth claims free blocks
        prefill = sum(r.prefill for r in eng.running)
        eng.num_prefill_tokens += prefill
        dt = (
            cost.p_s * prefill
            + k * cost.step_s(batch, 0)
            + cost.c_s * (k * used + batch * k * (k - 1) / 2)
        )
        for r in eng.running:
            r.prefill = 0
        eng.stepping = True
        eng.busy_s += dt
        eng.kv_token_s += dt * (used + batch * k / 2)
        push(now[0] + dt, "step", (eng.index, k))

    def gen_done(key: int, made: int, eng: SimEngine) -> None:
        t = trajs[key]
        ctx[key] += made
        t.turn_left -= made
        t.response_tokens += made
        eng.cache_put(key, ctx[key])
        if t.response_tokens >= max_response:
            sched.on_generated(key, ctx[key], Status.DONE)
        elif t.turn_left > 0:
            sched.on_generated(key, ctx[key], Status.WAITING)
        elif t.turn + 1 < len(t.turns):
            sched.on_generated(key, ctx[key], Status.TOOL)
            push(now[0] + t.tool_s[t.turn], "tool", key)
        else:
            sched.on_generated(key, ctx[key], Status.DONE)

    def tool_done(key: int) -> None:
        t = trajs[key]
        chunk = t.chunks[t.turn]
        t.turn += 1
        t.turn_left = t.turns[t.turn]
        if t.response_tokens + chunk >= max_response:
            sched.finish(key)
            return
        ctx[key] += chunk
        t.response_tokens += chunk
        t.turn_left = min(t.turn_left, max_response - t.response_tokens)
        sched.on_tool_done(key, ctx[key])

    num_tokens = 0
    dispatch()
    while events:
        now[0], _, kind, payload = heapq.heappop(events)
        if kind == "tool":
            tool_done(payload)
        else:
            index, k = payload
            eng = engines[index]
            still = []
            for r in eng.running:
                r.ctx += k
                r.left -= k
                r.made += k
                num_tokens += k
                if r.left <= 0:
                    gen_done(r.key, r.made, eng)
                else:
                    still.append(r)
            eng.running = still
            eng.stepping = False
        dispatch()
        if kind == "step" and not engines[payload[0]].stepping:
            plan(engines[payload[0]])
    assert sched.all_done, "simulation ended with unfinished trajectories"
    makespan = now[0]
    mean_kv = sum(e.kv_token_s for e in engines) / (makespan * num_engines * capacity_tokens)
    return SimResult(
        policy=config.policy if config.policy != "kv" else f"kv-{config.kv_mode}",
        makespan_s=makespan,
        busy_s=[e.busy_s for e in engines],
        num_preemptions=sum(e.num_preemptions for e in engines),
        num_tokens=num_tokens,
        mean_kv_use=mean_kv,
        num_migrations=sched.num_migrations,
        num_prefill_tokens=sum(e.num_prefill_tokens for e in engines),
    )


def lower_bound_s(
    workload: list[SimTraj],
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> tuple[float, float]:
    """(work bound, critical-path bound). Work: every token at the cheapest per-token cost any
    full engine could reach (batch as large as KV and max_num_seqs allow), spread evenly over all
    engines. Critical path: the longest single trajectory alone on an engine (batch 1)."""
    total_tokens, ctx_token_sum, prefill, path = 0, 0.0, 0, 0.0
    for t in workload:
        c, resp, own = t.prompt_tokens, 0, cost.p_s * t.prompt_tokens
        prefill += t.prompt_tokens
        for i, n in enumerate(t.turns):
            n = min(n, max_response - resp)
            if n <= 0:
                break
            total_tokens += n
            ctx_token_sum += n * c + n * (n - 1) / 2
            own += n * cost.step_s(1, 0) + cost.c_s * (n * c + n * (n - 1) / 2)
            c, resp = c + n, resp + n
            if i + 1 < len(t.turns) and resp + t.chunks[i] < max_response:
                own += t.tool_s[i] + cost.p_s * t.chunks[i]
                prefill += t.chunks[i]
                c, resp = c + t.chunks[i], resp + t.chunks[i]
            else:
                break
        path = max(path, own)
    mean_ctx = ctx_token_sum / max(total_tokens, 1)
    batch = max(1, min(max_num_seqs, int(capacity_tokens / max(mean_ctx, 1))))
    per_token = cost.a_s / batch + cost.b_s
    work = (total_tokens * per_token + cost.c_s * ctx_token_sum + cost.p_s * prefill) / num_engines
    return work, path
