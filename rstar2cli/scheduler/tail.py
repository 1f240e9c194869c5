"""Tail engines: where the scheduler repacks trajectories predicted to run long.

A decode step costs a fixed part (reading the weights) plus a part that grows with the batch and
its context, so a long trajectory sharing a full engine runs each token several times slower
than alone. `TailEngines` keeps a small set of engines for trajectories predicted long
(`LONG_SHARE` of their budget or more, by `predict.SiblingLengths`): once such a trajectory
reaches a tool-call boundary on another engine, it moves to the tail engine with the least KV in
use, if that engine's KV in use stays under `kv_fraction` of its capacity with it (a low batch).
When none has room, the least used engine that is not one yet becomes one, up to `MAX_SHARE` of
the engines and never the last one (a single engine never becomes a tail engine). A tail engine
takes no new trajectories (other than ones predicted long) and no short ones moving in, so its
batch shrinks to its long ones as the others finish.

What it does not do: move anything (the scheduler does, re-prefilling the context on the new
engine, where the engine's prefix cache keeps what it can), or take engines back. Measured in
benchmarks/scheduler/bench.py (part b, `kv-tail`); tested in tests/unit/test_scheduler.py.
"""

from __future__ import annotations

from collections.abc import Callable

from rstar2cli.scheduler.kv import KVLedger

# NOTE: a trajectory counts as long when its predicted response is at least this share of its
# budget, and at most this share of the engines become tail engines.
LONG_SHARE = 0.75
MAX_SHARE = 0.125


class TailEngines:
    """The set of tail engines and the choice of one for a long trajectory."""

    def __init__(self, ledger: KVLedger, capacity_tokens: list[int], kv_fraction: float) -> None:
        self.ledger = ledger
        self.capacity_tokens = capacity_tokens
        self.kv_fraction = kv_fraction
        self.engines: set[int] = set()
        # NOTE: one engine always stays open to everything: a tail engine takes no trajectory
        # that is not predicted long, so with every engine a tail one the rest could never start
        self.max_engines = min(
            max(1, int(MAX_SHARE * len(capacity_tokens))), len(capacity_tokens) - 1
        )

    @staticmethod
    def is_long(predicted_tokens: float | None, budget_tokens: int) -> bool:
        return predicted_tokens is not None and predicted_tokens >= LONG_SHARE * budget_tokens

    def has_room(self, engine: int, need: int, owed: int, open_: bool) -> bool:
        """`engine` can take `need` more tokens and stay under its tail budget."""
        need = self.ledger.round_up(need)
        under = self.ledger.used(engine) + need <= self.kv_fraction * self.capacity_tokens[engine]
        return open_ and under and need <= self.ledger.free(engine) - owed

    def pick(
        self,
        need: int,
        home: int | None,
        held_tokens: int,
        owed: list[int],
        is_open: Callable[[int], bool],
    ) -> int | None:
        """The tail engine for a long trajectory needing `need` tokens (holding `held_tokens` at
        `home`); a new one if none has room; None: none can take it."""
        fits = [e for e in self.engines if self.has_room(e, need, owed[e], is_open(e))]
        if fits:
            return min(fits, key=self.ledger.used)
        if len(self.engines) >= self.max_engines:
            return None
        others = [e for e in range(len(self.capacity_tokens)) if e not in self.engines]
        engine = min(others, key=lambda e: self.ledger.used(e) - (held_tokens if e == home else 0))
        self.engines.add(engine)
        if engine == home:
            return engine
        return engine if self.has_room(engine, need, owed[engine], is_open(engine)) else None
