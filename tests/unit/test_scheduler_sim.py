"""The cluster simulator behind benchmarks/scheduler/bench.py part (b) (`benchmarks.sim`), on
tiny scripted workloads: what a move costs, what a cut (partial rollout) carries into the next
step, and that an oracle run's scheduler is told the true lengths.

The cost model here is a round 10 ms per decode step and 1 ms per prefilled token, nothing else,
so the numbers can be followed by hand. The simulator drives the real `Scheduler`.
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.sim.bounds import (
    batching_bound_s,
    full_load_path_s,
    lower_bound_s,
    workload_bounds,
)
from benchmarks.sim.hindsight import EnginePeak, told_final_tokens
from benchmarks.sim.model import simulate
from benchmarks.sim.partial_rollout import simulate_partial
from benchmarks.sim.policies import POLICIES
from benchmarks.sim.workload import GPUS, Cost, SimTraj, gpu_cost, make_workload
from rstar2cli.scheduler.scheduler import SchedulerConfig

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "benchmarks.scheduler.bench"]

COST = Cost(a_s=0.01, b_s=0.0, c_s=0.0, p_s=0.001)


def config(**kw):
    # data order unless a test asks for another: the expected schedules below are worked by hand
    kw = {"admission": "data", **kw}
    return SchedulerConfig(kv_mode="incremental", step_tokens=100, kv_overcommit=1.0, **kw)


def crowded_home():
    """Two engines of 1000 tokens. a (200 tokens, a 3 s tool call, 100 more) and c (700 tokens)
    share engine 0; b (50 tokens) has engine 1 and is soon done. While a waits for its tool, c
    grows until a's next turn no longer fits at home."""
    a = SimTraj(100, [200, 100], [20], [3.0])
    b = SimTraj(100, [50], [], [])
    c = SimTraj(100, [700], [], [])
    return [a, b, c]


def test_a_move_prefills_the_context_again_on_the_new_engine_and_is_charged():
    moved = simulate(
        crowded_home(),
        config(migrate_after_s=0.0),
        num_engines=2,
        capacity_tokens=1000,
        max_response=800,
        cost=COST,
    )
    assert moved.num_migrations == 1 and moved.num_moved_tokens > 0
    # prefilled: three prompts, one tool answer, and the moved context once more
    assert moved.num_prefill_tokens == 3 * 100 + 20 + moved.num_moved_tokens
    busy_s = sum(moved.busy_s)
    assert moved.migration_overhead_share == pytest.approx(
        COST.p_s * moved.num_moved_tokens / busy_s
    )
    stay = simulate(
        crowded_home(),
        config(migrate_after_s=1e9),
        num_engines=2,
        capacity_tokens=1000,
        max_response=800,
        cost=COST,
    )
    assert stay.num_migrations == stay.num_moved_tokens == 0
    # waiting at home, a's and c's cached prefixes were evicted and prefilled again: that is
    # not a move's cost; here the move was cheaper than the wait
    assert stay.num_prefill_tokens > 3 * 100 + 20 and stay.makespan_s > moved.makespan_s


def test_a_cut_carries_the_unfinished_with_their_tokens_so_far():
    short = [SimTraj(100, [50], [], [], group=0) for _ in range(2)]
    long_ = [SimTraj(100, [300, 300], [20], [1.0], group=1) for _ in range(2)]
    cut = simulate(
        short + long_,
        config(),
        num_engines=2,
        capacity_tokens=4000,
        max_response=1000,
        cost=COST,
        stop_after_groups=1,
    )
    # the short group is whole after 50 steps; the long samples have made 50 of their 300 then
    assert cut.num_groups_done == 1 and cut.done == [True, True, False, False]
    assert cut.makespan_s == pytest.approx(0.2 + 50 * 0.01)  # 2 prompts per engine, 50 steps
    for t in cut.carried:
        assert (t.prompt_tokens, t.turns, t.chunks, t.group) == (150, [250, 300], [20], 1)
        assert (t.budget, t.carried_tokens) == (950, 50)
    rest = simulate(
        cut.carried, config(), num_engines=2, capacity_tokens=4000, max_response=1000, cost=COST
    )
    assert rest.done == [True, True]
    assert [a + b for a, b in zip(cut.decoded_tokens[2:], rest.decoded_tokens, strict=True)] == [
        600,
        600,
    ]  # every token made once, across the cut


def test_a_draining_cut_waits_for_the_requests_and_tool_calls_in_flight():
    """rl-stage's way: once the short group is whole nothing new is sent, but the long samples'
    requests in flight (the scheduler's steps of 100 tokens) finish first; what is carried goes
    on from there."""
    short = [SimTraj(100, [50], [], [], group=0) for _ in range(2)]
    long_ = [SimTraj(100, [300, 300], [20], [1.0], group=1) for _ in range(2)]
    cut = simulate(
        short + long_,
        config(),
        num_engines=2,
        capacity_tokens=4000,
        max_response=1000,
        cost=COST,
        stop_after_groups=1,
    )
    drained = simulate(
        short + long_,
        config(),
        num_engines=2,
        capacity_tokens=4000,
        max_response=1000,
        cost=COST,
        stop_after_groups=1,
        drain=True,
    )
    assert drained.done == [True, True, False, False]
    assert drained.decoded_tokens == [50, 50, 100, 100] and drained.makespan_s > cut.makespan_s
    for t in drained.carried:
        assert (t.prompt_tokens, t.turns, t.chunks, t.group) == (200, [200, 300], [20], 1)
        assert (t.budget, t.carried_tokens) == (900, 100)


def test_partial_rollout_over_provisions_carries_and_counts_the_old_tokens():
    # requests of at most 64 tokens: a stopping step waits for those in flight only
    cfg, cost = SchedulerConfig(step_tokens=64), Cost(0.01, 5e-5, 8e-8, 5e-5)
    whole = [
        simulate(
            make_workload(num_prompts=4, num_samples=4, max_response=2048, seed=s),
            cfg,
            num_engines=2,
            capacity_tokens=50_000,
            max_response=2048,
            cost=cost,
        ).makespan_s
        for s in range(3)
    ]
    run = dict(
        num_prompts=4,
        num_samples=4,
        max_response=2048,
        seed=0,
        num_steps=3,
        config=cfg,
        num_engines=2,
        capacity_tokens=50_000,
        cost=cost,
    )
    none = simulate_partial(over_provision=0.0, **run)
    assert [s.makespan_s for s in none] == pytest.approx(whole)  # nothing extra, nothing carried
    assert all(s.num_carried == 0 and s.off_policy_share == 0 for s in none)
    over = simulate_partial(over_provision=0.5, **run)
    assert all(s.num_groups_done >= 4 for s in over)
    assert over[0].off_policy_share == 0 and over[0].num_carried > 0  # step 0: nothing old yet
    assert any(s.off_policy_share > 0 for s in over[1:])


def test_an_oracle_run_starts_the_truly_longest_first():
    """One engine running one request at a time: in data order the short trajectory goes first
    and the long one finishes last; told the true lengths, predicted admission starts the long
    one first, so the short one finishes last."""
    work = [SimTraj(100, [50], [], []), SimTraj(100, [600], [], [])]
    cfg = config(admission="predicted", max_active_per_engine=1)
    blind = simulate(work, cfg, num_engines=1, capacity_tokens=1000, max_response=800, cost=COST)
    oracle = simulate(
        work, cfg, num_engines=1, capacity_tokens=1000, max_response=800, cost=COST, oracle=True
    )
    own = {"short": 0.1 + 50 * 0.01, "long": 0.1 + 600 * 0.01}  # prompt prefill + decode steps
    assert blind.last_own_s == pytest.approx(own["long"])
    assert oracle.last_own_s == pytest.approx(own["short"])
    assert oracle.last_start_s == pytest.approx(own["long"])


def test_the_projected_peak_is_the_kv_held_just_before_a_trajectory_ends():
    # (tokens to go, context now): after t steps the engine holds sum(c + t) over those with
    # more than t to go. Just before t = 4: 100 + 4 + 50 + 4 = 158; before t = 10: 110.
    peak = EnginePeak([(4, 50), (10, 100)])
    assert peak.peak() == 158
    # one more with 6 to go and context 20: before t = 4 all three hold 100 + 20 + 50 + 3 x 4
    # = 182; before t = 6 two of them, 100 + 20 + 2 x 6 = 132; before t = 10, 110
    assert peak.with_one(6, 20) == 182
    # a newcomer that ends before the 4-token one is done: 100 + 50 + 20 + 3 r for r < 4, and
    # from r = 4 on it holds its KV through the old peak: 182 whatever r
    assert [peak.with_one(r, 20) for r in (0, 3, 4, 50)] == [170, 179, 182, 182]
    assert peak.max_r(20, limit=181, max_r=100) == 3
    assert peak.max_r(20, limit=182, max_r=100) == 100
    assert peak.max_r(20, limit=169, max_r=100) == -1
    assert EnginePeak([]).with_one(7, 30) == 37


def test_the_hindsight_admission_is_told_each_trajectorys_length_or_its_prompts_mean():
    trajs = [(100, "a"), (200, "a"), (50, "b"), (10, None), (10, None)]  # (prompt, group)
    true = [10, 30, 7, 4, 8]  # response tokens
    told = {0: 110, 1: 230, 2: 57, 3: 14, 4: 18}
    assert told_final_tokens(trajs, true, "trajectory") == told
    # a's mean is 20; with no group, each is its own
    assert told_final_tokens(trajs, true, "prompt") == {**told, 0: 120, 1: 220}
    with pytest.raises(ValueError, match="unknown knowledge"):
        told_final_tokens(trajs, true, "group")


def test_a_peak_oracle_run_starts_the_truly_longest_first_and_holds_its_kv_under_the_limit():
    """One engine of 1000 KV tokens, so the hindsight admission projects to at most 900 (0.9).
    The 600-token trajectory starts first; the 50-token one fits beside it (peak 100 + 100 +
    2 x 50 = 300, then 700), the 500-token one does not (100 + 100 + 2 x 500 = 1200) and starts
    only once the 600-token one is done. Blind, all three start at once and fill the KV."""
    work = [SimTraj(100, [50], [], []), SimTraj(100, [600], [], []), SimTraj(100, [500], [], [])]
    blind = simulate(
        work, config(), num_engines=1, capacity_tokens=1000, max_response=800, cost=COST
    )
    peak = simulate(
        work,
        config(),
        num_engines=1,
        capacity_tokens=1000,
        max_response=800,
        cost=COST,
        peak_oracle="trajectory",
    )
    assert blind.last_start_s == 0 and blind.peak_kv_use == 1.0
    assert peak.peak_kv_use <= 0.9
    assert peak.last_own_s == pytest.approx(0.1 + 500 * 0.01)  # the 500-token one ends last
    assert peak.last_start_s == pytest.approx(peak.finish_s[1])  # when the 600-token one ended


def test_the_full_load_path_runs_every_step_at_the_work_bounds_batch_and_kv():
    # one trajectory: a 100-token prompt, one 50-token turn. Its context while decoding averages
    # (50 x 100 + 50 x 49 / 2) / 50 = 124.5 tokens, so 1000 KV tokens hold 8; max_num_seqs caps
    # the batch at 4, holding 4 x 124.5 = 498 tokens. A step there: 10 ms + 4 x 1 ms + 498 x
    # 0.01 ms = 18.98 ms; the path: 100 x 1 ms of prefill + 50 steps = 0.1 + 0.949 s.
    cost = Cost(a_s=0.01, b_s=0.001, c_s=1e-5, p_s=0.001)
    work = [SimTraj(100, [50], [], [])]
    assert full_load_path_s(
        work, capacity_tokens=1000, max_response=8192, cost=cost, max_num_seqs=4
    ) == pytest.approx(1.049)
    # alone (batch 1, its own context only) the same trajectory is faster: the critical path
    _, path = lower_bound_s(
        work, num_engines=1, capacity_tokens=1000, max_response=8192, cost=cost, max_num_seqs=4
    )
    assert path == pytest.approx(0.1 + 50 * (0.01 + 0.001) + 1e-5 * 6225)


def test_workload_bounds_gathers_every_bound_of_the_workload():
    """The same trajectory: one step-floor trajectory of 50 decode steps (0.5 s of fixed cost on
    the one engine, plus 0.1 s of prefill, 0.05 s of per-request and 0.06225 s of context work)."""
    cost = Cost(a_s=0.01, b_s=0.001, c_s=1e-5, p_s=0.001)
    work = [SimTraj(100, [50], [], [])]
    bounds = workload_bounds(
        work, num_engines=1, capacity_tokens=1000, max_response=8192, cost=cost, max_num_seqs=4
    )
    assert (bounds.work_s, bounds.critical_path_s) == lower_bound_s(
        work, num_engines=1, capacity_tokens=1000, max_response=8192, cost=cost, max_num_seqs=4
    )
    assert bounds.max_s == bounds.critical_path_s == pytest.approx(0.71225)
    assert bounds.full_load_path_s == pytest.approx(1.049)
    assert (bounds.step_floor_s, bounds.step_floor_tokens, bounds.num_step_floor) == (
        pytest.approx(0.71225),
        50,
        1,
    )
    assert bounds.batching_s == pytest.approx(bounds.critical_path_s)


def test_the_batching_bound_is_reached_by_identical_trajectories_sharing_one_engine():
    """Four 100-token trajectories on one engine, 10 ms a step + 1 ms per request in it. Alone,
    one takes 1.1 s (the critical path); all four need 0.4 s of per-request work besides at
    least 100 steps of 10 ms, so no schedule beats 1.4 s, and batching all four does 1.4 s. The
    work bound (steps of 256) and the critical path both say less."""
    cost = Cost(a_s=0.01, b_s=0.001, c_s=0.0, p_s=0.0)
    work = [SimTraj(100, [100], [], []) for _ in range(4)]
    bound = batching_bound_s(
        work, num_engines=1, capacity_tokens=10_000, max_response=8192, cost=cost
    )
    assert bound == pytest.approx(1.4, rel=1e-5)
    assert max(
        lower_bound_s(work, num_engines=1, capacity_tokens=10_000, max_response=8192, cost=cost)
    ) == pytest.approx(1.1)
    assert simulate(
        work, config(), num_engines=1, capacity_tokens=10_000, max_response=8192, cost=cost
    ).makespan_s == pytest.approx(1.4)
    assert (
        batching_bound_s(
            work,
            num_engines=1,
            capacity_tokens=10_000,
            max_response=8192,
            cost=replace(cost, acceptance=0.5, max_draft=2),
        )
        is None
    )


def test_kv_by_tenth_follows_the_contexts_held_and_averages_to_the_mean_kv_use():
    """One engine of 1000 tokens, 10 ms a step. A (100-token prompt, 300 tokens) and B (100,
    30) start together: B leaves after its 30 tokens, then A's context alone grows from 230 to
    400 tokens. Per tenth, the KV held is the running contexts; the tenths average to the run's
    mean KV use; none exceeds the peak."""
    cost = Cost(a_s=0.01, b_s=0.0, c_s=0.0, p_s=0.0)
    work = [SimTraj(100, [300], [], []), SimTraj(100, [30], [], [])]
    run = simulate(work, config(), num_engines=1, capacity_tokens=1000, max_response=400, cost=cost)
    assert run.makespan_s == pytest.approx(3.0)
    # 300 steps, the first 30 with both: 330 tokens, 1.1 a step
    assert run.num_steps == pytest.approx(300) and run.num_tokens == 330
    kv = run.kv_by_tenth
    assert len(kv) == 10 and sum(kv) / 10 == pytest.approx(run.mean_kv_use)
    assert max(kv) <= run.peak_kv_use
    # the first tenth (0.3 s, 30 steps) holds both: contexts 100 + 100 growing by 2 a step
    assert kv[0] == pytest.approx((200 + 2 * 15) / 1000, abs=0.005)
    # from then on A alone, one token a step: its context at the middle of the last tenth
    assert kv[-1] == pytest.approx((100 + 285) / 1000, abs=0.005)
    assert kv[1:] == sorted(kv[1:])


@pytest.mark.parametrize("seed", [0, 1])
def test_no_simulated_schedule_finishes_before_the_batching_bound(seed):
    """H100 costs, 8 prompts x 8 heavy-tailed multi-turn samples, 2 or 4 engines, every policy
    the benchmark compares: each makespan stays at or above the bound, which stays at or above
    the critical path."""
    cost, work = (
        gpu_cost(GPUS["h100"]),
        make_workload(num_prompts=8, num_samples=8, max_response=2048, seed=seed),
    )
    for engines in (2, 4):
        bound = batching_bound_s(
            work,
            num_engines=engines,
            capacity_tokens=20_000,
            max_response=2048,
            cost=cost,
            max_num_seqs=32,
        )
        assert (
            bound
            >= lower_bound_s(
                work,
                num_engines=engines,
                capacity_tokens=20_000,
                max_response=2048,
                cost=cost,
                max_num_seqs=32,
            )[1]
        )
        for policy in ("kv-incremental", "kv-predicted", "static", "least-requests"):
            cfg = SchedulerConfig(**POLICIES[policy], max_active_per_engine=32)
            run = simulate(
                work,
                cfg,
                num_engines=engines,
                capacity_tokens=20_000,
                max_response=2048,
                cost=cost,
                max_num_seqs=32,
            )
            assert run.makespan_s >= bound, (engines, policy, run.makespan_s, bound)


# speculative decoding: 10 ms a step, 1 ms per token verified, each draft token accepted half the
# time once the ones before it were
SPEC = Cost(a_s=0.01, b_s=0.001, c_s=0.0, p_s=0.001, acceptance=0.5, max_draft=4)


def test_a_step_makes_the_accepted_run_plus_one_and_drafts_where_it_pays():
    assert [SPEC.tokens_per_step(d) for d in range(5)] == [1, 1.5, 1.75, 1.875, 1.9375]
    # batch 1, time per token: d=0 11 ms, d=1 12/1.5 = 8 ms, d=2 13/1.75 = 7.43 ms,
    # d=3 14/1.875 = 7.47 ms: two drafts
    assert SPEC.draft(1, 0) == 2
    # batch 16: d=0 26 ms, d=1 42/1.5 = 28 ms: verifying costs more than it saves
    assert SPEC.draft(16, 0) == 0
    assert Cost(0.01, 0.001, 0.0, 0.001).draft(1, 0) == 0  # no speculation asked for
    # free verification would pay at any batch, but the engines' schedule stops above 32
    free = Cost(0.01, 0.0, 0.0, 0.001, acceptance=0.5, max_draft=4, spec_max_batch=32)
    assert (free.draft(32, 0), free.draft(33, 0)) == (4, 0)
    with pytest.raises(ValueError, match="acceptance"):
        Cost(0.01, 0.0, 0.0, 0.0, acceptance=1.0, max_draft=2)


def test_speculation_shortens_a_lone_trajectory_and_its_critical_path_alike():
    # a 100-token prompt and one 70-token turn alone on an engine: 70 / 1.75 = 40 steps of 13 ms
    # with speculation, 70 steps of 11 ms without; the same 70 tokens either way
    work = [SimTraj(100, [70], [], [])]
    plain = Cost(0.01, 0.001, 0.0, 0.001)
    fast = simulate(
        work, config(), num_engines=1, capacity_tokens=1000, max_response=800, cost=SPEC
    )
    slow = simulate(
        work, config(), num_engines=1, capacity_tokens=1000, max_response=800, cost=plain
    )
    assert fast.makespan_s == pytest.approx(0.1 + 40 * 0.013)
    assert slow.makespan_s == pytest.approx(0.1 + 70 * 0.011)
    assert fast.num_tokens == slow.num_tokens == 70
    assert (fast.num_steps, slow.num_steps) == (pytest.approx(40), pytest.approx(70))
    _, path = lower_bound_s(work, num_engines=1, capacity_tokens=1000, max_response=800, cost=SPEC)
    assert path == pytest.approx(fast.makespan_s)  # alone, the run is its own critical path


def test_the_work_bound_drafts_at_a_smaller_batch_when_that_is_cheaper_per_token():
    # four 50-token turns, KV and max_num_seqs room for a batch of 4; only batches up to 2 draft.
    # 10 ms a step, nothing else: batch 4 costs 2.5 ms a token; batch 2 drafting 4 tokens at
    # acceptance 0.7 makes (1 - 0.7^5) / 0.3 = 2.77 tokens a step each, 1.80 ms a token
    work = [SimTraj(100, [50], [], []) for _ in range(4)]
    cost = Cost(0.01, 0.0, 0.0, 0.0, acceptance=0.7, max_draft=4, spec_max_batch=2)
    bound, _ = lower_bound_s(
        work, num_engines=1, capacity_tokens=10_000, max_response=8192, cost=cost, max_num_seqs=4
    )
    assert bound == pytest.approx(200 * 0.01 / 2 / cost.tokens_per_step(4))
    # at acceptance 0.5 (1.94 tokens a step, 2.58 ms a token) the full batch stays cheaper
    half = Cost(0.01, 0.0, 0.0, 0.0, acceptance=0.5, max_draft=4, spec_max_batch=2)
    assert lower_bound_s(
        work, num_engines=1, capacity_tokens=10_000, max_response=8192, cost=half, max_num_seqs=4
    )[0] == pytest.approx(0.5)


def test_part_b_writes_each_runs_batching_bound_and_says_whether_target_1_can_be_met(tmp_path):
    """The benchmark at 1/32 scale: every row's JSON carries the batching bound, no row beats
    it, and the targets section says what it means for target 1."""
    out = tmp_path / "b.json"
    small = "--sim-engines 2 --sim-prompts 8 --sim-samples 4 --sim-max-response 1024"
    flags = "--sim-seeds 0,1 --policies kv-predicted,least-requests --sim-partial 0"  # the default
    done = subprocess.run(
        [*BENCH, "--part", "b", *small.split(), *flags.split(), "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 4
    for run in runs:
        assert run["critical_path_s"] <= run["batching_bound_s"] <= run["makespan_s"]
    assert "target 1 against the batching bound: per seed, no schedule goes below" in done.stdout


def test_sim_oracle_adds_the_hindsight_start_rows(tmp_path):
    out = tmp_path / "b.json"
    small = "--sim-gpu h100 --sim-engines 2 --sim-prompts 8 --sim-samples 8 --sim-seeds 0"
    flags = "--policies kv-incremental --sim-oracle --sim-partial none"
    subprocess.run(
        [*BENCH, "--part", "b", *small.split(), *flags.split(), "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    runs = {run["policy"]: run for run in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"kv-incremental", "kv-peak (oracle)", "kv-peak (prompt oracle)"}
    for run in runs.values():
        assert run["batching_bound_s"] <= run["makespan_s"]


def least_requests(trajs, **kw):
    """`simulate` under least-requests (no KV admission: what fits, the engines run)."""
    return simulate(trajs, SchedulerConfig(policy="least-requests", kv_mode="full"), **kw)


def on_two_engines(trajs, cost, cores, **kw):
    """`least_requests` on 2 engines with room for both trajectories, on `cores`."""
    return least_requests(
        trajs,
        num_engines=2,
        capacity_tokens=1000,
        max_response=400,
        cost=cost,
        engine_cores=cores,
        **kw,
    )


def test_engines_on_one_core_share_it_and_a_lone_one_runs_at_full_speed():
    cost = Cost(a_s=0.01, b_s=0.0, c_s=0.0, p_s=0.0)
    twins = [SimTraj(100, [320], [], []), SimTraj(100, [320], [], [])]

    def run(cores, trajs):
        return on_two_engines(trajs, cost, cores)

    own = run([(0,), (1,)], twins)
    shared = run([(0,), (0,)], twins)
    assert own.makespan_s == pytest.approx(320 * 0.01)  # each engine steps alone
    assert shared.makespan_s == pytest.approx(2 * own.makespan_s)  # both step on core 0
    assert sum(shared.busy_s) == pytest.approx(2 * shared.makespan_s)
    # one long and one short: the long one runs at half speed beside the short one, then alone
    uneven = [SimTraj(100, [320], [], []), SimTraj(100, [64], [], [])]
    alone = run([(0,), (1,)], uneven).makespan_s
    assert run([(0,), (0,)], uneven).makespan_s == pytest.approx(alone + 64 * 0.01)
    # a split that costs 8% (`sharing`): both steps stretch while they share, a lone one does not
    stretched = on_two_engines(uneven, cost, [(0,), (0,)], sharing=0.08).makespan_s
    assert stretched == pytest.approx(alone + 64 * 0.01 * 1.16)  # the pair: 2 x 1.08 per step
    assert on_two_engines(twins, cost, [(0,), (1,)], sharing=0.08).makespan_s == pytest.approx(
        own.makespan_s
    )


def test_engines_on_other_cores_slow_each_others_decode_but_not_prefill():
    def run(trajs, cost):
        return on_two_engines(trajs, cost, [(0,), (1,)], interference=0.1)

    decode = Cost(a_s=0.01, b_s=0.0, c_s=0.0, p_s=0.0)
    twins = [SimTraj(100, [320], [], []), SimTraj(100, [320], [], [])]
    assert run(twins, decode).makespan_s == pytest.approx(320 * 0.01 * 1.1)
    # the long one is slowed only while the short one steps beside it
    uneven = [SimTraj(100, [320], [], []), SimTraj(100, [64], [], [])]
    assert run(uneven, decode).makespan_s == pytest.approx(320 * 0.01 + 64 * 0.01 * 0.1)
    # one step that is all prefill (1 s) and no decode: bound by arithmetic, not slowed
    prefill = Cost(a_s=0.0, b_s=0.0, c_s=0.0, p_s=0.01)
    one_token = [SimTraj(100, [1], [], []), SimTraj(100, [1], [], [])]
    assert run(one_token, prefill).makespan_s == pytest.approx(1.0)


def test_a_shared_prefix_is_held_once_but_read_by_every_request():
    # two one-token trajectories whose 300-token prompts are one system prompt; KV of 400
    cost = Cost(a_s=1.0, b_s=0.0, c_s=1e-3, p_s=0.0)
    pair = [SimTraj(300, [1], [], []), SimTraj(300, [1], [], [])]

    def run(prefix):
        return least_requests(
            pair,
            num_engines=1,
            capacity_tokens=400,
            max_response=1,
            cost=cost,
            shared_prefix_tokens=prefix,
        )

    shared, whole = run(300), run(0)
    # held once, both fit: one step, which reads both contexts (1 s + 600 tokens x 1 ms)
    assert shared.makespan_s == pytest.approx(1.6) and shared.num_preemptions == 0
    assert shared.num_prefill_tokens == 300  # the prefix is computed once
    # held whole, one at a time: two steps of 1 s + 300 tokens
    assert whole.makespan_s == pytest.approx(2.6) and whole.num_prefill_tokens == 600


def test_a_next_turn_finds_only_the_full_blocks_of_its_last_context_cached():
    # prompt 100, a 20-token turn (context 120), a 5-token tool answer, a 10-token turn; blocks
    # of 16: 112 of the 120 were whole blocks and cached, so the second turn prefills 8 + 5
    trajs = [SimTraj(100, [20, 10], [5], [1.0])]

    def prefilled(block):
        kw = {"num_engines": 1, "capacity_tokens": 1024, "max_response": 64, "cost": COST}
        return least_requests(trajs, block_tokens=block, **kw).num_prefill_tokens

    assert prefilled(16) == 100 + 8 + 5
    assert prefilled(1) == 100 + 5


def test_eviction_takes_the_oldest_contexts_tail_blocks_first():
    from benchmarks.sim.engine import SimEngine

    eng = SimEngine(index=0, capacity_tokens=1024, max_num_seqs=8, block_tokens=128)
    eng.cache_put(1, 384)  # the older: three blocks
    eng.cache_put(2, 256)
    eng.evict(room_tokens=500)  # 140 tokens too many: two of the older's blocks go
    assert dict(eng.cached) == {1: 128, 2: 256} and eng.num_evicted_tokens == 256
    assert eng.num_cached_tokens == 384
    eng.evict(room_tokens=200)  # the rest of the older, then one block of the newer
    assert dict(eng.cached) == {2: 128} and eng.num_cached_tokens == 128
