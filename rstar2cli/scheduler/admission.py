"""The trajectories not started yet, and the order they are offered to start in.

`NewQueue` keeps them in one of two orders (`ADMISSIONS`):
- `data`: the order they were added (a prompt's samples are adjacent);
- `predicted`: longest predicted first, from their prompt's siblings (`predict.SiblingLengths`):
  first one sample of every prompt none of whose samples has produced anything yet (to learn its
  length), then the group with the longest predicted median, ties to the group with the fewest
  samples started, so the first wave spreads over all prompts. A group's samples keep data order.
Either way the order is strict: `admit` stops at the first trajectory that cannot start, so a
later, smaller one never jumps the queue (a long trajectory left waiting behind small ones would
start last and set the makespan).

What it does not do: choose engines or reserve KV (the scheduler's `start` callback does), or
update lengths (the scheduler tells the `SiblingLengths` it shares). Tested in
tests/unit/test_admission.py, and through the scheduler in tests/unit/test_scheduler.py.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable

from rstar2cli.scheduler.predict import SiblingLengths

ADMISSIONS = ("data", "predicted")


class NewQueue:
    """Not-started trajectories in `data` or `predicted` order."""

    def __init__(self, order: str, lengths: SiblingLengths) -> None:
        if order not in ADMISSIONS:
            raise ValueError(f"unknown admission {order!r}; choose one of {', '.join(ADMISSIONS)}")
        self.order = order
        self.lengths = lengths
        self._data: deque[Hashable] = deque()
        # `predicted`: per group, its samples in data order; groups in first-seen order
        self._by_group: dict[Hashable, deque[Hashable]] = {}
        self._num = 0

    def __len__(self) -> int:
        return self._num

    def add(self, key: Hashable, group: Hashable) -> None:
        if self.order == "predicted":
            self._by_group.setdefault(group, deque()).append(key)
        else:
            self._data.append(key)
        self._num += 1

    def discard(self, key: Hashable, group: Hashable) -> None:
        """Drop `key` (it ended before it started) if it is queued."""
        queue = self._by_group.get(group, deque()) if self.order == "predicted" else self._data
        if key in queue:
            queue.remove(key)
            self._num -= 1

    def take_all(self) -> list[Hashable]:
        """Empty the queue: everything in it, in data order."""
        if self.order == "predicted":
            keys = [k for queue in self._by_group.values() for k in queue]
            self._by_group.clear()
        else:
            keys = list(self._data)
            self._data.clear()
        self._num = 0
        return keys

    def admit(self, start: Callable[[Hashable], bool]) -> None:
        """Offer the queued trajectories to `start` in order; one it starts (True) leaves the
        queue; stop at the first it cannot start (False)."""
        if self.order == "data":
            while self._data and start(self._data[0]):
                self._data.popleft()
                self._num -= 1
            return
        groups = self._by_group
        order = [(self._rank(g), i, g) for i, g in enumerate(groups) if groups[g]]
        heapq.heapify(order)
        while order:
            _, i, group = order[0]
            if not start(groups[group][0]):
                return
            groups[group].popleft()
            self._num -= 1
            if groups[group]:
                heapq.heapreplace(order, (self._rank(group), i, group))
            else:
                heapq.heappop(order)

    def _rank(self, group: Hashable) -> tuple[int, float, int]:
        """Which group's next sample starts first (smallest first): see the module docstring."""
        started = self.lengths.num_started(group)
        predicted = self.lengths.group_median(group)
        if predicted is None:
            return (0, 0.0, started)
        return (1, -predicted, started)
