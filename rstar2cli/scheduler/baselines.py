"""The baselines the `kv` policy is measured against: how each one starts new trajectories.

- `static` (the paper's "before"): an even split up front, in contiguous chunks of the batch; each
  engine runs its own share, at most `max_active_per_engine` at a time, and never helps another.
- `least-requests` (verl's router): each new trajectory goes, when a slot frees, to the engine
  with the fewest in-flight generate requests (sticky for all its turns).
Neither looks at KV; their reservations are still written to the ledger (`force_reserve`, the
whole budget, as `full` mode would) so statistics show how far they over-commit.

What it does not do: continue started trajectories (the scheduler sends every turn back to its
home engine). Functions over the scheduler's state, split from it for size; tested through it in
tests/unit/test_scheduler.py and measured in benchmarks/scheduler/bench.py.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rstar2cli.scheduler.scheduler import Dispatch, Scheduler


def admit_static(s: Scheduler) -> list[Dispatch]:
    """Split what is new over the engines (once: everything added before the first call), then
    start each engine's next ones while it is below its cap."""
    keys = s.new.take_all()
    for i, key in enumerate(keys):
        # NOTE: contiguous chunks, as verl splits a batch over its rollout workers: the samples
        # of one problem (adjacent in the batch) land on one engine, hard problems included.
        engine = i * s.num_engines // len(keys)
        s.slots[key].engine = engine
        s.static_queues[engine].append(key)
    out = []
    for engine, queue in enumerate(s.static_queues):
        while queue and s.below_cap(engine):
            slot = s.slots[queue.popleft()]
            s.ledger.force_reserve(slot.key, engine, slot.worst_case_tokens)
            out.append(s.start_on(slot, engine))
    return out


def admit_least_requests(s: Scheduler) -> list[Dispatch]:
    """Start new trajectories in data order, each on the open engine with the fewest requests in
    flight (then the fewest active), while one is open."""
    out: list[Dispatch] = []

    def start(key: Hashable) -> bool:
        open_engines = [e for e in range(s.num_engines) if s.below_cap(e)]
        if not open_engines:
            return False
        engine = min(open_engines, key=lambda e: (s.num_running[e], s.num_active[e], e))
        slot = s.slots[key]
        s.ledger.force_reserve(slot.key, engine, slot.worst_case_tokens)
        out.append(s.start_on(slot, engine))
        return True

    s.new.admit(start)
    return out
