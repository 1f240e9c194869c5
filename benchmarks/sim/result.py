"""What one simulated run reports (`SimResult`), and the statistics it is built from.

`profile` cuts the engines' macro steps into tenths of the makespan (busy fraction, mean batch,
KV held); `spearman_rank` scores the scheduler's sibling length predictions against the true
lengths. Filled in by `model.simulate`; printed and written to JSON by
benchmarks/scheduler/cluster.py and benchmarks/scheduler/report.py. Tested in
tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.sim.engine import SimEngine
from benchmarks.sim.workload import SimTraj


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    busy_s: list[float]
    num_preemptions: int
    num_tokens: int
    num_steps: float  # the engines' decode steps, all together (expected, with drafts)
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


def mean_batch(result: SimResult) -> float:
    """The simulated engines' mean batch: tokens made a step (as scheduler.real_data.step_summary
    counts the real engines')."""
    return result.num_tokens / result.num_steps if result.num_steps else 0.0


def mean_step_ms(result: SimResult) -> float:
    """The simulated engines' mean step time, ms: their busy time over their steps."""
    return 1e3 * sum(result.busy_s) / result.num_steps if result.num_steps else 0.0


def profile(
    engines: list[SimEngine], makespan_s: float, num_bins: int = 10
) -> tuple[list[float], list[float], list[float]]:
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
