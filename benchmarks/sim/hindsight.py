"""Hindsight for the simulated cluster: how close knowing every length gets.

Two reference runs, neither a policy (no online scheduler knows how long a trajectory will run):
`OracleLengths` tells the scheduler every trajectory's true length (`simulate(oracle=True)`), and
`PeakAdmission` starts trajectories by hindsight (`simulate(peak_oracle=...)`). The latter is the
reference row `kv-peak (oracle)` of `scheduler.bench --part b --sim-oracle`, the best use of
perfect length knowledge found for the H100 case, where the KV fills. kv-incremental, told
nothing, runs on unchanged for every request after a trajectory's first; only the starts are
decided here:
- new trajectories start longest first (true response length, tool answers included);
- one starts on the engine where its start keeps the projected KV peak lowest, and only if that
  peak stays within `kv_limit_tokens`; one that fits nowhere is passed over for a shorter one
  (up to `MAX_TRIES` of them a call: past those, the rest wait for the next finish or move).
It is told either every trajectory's own true length or only its prompt's mean
(`told_final_tokens`); the first is the row `kv-peak (oracle)`, the second `kv-peak (prompt
oracle)`, which shows how much of the gain a prompt's siblings could ever tell.
The projected peak: had every trajectory on an engine decoded one token a step until its true
end, the engine would hold sum(c_i + t) over those still running at step t (c_i: its context
now). That is largest just before one ends: at r_k (its tokens to go), sum of c_i over every
i with r_i >= r_k, plus n_k * r_k, n_k being how many those are.
NOTE: decoding together leaves the projection as it is (each c_i grows as each r_i shrinks), so
it is rebuilt only when an engine's trajectories change: a start, a finish or a move. Tool pauses
and preemptions shift it in between, and it does not count them.

Measured with `PeakAdmission` (see benchmarks/scheduler/bench.py's docstring for the rows): the
H100 at 1/4 scale (16 engines, 128 prompts), seed 0, the limit at 0.7 / 0.8 / 0.85 / 0.9 / 0.95 /
1.0 / 1.2 of the KV: 1.265 / 1.163 / 1.164 / 1.153 / 1.190 / 1.268 / 1.369x max(work bound,
critical path); 0.9 is `KV_FRACTION`. Below it KV goes unused; from 1.0 on the engines preempt
(9 and 10 times). Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable
from itertools import accumulate

from rstar2cli.scheduler.predict import SiblingLengths
from rstar2cli.scheduler.scheduler import Dispatch, Scheduler, Status

# the projected peak allowed, as a fraction of an engine's KV (best of the sweep above)
KV_FRACTION = 0.9
# after the first candidate the KV bound lets through, at most this many are tried in one call
MAX_TRIES = 256
# what the admission is told (`told_final_tokens`)
KNOWS = ("trajectory", "prompt")


class OracleLengths:
    """Hindsight for `simulate(oracle=True)`: every trajectory's true response length (tool
    answers included, as the scheduler counts it), known before it starts. Who has started is
    kept by a `SiblingLengths` the scheduler's updates go to; only the predictions differ."""

    def __init__(self, true_tokens: list[int]) -> None:
        self._true = true_tokens
        self._started = SiblingLengths()

    def add(self, key: int, group: Hashable) -> None:
        self._started.add(key, group)

    def update(self, key: int, response_tokens: int, done: bool = False) -> None:
        self._started.update(key, response_tokens, done)

    def num_started(self, group: Hashable) -> int:
        return self._started.num_started(group)

    def predict(self, key: int, max_tokens: float = math.inf) -> float:
        return min(float(self._true[key]), max_tokens)

    def group_median(self, group: tuple[int]) -> float:
        (key,) = group  # each trajectory is its own group in an oracle run
        return float(self._true[key])


def told_final_tokens(
    trajs: list[tuple[int, Hashable]], true_tokens: list[int], knows: str
) -> dict[Hashable, int]:
    """Each trajectory's context at its end, as the admission is told it: from its own true
    response length (`trajectory`), or from the mean of its prompt's (`prompt`: more than any
    sibling predictor learns, since it learns only once a sibling is done). `trajs`: (prompt
    tokens, group) per trajectory; `true_tokens`: its true response tokens."""
    if knows not in KNOWS:
        raise ValueError(f"unknown knowledge {knows!r}; choose one of {', '.join(KNOWS)}")
    told = list(true_tokens)
    if knows == "prompt":
        # a trajectory without a group is a group of its own, as in the scheduler
        groups = [(k,) if g is None else g for k, (_, g) in enumerate(trajs)]
        by_group: dict[Hashable, list[int]] = {}
        for group, n in zip(groups, true_tokens, strict=True):
            by_group.setdefault(group, []).append(n)
        told = [sum(by_group[g]) // len(by_group[g]) for g in groups]
    return {k: prompt + n for k, ((prompt, _), n) in enumerate(zip(trajs, told, strict=True))}


class EnginePeak:
    """One engine's trajectories as (tokens to go, context now), and the projected peak with
    one more: `with_one(r, c)`."""

    def __init__(self, items: list[tuple[int, int]]) -> None:
        items = sorted(items, reverse=True)  # longest to go first
        to_go = [r for r, _ in items]
        self.neg_r = [-r for r in to_go]  # ascending, for bisect
        self.c_sum = list(accumulate(c for _, c in items))
        terms = [self.c_sum[k] + (k + 1) * r for k, r in enumerate(to_go)]
        self.prefix_max = list(accumulate(terms, max))
        # a trajectory that ends no later than the added one is joined by it for its r_k steps
        joined = [terms[k] + r for k, r in enumerate(to_go)]
        self.suffix_max = list(accumulate(reversed(joined), max))[::-1]

    def peak(self) -> int:
        return self.prefix_max[-1] if self.prefix_max else 0

    def with_one(self, r: int, c: int) -> int:
        """The projected peak had a trajectory with `r` tokens to go and context `c` started."""
        j = bisect.bisect_left(self.neg_r, -r)  # how many have more than r to go
        before = self.prefix_max[j - 1] if j else 0
        own = (self.c_sum[j - 1] if j else 0) + c + (j + 1) * r
        after = self.suffix_max[j] + c if j < len(self.suffix_max) else 0
        return max(before, own, after)

    def max_r(self, c: int, limit: int, max_r: int) -> int:
        """The most tokens to go a newcomer with context `c` may have within `limit`; -1: none."""
        lo, hi = -1, max_r  # with_one grows with r: binary search the last r within the limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.with_one(mid, c) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo


class PeakAdmission:
    """Installed in place of the scheduler's `_admit_kv` (see the module docstring)."""

    def __init__(
        self, sched: Scheduler, final_tokens: dict[Hashable, int], kv_limit_tokens: int
    ) -> None:
        self.sched = sched
        self.final = final_tokens  # each trajectory's context when it ends
        self.limit = kv_limit_tokens
        self.queue: list[tuple[int, Hashable]] = []  # (-response tokens, key): longest first
        self.num_queued = 0  # trajectories ever queued
        self.min_prompt = 0
        self.members: list[list[Hashable]] = []  # per engine: started, not done when last built
        self.engines: list[EnginePeak] = []
        self.seen = (-1, -1)  # (finishes, moves) when the projections were last built
        self.full = False  # no queued trajectory fits any projection: nothing starts till rebuilt

    def admit(self) -> list[Dispatch]:
        sched = self.sched
        if len(sched.slots) != self.num_queued:
            self._enqueue()
        if (sched.num_done, sched.num_migrations) != self.seen:
            self._rebuild()
        out = []
        while self.queue and not self.full:
            pick = self._pick()
            if pick is None:
                break
            i, engine = pick
            _, key = self.queue.pop(i)
            slot = sched.slots[key]
            sched.new.discard(key, slot.group)
            sched.ledger.reserve(key, engine, sched.admit_tokens(slot))
            out.append(sched.start_on(slot, engine))
            self.members[engine].append(key)
            self.engines[engine] = self._build(engine)
        return out

    def _enqueue(self) -> None:
        queued = {k for _, k in self.queue}
        for key, slot in self.sched.slots.items():
            if key not in queued and not slot.started and slot.status is not Status.DONE:
                self.queue.append((-(self.final[key] - slot.prompt_tokens), key))
        self.queue.sort(key=lambda x: x[0])
        self.num_queued = len(self.sched.slots)
        self.min_prompt = min(s.prompt_tokens for s in self.sched.slots.values())

    def _rebuild(self) -> None:
        sched = self.sched
        self.members = [[] for _ in range(sched.num_engines)]
        for key, slot in sched.slots.items():
            if slot.started and slot.status is not Status.DONE:
                self.members[slot.home].append(key)
        self.engines = [self._build(e) for e in range(sched.num_engines)]
        self.seen = (sched.num_done, sched.num_migrations)
        self.full = False

    def _build(self, engine: int) -> EnginePeak:
        slots = [self.sched.slots[k] for k in self.members[engine]]
        return EnginePeak([(max(0, self.final[s.key] - s.num_tokens), s.num_tokens) for s in slots])

    def _pick(self) -> tuple[int, int] | None:
        """(queue index, engine) of the longest queued trajectory an engine takes, on the one
        whose projected peak it raises least; None: none (`full` set when the projections, not
        the ledger, turned every one down)."""
        sched, queue = self.sched, self.queue
        reach = max(p.max_r(self.min_prompt, self.limit, -queue[0][0]) for p in self.engines)
        first = bisect.bisect_left(queue, -reach, key=lambda x: x[0]) if reach >= 0 else len(queue)
        ledger_bound = False
        for i in range(first, min(len(queue), first + MAX_TRIES)):
            slot = sched.slots[queue[i][1]]
            r, c = self.final[slot.key] - slot.num_tokens, slot.num_tokens
            need = sched.ledger.round_up(sched.admit_tokens(slot))
            peaks = sorted((p.with_one(r, c), e) for e, p in enumerate(self.engines))
            for peak, e in peaks:
                if peak > self.limit:
                    break
                if need <= sched.ledger.free(e) - sched.pending[e] and sched.below_cap(e):
                    return i, e
                ledger_bound = True
        self.full = not ledger_bound
        return None
