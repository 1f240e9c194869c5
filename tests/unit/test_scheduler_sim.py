"""The cluster simulator behind benchmarks/scheduler_bench.py part (b), on tiny scripted workloads:
what a move costs, what a cut (partial rollout) carries into the next step, and that an oracle
run's scheduler is told the true lengths.

The cost model here is a round 10 ms per decode step and 1 ms per prefilled token, nothing else,
so the numbers can be followed by hand. The simulator drives the real `Scheduler`.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from partial_rollout import simulate_partial  # noqa: E402
from scheduler_sim import Cost, SimTraj, make_workload, simulate  # noqa: E402

from rstar2cli.scheduler.scheduler import SchedulerConfig  # noqa: E402

COST = Cost(a_s=0.01, b_s=0.0, c_s=0.0, p_s=0.001)


def config(**kw):
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
    moved = simulate(crowded_home(), config(migrate_after_s=0.0), 2, 1000, 800, COST)
    assert moved.num_migrations == 1 and moved.num_moved_tokens > 0
    # prefilled: three prompts, one tool answer, and the moved context once more
    assert moved.num_prefill_tokens == 3 * 100 + 20 + moved.num_moved_tokens
    busy_s = sum(moved.busy_s)
    assert moved.migration_overhead_share == pytest.approx(
        COST.p_s * moved.num_moved_tokens / busy_s
    )
    stay = simulate(crowded_home(), config(migrate_after_s=1e9), 2, 1000, 800, COST)
    assert stay.num_migrations == stay.num_moved_tokens == 0
    # waiting at home, a's and c's cached prefixes were evicted and prefilled again: that is
    # not a move's cost; here the move was cheaper than the wait
    assert stay.num_prefill_tokens > 3 * 100 + 20 and stay.makespan_s > moved.makespan_s


def test_a_cut_carries_the_unfinished_with_their_tokens_so_far():
    short = [SimTraj(100, [50], [], [], group=0) for _ in range(2)]
    long_ = [SimTraj(100, [300, 300], [20], [1.0], group=1) for _ in range(2)]
    cut = simulate(short + long_, config(), 2, 4000, 1000, COST, stop_after_groups=1)
    # the short group is whole after 50 steps; the long samples have made 50 of their 300 then
    assert cut.num_groups_done == 1 and cut.done == [True, True, False, False]
    assert cut.makespan_s == pytest.approx(0.2 + 50 * 0.01)  # 2 prompts per engine, 50 steps
    for t in cut.carried:
        assert (t.prompt_tokens, t.turns, t.chunks, t.group) == (150, [250, 300], [20], 1)
        assert (t.budget, t.carried_tokens) == (950, 50)
    rest = simulate(cut.carried, config(), 2, 4000, 1000, COST)
    assert rest.done == [True, True]
    assert [a + b for a, b in zip(cut.decoded_tokens[2:], rest.decoded_tokens, strict=True)] == [
        600,
        600,
    ]  # every token made once, across the cut


def test_partial_rollout_over_provisions_carries_and_counts_the_old_tokens():
    cfg, cost = SchedulerConfig(), Cost(0.01, 5e-5, 8e-8, 5e-5)
    whole = [
        simulate(make_workload(4, 4, 2048, s), cfg, 2, 50_000, 2048, cost).makespan_s
        for s in range(3)
    ]
    none = simulate_partial(4, 4, 2048, 0, 3, 0.0, cfg, 2, 50_000, cost)
    assert [s.makespan_s for s in none] == pytest.approx(whole)  # nothing extra, nothing carried
    assert all(s.num_carried == 0 and s.off_policy_share == 0 for s in none)
    over = simulate_partial(4, 4, 2048, 0, 3, 0.5, cfg, 2, 50_000, cost)
    assert all(s.num_groups_done >= 4 for s in over)
    assert over[0].off_policy_share == 0 and over[0].num_carried > 0  # step 0: nothing old yet
    assert any(s.off_policy_share > 0 for s in over[1:])


def test_an_oracle_run_starts_the_truly_longest_first():
    """One engine running one request at a time: in data order the short trajectory goes first
    and the long one finishes last; told the true lengths, predicted admission starts the long
    one first, so the short one finishes last."""
    work = [SimTraj(100, [50], [], []), SimTraj(100, [600], [], [])]
    cfg = config(admission="predicted", max_active_per_engine=1)
    blind = simulate(work, cfg, 1, 1000, 800, COST)
    oracle = simulate(work, cfg, 1, 1000, 800, COST, oracle=True)
    own = {"short": 0.1 + 50 * 0.01, "long": 0.1 + 600 * 0.01}  # prompt prefill + decode steps
    assert blind.last_own_s == pytest.approx(own["long"])
    assert oracle.last_own_s == pytest.approx(own["short"])
    assert oracle.last_start_s == pytest.approx(own["long"])
