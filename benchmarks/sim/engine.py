"""One simulated rollout engine: vLLM's scheduler in the ways that matter to a rollout.

Continuous batching (requests join and leave between steps), a KV capacity in tokens, recompute
preemption when the running batch outgrows it (the newest request loses its KV and is
re-prefilled later, prompt + everything generated so far; the prefill stalls the whole batch for
that step), a prefix cache (a trajectory's next turn on the same engine prefills only its new
tokens and the last, partial block of its context: vLLM caches full blocks only), and a
`max_num_seqs` cap. The prefix cache is bounded as in vLLM: a finished request's blocks stay
cached only while they are free and unclaimed, so the cache lives in the KV the running batch
does not use, and the least recently used blocks are evicted as the batch grows
(an engine packed full of running requests loses the cached prefixes of the trajectories waiting
for tools; a ledger reservation does not pin them either). A step costs what `workload.Cost`
says. Time advances in macro steps: the batch is constant until the first request in it
finishes, KV runs out, or `MAX_MACRO_STEPS` pass (arrivals wait at most that long; in 1/8-scale
runs 8 instead of 32 moved makespans by about 1%).

What it does not model: chunked prefill interleaving, compute/memory overlap beyond the cost's
knee (past it a step's terms add). Which requests arrive, and when, is `model.simulate`'s
business. Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from benchmarks.sim.workload import Cost

MAX_MACRO_STEPS = 32


@dataclass
class Request:
    key: int
    ctx: int  # context now (prompt + response so far, incl. tokens made in this request)
    left: int  # tokens still to produce in this request
    made: int = 0
    prefill: int = 0  # tokens to prefill before its first step here; -1: decided at admission
    # leading pieces of its context other requests share ((piece, tokens): a system prompt, its
    # group's prompt), held once per engine (`SimEngine.kv_used`)
    pieces: tuple[tuple[Hashable, int], ...] = ()

    @property
    def shared(self) -> int:
        return sum(n for _, n in self.pieces)


@dataclass
class SimEngine:
    index: int
    capacity_tokens: int
    max_num_seqs: int
    running: list[Request] = field(default_factory=list)
    waiting: deque[Request] = field(default_factory=deque)
    # trajectory key -> context still cached here, least recently used first. vLLM keeps a finished
    # request's blocks only while they are free and unclaimed: the cache lives in the KV the running
    # batch does not use, and the oldest entries are evicted as the batch grows (`evict`).
    cached: OrderedDict[int, int] = field(default_factory=OrderedDict)
    num_cached_tokens: int = 0
    num_evicted_tokens: int = 0
    num_recomputed_tokens: int = 0  # re-prefilled after a preemption
    num_prefill_tokens: int = 0
    stepping: bool = False
    last_prefill_s: float = 0.0  # the prefill part of the step under way
    num_preemptions: int = 0
    busy_s: float = 0.0
    num_steps: float = 0.0  # decode steps run (a macro step counts its `Cost.decode` steps)
    kv_token_s: float = 0.0  # integral of KV in use over time
    max_kv_used: int = 0
    # prefix pieces computed here (`Request.pieces`): kept, as vLLM keeps blocks every new request
    # reads (a system prompt) or a group's samples read one after another
    resident: set[Hashable] = field(default_factory=set)
    # (start s, duration s, batch, mean KV tokens held) per macro step
    steps: list[tuple[float, float, int, float]] = field(default_factory=list)
    # KV is handed out in blocks of this many tokens: a request's own tokens take whole blocks
    # (shared pieces are whole blocks already: `model._pieces`)
    block_tokens: int = 1

    def own_kv(self, req: Request) -> int:
        """The KV `req`'s own tokens (its context less its shared pieces) take, in whole blocks."""
        b = self.block_tokens
        return -(-(req.ctx - req.shared) // b) * b

    def kv_used(self) -> int:
        """KV held by the running batch: each request's own blocks, and each shared piece once."""
        total, pieces = 0, dict[Hashable, int]()
        for r in self.running:
            total += self.own_kv(r)
            pieces.update(r.pieces)
        return total + sum(pieces.values())

    def kv_needed(self, req: Request) -> int:
        """KV the running batch would hold with `req` in it."""
        held = {p for r in self.running for p, _ in r.pieces}
        new_pieces = sum(n for p, n in req.pieces if p not in held)
        return self.kv_used() + self.own_kv(req) + new_pieces

    def reusable(self, req: Request) -> int:
        """Context tokens `req` finds computed here: its shared pieces, and its own tokens
        cached from its last request here (taken out of the cache)."""
        own = self.cache_take(req.key)
        pieces = sum(n for p, n in req.pieces if p in self.resident)
        self.resident.update(p for p, _ in req.pieces)
        return min(req.ctx, pieces + own)

    def cache_put(self, key: int, num_tokens: int) -> None:
        """Cache `num_tokens` of `key`'s own context (they follow its whole shared blocks): the
        full blocks of them only, as vLLM hashes and keeps no partial block."""
        self.cache_take(key)
        full = num_tokens // self.block_tokens * self.block_tokens
        self.cached[key] = full
        self.num_cached_tokens += full

    def cache_take(self, key: int) -> int:
        num = self.cached.pop(key, 0)
        self.num_cached_tokens -= num
        return num

    def evict(self, room_tokens: int) -> None:
        """Evict cached blocks until the cache fits in `room_tokens` of free KV: the least
        recently cached context first, block by block from its tail, as vLLM frees a request's
        blocks tail first into its LRU queue (what is left of a context is still a prefix hit)."""
        b = self.block_tokens
        while self.cached and self.num_cached_tokens > max(room_tokens, 0):
            key, num = next(iter(self.cached.items()))
            excess = -(-(self.num_cached_tokens - max(room_tokens, 0)) // b) * b
            drop = min(num, excess)
            if drop == num:
                del self.cached[key]
            else:
                self.cached[key] = num - drop  # an existing key keeps its place, first in line
            self.num_cached_tokens -= drop
            self.num_evicted_tokens += drop

    def start_step(self, cost: Cost, now_s: float) -> tuple[float, int]:
        """Start a macro step of the running batch at `now_s` (preempting the newest requests
        while the batch outgrows the KV): (its duration s, the tokens each request makes)."""
        used = self.kv_used()
        while used + len(self.running) > self.capacity_tokens and len(self.running) > 1:
            victim = self.running.pop()  # recompute preemption: the newest request loses its KV
            # NOTE: its full blocks stay in the prefix cache, free, until something evicts them
            # (vLLM frees a preempted request's blocks as it frees a finished one's)
            self.cache_put(victim.key, victim.ctx - victim.shared)
            victim.prefill = -1  # what is still cached is decided when it is admitted again
            self.num_recomputed_tokens += victim.ctx - victim.shared
            self.waiting.appendleft(victim)
            self.num_preemptions += 1
            used = self.kv_used()
        batch = len(self.running)
        room = max(1, (self.capacity_tokens - used) // batch)
        k = max(1, min(min(r.left for r in self.running), MAX_MACRO_STEPS, room))
        self.evict(self.capacity_tokens - used - batch * k)  # the batch's growth claims free blocks
        prefill = sum(r.prefill for r in self.running)
        self.num_prefill_tokens += prefill
        # NOTE: each request's attention reads its whole context, shared pieces included: the
        # step costs what the contexts hold, the KV what their distinct blocks hold
        read = sum(r.ctx for r in self.running)
        self.last_prefill_s = cost.p_s * prefill
        steps, decode_s = cost.decode(batch, read, k)
        dt = self.last_prefill_s + decode_s
        for r in self.running:
            r.prefill = 0
        self.stepping = True
        self.busy_s += dt
        self.num_steps += steps
        kv_mean = used + batch * k / 2  # the context held over the step, on average
        self.kv_token_s += dt * kv_mean
        self.max_kv_used = max(self.max_kv_used, used + batch * k)
        self.steps.append((now_s, dt, batch, kv_mean))
        return dt, k

    def stretch_last(self, wall_s: float) -> None:
        """The last step took `wall_s` (it shared its cores: `sharing.CoreShare`), not what it
        cost alone."""
        start, dt, batch, kv_mean = self.steps[-1]
        self.busy_s += wall_s - dt
        self.kv_token_s += (wall_s - dt) * kv_mean
        self.steps[-1] = (start, wall_s, batch, kv_mean)
