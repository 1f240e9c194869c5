"""Part (a)'s predictions on the host's speed beside each run (benchmarks/scheduler/real.py).

A 2-core host drifts: the same calibration calls took 255 s before a run of nine policy runs and
278 s after it, and one policy's makespan moved 17% between rounds, while the simulator's engine
steps stayed within 2.5% of the engines'. So a cost fitted once describes the host some runs
saw and not others. Here each calibration pass gets a speed (`pass_speeds`: its calls' walls
against every pass's median, the median over the plan), each policy run the mean speed of the
passes nearest it on either side (`run_speeds`), and the simulator replays that run's policy on
the fitted cost times its speed (`scaled_cost`; the tools' sleeps do not scale). A whole pass
takes about 4 minutes on 2 cores, so between the passes `--speed-probes` times a few of their
calls (`Calibration.time_probe`, about a minute) beside every run.
Measured (README, docs/scheduler-real-4engines-sft-all.json): the probes put the host at
0.93-1.16 of its median, the runs did not follow them (the fastest came between the two slowest
probes), and the predictions at their speeds were 1.00-1.24 of the measured makespans against
0.99-1.10 on the one fit. The probes' calls (2 engines stepping, 2 idle, a minute) need not
see the host as a rollout on 4 engines does over 7 minutes; `--speed-probes` is off by default.

What it does not do: fit the cost's shape (scheduler/fit.py does, over every pass), or correct
for drift inside a run. Tested in tests/unit/test_scheduler_beside.py.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.scheduler.real_data import VLLM_CPU_BLOCK_TOKENS, Workload, replay_in_sim
from benchmarks.scheduler.report import print_table
from benchmarks.sim.result import SimResult
from benchmarks.sim.workload import Cost


def pass_speeds(passes: list[dict[Any, float]]) -> list[float]:
    """Each calibration pass's or probe's speed: the median over its calls of the call's wall
    there over its median wall in every pass that timed it (1.1: the host took 10% longer than
    usual)."""
    walls: dict[Any, list[float]] = {}
    for timed in passes:
        for call, wall in timed.items():
            walls.setdefault(call, []).append(wall)
    median = {call: statistics.median(w) for call, w in walls.items()}
    return [statistics.median(w / median[call] for call, w in timed.items()) for timed in passes]


def run_speeds(speeds: list[float], slots: list[int], runs: int) -> list[float | None]:
    """Each run's speed: the mean of the nearest pass before it and the nearest after it
    (`slots`: before which run each pass went, `runs` for after the last); None for a run
    without a pass on both sides."""
    out: list[float | None] = []
    for run in range(runs):
        before = [s for s, slot in zip(speeds, slots, strict=True) if slot <= run]
        after = [s for s, slot in zip(speeds, slots, strict=True) if slot > run]
        out.append((before[-1] + after[0]) / 2 if before and after else None)
    return out


def scaled_cost(cost: Cost, speed: float) -> Cost:
    """`cost` on a host `speed` times as slow: every time term scaled, the knee kept."""
    return dataclasses.replace(
        cost, a_s=cost.a_s * speed, b_s=cost.b_s * speed, c_s=cost.c_s * speed, p_s=cost.p_s * speed
    )


def sim_at_speed(
    work: Workload, tok: Any, args: Any, cost: Cost, fit: dict[str, Any]
) -> Callable[[list[str] | None, float], dict[str, SimResult]]:
    """`replay_in_sim` of `work` on `cost` (an engine's alone on the host: `alone_cost`) and
    the rest of `fit` (the `--json` file's: interference, sharing, capacity, cores, block), as
    a function of the policies (None: the selected ones) and the host's speed."""

    def at(names: list[str] | None, speed: float) -> dict[str, SimResult]:
        return replay_in_sim(
            work,
            tok=tok,
            cost=scaled_cost(cost, speed),
            interference=fit.get("interference", 0.0),  # none timed before it was: 0
            sharing=fit.get("sharing", 0.0),
            capacity_tokens=fit["capacity_tokens"],
            args=args,
            engine_cores=[tuple(c) for c in fit["engine_cores"]],
            block_tokens=fit.get("block_tokens", VLLM_CPU_BLOCK_TOKENS),
            names=names,
        )

    return at


def predict_beside(
    runs: list[tuple[str, float | None]], simulate: Callable[[str, float], float]
) -> list[float | None]:
    """Each (policy, speed) run's makespan in the simulator at its speed (`simulate(policy,
    speed)` -> seconds), None for a run without one; runs of one policy at one speed share a
    simulation."""
    seen: dict[tuple[str, float], float] = {}
    out: list[float | None] = []
    for name, speed in runs:
        if speed is None:
            out.append(None)
            continue
        if (name, speed) not in seen:
            seen[name, speed] = simulate(name, speed)
        out.append(seen[name, speed])
    return out


def beside_rows(
    names: list[str], runs: list[tuple[float | None, float | None]]
) -> dict[str, dict[str, Any]]:
    """Per policy, the `--json` fields of its runs (`names[i]` ran run i, `runs[i]` its speed and
    prediction): every run's speed and prediction in run order (as "runs_s" lists the runs) and
    the median of the predictions ("predicted_beside_s"; None without any)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (speed, predicted) in zip(names, runs, strict=True):
        row = out.setdefault(name, {"runs_speed": [], "beside_s": []})
        row["runs_speed"].append(speed)
        row["beside_s"].append(predicted)
    for row in out.values():
        known = [p for p in row["beside_s"] if p is not None]
        row["predicted_beside_s"] = statistics.median(known) if known else None
    return out


def print_beside(policies: dict[str, dict[str, Any]]) -> None:
    """Measured against predicted at each run's own host speed (`beside_rows` in each row)."""
    rows = {n: r for n, r in policies.items() if r.get("predicted_beside_s")}
    if not rows:
        return
    print(
        "\nthe simulator at each run's host speed (the calibration passes on either side of it): "
        "measured against predicted, run by run"
    )
    header = ["policy", "real s", "sim beside s", "beside/real", "runs: speed, real s, sim s"]
    table = []
    for name, row in rows.items():
        runs = ", ".join(
            f"({speed:.3f}, {real:.1f}, {sim:.1f})"
            for speed, real, sim in zip(
                row["runs_speed"], row["runs_s"], row["beside_s"], strict=True
            )
            if sim is not None
        )
        real = statistics.median(row["runs_s"])
        table.append(
            [
                name,
                f"{real:.1f}",
                f"{row['predicted_beside_s']:.1f}",
                f"{row['predicted_beside_s'] / real:.2f}",
                runs,
            ]
        )
    print_table(header, table)


def calibration_slots(runs: int, passes: int) -> list[int]:
    """Before which of `runs` policy runs each of `passes` calibration passes goes (`runs`:
    after the last): the first before the first run, the last after the last, the rest evenly
    between, so the fit sees the host the runs saw."""
    if passes <= 1:
        return [0] * passes
    return [round(i * runs / (passes - 1)) for i in range(passes)]


def timings(runs: int, passes: int, probes: bool) -> list[tuple[int, str]]:
    """(the run it goes before, "pass" or "probe"), in order, for each of `passes` calibration
    passes (`calibration_slots`) and, with `probes`, a speed probe before every other run and
    after the last (`runs`) where no pass goes."""
    slots = calibration_slots(runs, passes)
    out: list[tuple[int, str]] = []
    for i in range(runs + 1):
        out += [(i, "pass")] * slots.count(i)
        if probes and i not in slots:
            out.append((i, "probe"))
    return out
