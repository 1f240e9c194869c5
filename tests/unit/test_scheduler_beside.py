"""Part (a)'s predictions at each run's host speed (benchmarks/scheduler/beside.py): the speed of
a calibration pass and of a run, the cost scaled by it, and the simulator replaying a workload at
it, tool sleeps unscaled."""

import argparse

import pytest

from benchmarks.scheduler import cluster, real
from benchmarks.scheduler.beside import (
    beside_rows,
    pass_speeds,
    predict_beside,
    run_speeds,
    scaled_cost,
    sim_at_speed,
)
from benchmarks.scheduler.real_data import load_workload
from benchmarks.sim import replay
from benchmarks.sim.policies import add_scheduler_args
from benchmarks.sim.workload import Cost


def test_a_pass_is_as_fast_as_the_median_of_its_calls_against_every_pass():
    passes = [
        {"decode": 1.0, "prefill": 2.0, "long": 4.0},
        {"decode": 1.2, "prefill": 2.4, "long": 4.8},  # 20% longer than pass 0 on every call
        {"decode": 1.1, "prefill": 2.2, "long": 9.0},  # one outlier does not move its speed
    ]
    speeds = pass_speeds(passes)
    assert speeds[0] == pytest.approx(1.0 / 1.1)
    assert speeds[1] == pytest.approx(1.2 / 1.1)  # decode and prefill; long is its median
    assert speeds[2] == pytest.approx(1.0)  # decode 1.1/1.1, prefill 1, long 9/4.8: median 1
    # a probe times one call: its speed is against that call's median over every pass timing it
    # (1.15 with the probe), and it moves the median the passes' own decode calls are set against
    with_probe = pass_speeds([*passes, {"decode": 1.32}])
    assert with_probe[3] == pytest.approx(1.32 / 1.15)
    assert with_probe[0] == pytest.approx(1.0 / 1.15)  # decode 0.87, prefill 0.91, long 0.83


def test_a_run_takes_the_mean_speed_of_the_passes_on_either_side():
    # 4 runs, passes before runs 0 and 2 and after the last (slots 0, 2, 4)
    assert run_speeds([1.0, 1.2, 0.8], [0, 2, 4], 4) == pytest.approx([1.1, 1.1, 1.0, 1.0])
    assert run_speeds([1.0], [0], 2) == [None, None]  # one pass: no run has one after it
    assert run_speeds([0.9, 1.1], [0, 0], 1) == [None]  # both before


def test_a_slower_host_scales_every_time_term_but_not_the_knee():
    cost = Cost(a_s=0.1, b_s=0.01, c_s=1e-6, p_s=1e-4, knee=3.5)
    slow = scaled_cost(cost, 1.2)
    assert (slow.a_s, slow.b_s, slow.c_s, slow.p_s) == pytest.approx((0.12, 0.012, 1.2e-6, 1.2e-4))
    assert slow.knee == 3.5
    assert slow.step_s(8, 1000) == pytest.approx(1.2 * cost.step_s(8, 1000))


def test_runs_of_a_policy_at_one_speed_share_a_simulation_and_the_rows_keep_run_order():
    calls = []

    def simulate(name, speed):
        calls.append((name, speed))
        return 100.0 * speed

    runs = [("a", 1.0), ("b", 1.1), ("a", 1.0), ("b", None), ("a", 0.9)]
    beside = predict_beside(runs, simulate)
    assert beside == pytest.approx([100.0, 110.0, 100.0, None, 90.0])
    assert calls == [("a", 1.0), ("b", 1.1), ("a", 0.9)]
    rows = beside_rows(
        [n for n, _ in runs], [(s, p) for (_, s), p in zip(runs, beside, strict=True)]
    )
    assert rows["a"]["runs_speed"] == [1.0, 1.0, 0.9]
    assert rows["a"]["predicted_beside_s"] == pytest.approx(100.0)
    assert rows["b"]["beside_s"] == pytest.approx([110.0, None])
    assert rows["b"]["predicted_beside_s"] == pytest.approx(110.0)  # the run without is left out
    assert beside_rows(["c"], [(None, None)])["c"]["predicted_beside_s"] is None


class _CharTokenizer:
    """One token per character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _bench_args(*argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="a")
    real.add_args(ap)
    add_scheduler_args(ap)
    cluster.add_args(ap)
    return ap.parse_args(list(argv))


@pytest.mark.parametrize("tool_s", [0.0, 2.0])
def test_the_simulator_at_twice_the_cost_takes_twice_as_long_less_the_tool_sleeps(tmp_path, tool_s):
    path = tmp_path / "w.json"
    replays = [
        replay.Replay(
            group=g, sample=s, prompt_tokens=40, turns=[60, 30], chunks=[8], tool_s=[tool_s]
        )
        for g in range(3)
        for s in range(4)
    ]
    replay.save(path, replays, meta={"source": "test"})
    args = _bench_args("--replay", str(path), "--policies", "kv-predicted,least-requests")
    tok = _CharTokenizer()
    work = load_workload(args, tokenizer=tok)
    fit = {"capacity_tokens": [2048, 2048], "engine_cores": [[0], [1]], "block_tokens": 16}
    cost = Cost(a_s=0.05, b_s=0.002, c_s=1e-6, p_s=1e-4, knee=2.0)
    at = sim_at_speed(work, tok=tok, args=args, cost=cost, fit=fit)
    base = at(None, 1.0)
    assert set(base) == {"kv-predicted", "least-requests"}
    slow = at(["least-requests"], 2.0)
    assert set(slow) == {"least-requests"}
    one, two = base["least-requests"].makespan_s, slow["least-requests"].makespan_s
    if tool_s == 0.0:
        assert two == pytest.approx(2.0 * one, rel=1e-6)
    else:  # the sleeps do not scale with the host
        assert one < two <= 2.0 * one - tool_s + 1e-6  # at least one sleep on the longest path


def test_a_probe_goes_beside_every_run_a_pass_does_not_and_times_a_few_of_its_calls():
    from benchmarks.scheduler.beside import timings
    from benchmarks.scheduler.fit import calibration_plan, probe_calls

    assert timings(4, 2, probes=True) == [
        (0, "pass"),
        (1, "probe"),
        (2, "probe"),
        (3, "probe"),
        (4, "pass"),
    ]
    assert timings(4, 3, probes=False) == [(0, "pass"), (2, "pass"), (4, "pass")]
    assert timings(2, 0, probes=True) == [(0, "probe"), (1, "probe"), (2, "probe")]
    plan = calibration_plan(max_model_len=832, kv_tokens=4096, block_tokens=128)
    probe = probe_calls(plan)
    assert set(probe) <= set(plan)
    decode = [c for c in probe if c[2] > 1]
    assert sorted(p for _, p, _, _ in decode) == sorted({p for _, p, _, c in plan if not c})
    for batch, prompt, _, cached in decode:  # the largest uncached batch up to 8 of its prompt
        assert cached == 0 and batch == max(
            b for b, p, n, c in plan if p == prompt and n > 1 and not c and b <= 8
        )
    assert [c for c in probe if c[2] == 1] == [c for c in plan if c[2] == 1]  # the prefill


def test_the_table_sets_each_policys_median_run_against_its_median_prediction(capsys):
    from benchmarks.scheduler.beside import print_beside

    rows = beside_rows(["a", "b", "a"], [(1.0, 100.0), (None, None), (1.1, 110.0)])
    print_beside({"a": {"runs_s": [95.0, 105.0]} | rows["a"], "b": {"runs_s": [50.0]} | rows["b"]})
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if x.strip().startswith("a ")]
    assert line.split()[:4] == ["a", "100.0", "105.0", "1.05"]
    assert "(1.000, 95.0, 100.0), (1.100, 105.0, 110.0)" in line
    assert not [x for x in out.splitlines() if x.strip().startswith("b ")]  # no prediction
    print_beside({"b": {"runs_s": [50.0]} | rows["b"]})  # none at all: no table
    assert capsys.readouterr().out == ""
