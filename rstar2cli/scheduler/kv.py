"""The KV ledger: the scheduler's own account of KV-cache tokens reserved on each engine.

The scheduler never asks an engine whether a trajectory fits; it keeps this ledger of
reservations (in tokens) against each engine's `kv_capacity_tokens()` and admits work only when the
reservation fits. Engines' own `kv_used_tokens()` are read for statistics only.

Two reservation modes (a setting, `KV_MODES`):
- `full` (the paper, section 4.2): at admission reserve prompt + max response tokens, the worst
  case of the whole trajectory, and hold it until the trajectory is done, tool waits included.
- `per_turn`: reserve the current context + the next generation's max tokens just before each
  generation and release it when the generation returns; the next turn is re-checked. Tighter (a
  trajectory waiting for its tool holds nothing), at the cost of a re-check per turn.

- `incremental`: like `per_turn` (context + the next request's max tokens while it runs), but a
  trajectory waiting for its tool keeps its context reserved on its engine (`resize`), so its
  prefix stays cached there and its next turn needs only the growth; see scheduler.py.

Reservations round up to whole blocks when `block_size_tokens` > 1 (engines allocate
blocks, not tokens). What it does not do: choose engines (scheduler.py) or talk to engines.
NOTE: invariant for the `kv` policy: used(e) <= capacity(e) for every engine at all times (the
scheduler may give the ledger more than the engine's KV: `SchedulerConfig.kv_overcommit`);
`reserve` refuses (returns False) instead of over-committing. Baselines call `force_reserve`,
which records an over-commit without refusing, so the same ledger shows how far they overflow.
Tested in tests/unit/test_kv.py.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_MODES = ("full", "per_turn", "incremental")


@dataclass
class Reservation:
    engine: int
    num_tokens: int


class KVLedger:
    """Reservations in tokens, keyed by trajectory, one capacity per engine."""

    def __init__(self, capacity_tokens: list[int], block_size_tokens: int = 1):
        if not capacity_tokens or any(c <= 0 for c in capacity_tokens):
            raise ValueError(f"capacities must be positive, got {capacity_tokens}")
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        self.capacity_tokens = list(capacity_tokens)
        self.block_size_tokens = block_size_tokens
        self._used = [0] * len(capacity_tokens)
        self._held: dict[object, Reservation] = {}
        self.max_used_tokens = [0] * len(capacity_tokens)

    @property
    def num_engines(self) -> int:
        return len(self.capacity_tokens)

    def round_up(self, num_tokens: int) -> int:
        b = self.block_size_tokens
        return -(-num_tokens // b) * b

    def used(self, engine: int) -> int:
        return self._used[engine]

    def free(self, engine: int) -> int:
        return self.capacity_tokens[engine] - self._used[engine]

    def fits(self, engine: int, num_tokens: int) -> bool:
        return self.round_up(num_tokens) <= self.free(engine)

    def holding(self, key: object) -> Reservation | None:
        return self._held.get(key)

    def reserve(self, key: object, engine: int, num_tokens: int) -> bool:
        """Reserve `num_tokens` for `key` on `engine`; False (and no change) if it does not fit."""
        if key in self._held:
            raise ValueError(f"{key!r} already holds a reservation")
        if not self.fits(engine, num_tokens):
            return False
        self._add(key, engine, self.round_up(num_tokens))
        return True

    def force_reserve(self, key: object, engine: int, num_tokens: int) -> None:
        """Record a reservation even past capacity (baselines: they admit without looking)."""
        if key in self._held:
            raise ValueError(f"{key!r} already holds a reservation")
        self._add(key, engine, self.round_up(num_tokens))

    def resize(self, key: object, num_tokens: int) -> bool:
        """Change `key`'s reservation in place; False (and no change) if the growth does not fit."""
        res = self._held[key]
        new = self.round_up(num_tokens)
        if new > res.num_tokens and new - res.num_tokens > self.free(res.engine):
            return False
        self._used[res.engine] += new - res.num_tokens
        res.num_tokens = new
        self.max_used_tokens[res.engine] = max(
            self.max_used_tokens[res.engine], self._used[res.engine]
        )
        return True

    def release(self, key: object) -> Reservation | None:
        res = self._held.pop(key, None)
        if res is not None:
            self._used[res.engine] -= res.num_tokens
        return res

    def over_committed(self) -> bool:
        return any(u > c for u, c in zip(self._used, self.capacity_tokens, strict=False))

    def _add(self, key: object, engine: int, num_tokens: int) -> None:
        self._held[key] = Reservation(engine, num_tokens)
        self._used[engine] += num_tokens
        self.max_used_tokens[engine] = max(self.max_used_tokens[engine], self._used[engine])
