"""Incremental KV mode: where a ready trajectory's next generate request goes.

The scheduler (`scheduler.Scheduler`, kv policy, `kv_mode` `incremental`, the default) calls
`place` for every trajectory that is ready to generate again. Each generate request reserves the
context + at most `step_tokens` of growth (what it can really use), so an engine runs as many
trajectories as its KV holds now rather than in the worst case. A trajectory waiting for its tool
keeps its context reserved at home, so its prefix stays cached and its next turn needs only the
growth. In order, `place`:
1. moves a trajectory predicted long, at a tool-call boundary, to a tail engine (when the
   scheduler has them: `tail.TailEngines`);
2. in the drain (every trajectory has started, batches shrink unevenly: a long trajectory may
   share a still-full engine while others sit idle, and every decode step reads the whole batch's
   KV) moves it to the least used engine that fits it when the KV the others hold at home is over
   1 / `drain_balance` times what it would share there;
3. grows its reservation at home, or goes on there with a smaller step if at least
   `min_step_tokens` fit;
4. else it waits at home (room that frees there is owed to it, `Scheduler.pending`, before any
   new trajectory is admitted there) and moves to the engine with the most free KV only after
   `migrate_after_s`, or at once if nothing runs at home to free room (waiting never deadlocks).
Every move costs one re-prefill of the context on the new engine.

What it does not do: admit new trajectories, dispatch, or keep statistics (the scheduler does);
it changes reservations in the scheduler's ledger and homes through `Scheduler.migrate` only.
Functions over the scheduler's state, split from it for size; tested through it in
tests/unit/test_scheduler.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rstar2cli.scheduler.tail import TailEngines

if TYPE_CHECKING:
    from rstar2cli.scheduler.scheduler import Scheduler, Slot


def place(s: Scheduler, slot: Slot) -> int | None:
    """The engine `slot`'s next request goes to, its reservation made there (steps 1-4 of the
    module docstring, in order); None: it keeps waiting at home."""
    need, home = s.admit_tokens(slot), slot.home
    held = s.ledger.holding(slot.key)
    tail = _tail_engine(s, slot, need, held.num_tokens if held else 0)
    if tail is not None and tail != home:
        s.ledger.release(slot.key)
        s.ledger.reserve(slot.key, tail, need)
        s.migrate(slot, tail)
        s.num_tail_moves += 1
        return tail
    lighter = _lighter_engine(s, slot, need, held.num_tokens if held else 0)
    if lighter is not None:
        s.ledger.release(slot.key)
        s.ledger.reserve(slot.key, lighter, need)
        s.migrate(slot, lighter)
        return lighter
    if s.below_cap(home):
        if held is not None and s.ledger.resize(slot.key, need):
            return home
        if held is None and s.ledger.reserve(slot.key, home, need):
            return home
        if _shrink_step_to_fit(s, slot, held.num_tokens if held else 0):
            return home
    waited_s = s.clock() - slot.ready_since
    if waited_s < s.config.migrate_after_s and s.num_running[home] > 0:
        s.pending[home] += s.ledger.round_up(need) - (held.num_tokens if held else 0)
        return None
    s.ledger.release(slot.key)  # its cached prefix is given up either way
    if s.ledger.round_up(need) > s.max_free + (held.num_tokens if held else 0):
        return None  # fits nowhere; skip the scan (cheap with thousands waiting)
    engine = s.most_free_fitting(need, exclude=closed_to(s, slot))
    if engine is None:
        return None
    s.ledger.reserve(slot.key, engine, need)
    if engine != home:
        s.migrate(slot, engine)
    return engine


def is_long(s: Scheduler, slot: Slot) -> bool:
    budget = slot.max_response_tokens
    return TailEngines.is_long(s.lengths.predict(slot.key, budget), budget)


def closed_to(s: Scheduler, slot: Slot) -> set[int]:
    """Engines `slot` may not move or start on: tail engines, unless it is predicted long."""
    if s.tail is None or not s.tail.engines or is_long(s, slot):
        return set()
    return s.tail.engines


def _tail_engine(s: Scheduler, slot: Slot, need: int, held_tokens: int) -> int | None:
    """A trajectory predicted long, at a tool-call boundary, off the tail engines: the tail
    engine to move to (None: stay)."""
    if s.tail is None or not slot.after_tool or slot.home in s.tail.engines:
        return None
    if not is_long(s, slot):
        return None
    return s.tail.pick(
        need=need, home=slot.home, held_tokens=held_tokens, owed=s.pending, is_open=s.below_cap
    )


def _lighter_engine(s: Scheduler, slot: Slot, need: int, held_tokens: int) -> int | None:
    """Once nothing is left to admit: the least used engine that fits `slot` and would hold,
    with it, under `drain_balance` of the KV the others use at its home; None: stay."""
    if s.num_new or s.config.drain_balance is None:
        return None
    closed = closed_to(s, slot)
    others_home = s.ledger.used(slot.home) - held_tokens
    best, best_used = None, None
    for e in range(s.num_engines):
        if e == slot.engine or e in closed or not s.below_cap(e):
            continue
        used = s.ledger.used(e)
        if s.ledger.round_up(need) > s.ledger.free(e) - s.pending[e]:
            continue
        if used + need < others_home * s.config.drain_balance and (
            best_used is None or used < best_used
        ):
            best, best_used = e, used
    return best


def _shrink_step_to_fit(s: Scheduler, slot: Slot, held_tokens: int) -> bool:
    """Go on at home with a smaller step (at least `min_step_tokens`) if that fits there."""
    room = s.ledger.free(slot.home) + held_tokens - s.pending[slot.home]
    block = s.ledger.block_size_tokens
    step = room // block * block - slot.num_tokens  # its reservation, context + step, fits room
    if step < min(s.config.min_step_tokens, slot.remaining_tokens):
        return False
    slot.step_cap = step
    need = s.admit_tokens(slot)
    ok = (
        s.ledger.resize(slot.key, need)
        if held_tokens
        else s.ledger.reserve(slot.key, slot.home, need)
    )
    if not ok:
        slot.step_cap = None
    return ok
