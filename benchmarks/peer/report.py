"""Measure a process tree, turn each side's step rows into one summary, compare, print a table.

- `TreePeak`: peak memory of a process and all its descendants (rl-stage's engine core, sandbox
  and grader workers; TRL's colocated engine, sandbox and grader workers), sampled from /proc
  with psutil in a thread: the sum of RSS (what the issue asks for; it counts pages that forked
  children share with their parent once per process) and the sum of PSS (shared pages split
  between their users, so the tree's real footprint).
- `summarise`: per side, the median wall seconds of the steps after the first (the first pays
  for start-up), and token rates over those same steps: response tokens (model-written and tool
  output, both sides counted alike) and trained tokens (those with loss: model-written tokens of
  the rollouts a step trains on) per second of step wall time.
- `compare` / `table`: each metric's advantage of ours over TRL (> 1: ours is better), so one
  column reads the same for times, rates and memory.

What it does not do: run anything but the sampler thread. Tested in tests/unit/test_peer_trl.py.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
MB = 2**20


class TreePeak:
    """Peak summed RSS and PSS (MB) of `pid` and its descendants, sampled every `period_s`."""

    def __init__(self, pid: int, period_s: float = 1.0):
        import psutil

        self._root = psutil.Process(pid)
        self._period_s = period_s
        self.rss_mb = self.pss_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # the root has exited
            return
        rss = pss = 0
        for proc in procs:
            try:
                info = proc.memory_full_info()
            except psutil.Error:  # exited between the listing and the read
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        self.rss_mb = max(self.rss_mb, rss / MB)
        self.pss_mb = max(self.pss_mb, pss / MB)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self._period_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def steady(values: Sequence[T]) -> list[T]:
    """The steps after the first (all of them when there is only one)."""
    return list(values[1:]) if len(values) > 1 else list(values)


@dataclass(frozen=True)
class StepRow:
    """One RL step of either side, in common units."""

    step_s: float
    rollout_s: float  # generation with the tool loop, grading not included
    response_tokens: float  # model-written + tool output, all rollouts of the step
    trained_tokens: float  # tokens with loss in the step's update
    reward: float
    tool_calls_per_rollout: float


def ours_rows(metrics: list[dict[str, Any]]) -> list[StepRow]:
    """rl-stage's OUT/metrics.jsonl rows."""
    return [
        StepRow(
            step_s=m["time_step_s"],
            rollout_s=m["time_rollout_s"],
            response_tokens=m["response_tokens"] * m["num_rollouts"],
            trained_tokens=m.get("num_train_tokens") or 0,
            reward=m["reward"],
            tool_calls_per_rollout=m["tool_calls_per_rollout"],
        )
        for m in metrics
    ]


def trl_rows(steps: list[dict[str, Any]]) -> list[StepRow]:
    """trl_side.py's OUT/steps.jsonl rows (TRL trains every rollout's model-written tokens)."""
    return [
        StepRow(
            step_s=s["time_step_s"],
            rollout_s=s["time_generate_s"] or 0.0,
            response_tokens=s["response_tokens"],
            trained_tokens=s["model_tokens"],
            reward=s["reward"] or 0.0,
            tool_calls_per_rollout=s["tool_calls_per_rollout"] or 0.0,
        )
        for s in steps
    ]


def summarise(rows: list[StepRow]) -> dict[str, float]:
    """One side's numbers over the steps after the first."""
    if not rows:
        raise ValueError("no steps to summarise")
    kept = steady(rows)
    wall = sum(r.step_s for r in kept)
    return {
        "step_s": statistics.median(r.step_s for r in kept),
        "rollout_s": statistics.median(r.rollout_s for r in kept),
        "update_s": statistics.median(r.step_s - r.rollout_s for r in kept),
        "gen_tokens_per_s": sum(r.response_tokens for r in kept) / wall,
        "trained_tokens_per_s": sum(r.trained_tokens for r in kept) / wall,
        "trained_tokens_per_step": statistics.mean(r.trained_tokens for r in kept),
        "first_step_s": rows[0].step_s,
        "reward": statistics.mean(r.reward for r in rows),
        "tool_calls_per_rollout": statistics.mean(r.tool_calls_per_rollout for r in rows),
        "num_steps": float(len(rows)),
    }


# (key, label, True: lower is better, False: higher is better, None: a fact with no better side)
METRICS: tuple[tuple[str, str, bool | None], ...] = (
    ("step_s", "wall s per step (median after the first)", True),
    ("rollout_s", "  of it rollout s (generation + tool loop)", True),
    ("update_s", "  of it the rest s (grading, update, weight sync)", True),
    ("gen_tokens_per_s", "response tokens / s (model + tool output)", False),
    ("trained_tokens_per_s", "trained tokens / s", False),
    ("trained_tokens_per_step", "trained tokens per step", None),
    ("peak_rss_mb", "peak RSS of the process tree, MB", True),
    ("peak_pss_mb", "peak PSS of the process tree, MB", True),
    ("accuracy", "held-out accuracy after the steps (avg@4, T 0.6)", False),
    ("reward", "mean training reward (T 1.0)", False),
    ("tool_calls_per_rollout", "tool calls per rollout (training)", None),
)


def advantage(ours: float, trl: float, lower_is_better: bool) -> float | None:
    """How many times better ours is than TRL on one metric (> 1: ours is better); None when
    either is 0 (a step that trained nothing has no rate to compare)."""
    if ours <= 0 or trl <= 0:
        return None
    return trl / ours if lower_is_better else ours / trl


def compare(ours: dict[str, float], trl: dict[str, float]) -> dict[str, float | None]:
    """Ours' advantage on each metric that has a better side."""
    return {
        key: advantage(ours=ours[key], trl=trl[key], lower_is_better=lower)
        for key, _, lower in METRICS
        if lower is not None and key in ours and key in trl
    }


def table(ours: dict[str, float], trl: dict[str, float]) -> str:
    """Markdown table: metric, ours, TRL, ours' advantage."""
    ratios = compare(ours, trl)
    lines = ["| metric | rl-stage | TRL GRPOTrainer | rl-stage's advantage |", "|---|---|---|---|"]
    for key, label, _ in METRICS:
        if key not in ours or key not in trl:
            continue
        ratio = ratios.get(key)
        shown = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"| {label} | {_fmt(ours[key])} | {_fmt(trl[key])} | {shown} |")
    return "\n".join(lines)


def _fmt(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"
