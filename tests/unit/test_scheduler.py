"""The scheduler state machine with fake block budgets and hand-made outputs.

Engines here are plain numbers (KV capacities in tokens); "outputs" are scripted token counts. A
small event loop (`run_script`) plays trajectories whose turns generate a given number of tokens
and then call a tool or stop, with a fake clock, and checks the ledger after every event.
"""

import heapq
import random

import pytest

from rstar2cli.scheduler.scheduler import Scheduler, SchedulerConfig, Status


def make(capacities, policy="kv", clock=None, **kw):
    kw.setdefault("kv_mode", "full")  # the paper's mode unless a test names another
    kw.setdefault("kv_overcommit", 1.0)  # exact budgets unless a test names an over-commit
    config = SchedulerConfig(policy=policy, **kw)
    return Scheduler(capacities, config, clock=clock or (lambda: 0.0))


def keys_engines(dispatches):
    return [(d.key, d.engine) for d in dispatches]


# -- kv policy, full mode (paper) ----------------------------------------------------------------


def test_kv_full_admits_only_what_fits_and_spreads_to_most_free():
    # Each trajectory reserves 100 + 400 = 500 tokens; two engines of 1000 hold two each.
    s = make([1000, 1000])
    for k in range(5):
        s.add(k, prompt_tokens=100, max_response_tokens=400)
    first = s.schedule()
    assert keys_engines(first) == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert all(d.max_tokens == 400 for d in first)
    assert s.slots[4].status is Status.WAITING and s.ledger.free(0) == s.ledger.free(1) == 0
    assert s.schedule() == []  # nothing fits; nothing over-commits


def test_a_shared_prefix_is_counted_once_per_engine():
    # prompts of 400 tokens, 300 of them a system prompt every prompt starts with; budget 50.
    # Counted whole, an engine of 1000 holds two (2 x 450); the prefix once, four (300 + 4 x 150)
    config = SchedulerConfig(policy="kv", kv_mode="full", kv_overcommit=1.0)
    alone, shared = Scheduler([1000], config), Scheduler([1000], config, shared_prefix_tokens=300)
    for s in (alone, shared):
        for k in range(5):
            s.add(k, prompt_tokens=400, max_response_tokens=50)
    assert len(alone.schedule()) == 2 and len(shared.schedule()) == 4
    assert shared.capacity_tokens == [700] and shared.ledger.free(0) == 700 - 4 * 150
    # told whole contexts, it keeps each trajectory's own tokens; a finished one frees its own
    shared.on_generated(0, 430, Status.DONE)
    assert shared.ledger.free(0) == 250 and len(shared.schedule()) == 1


def test_kv_refills_in_data_order_on_the_engine_that_freed():
    s = make([1000, 1000])
    for k in range(6):
        s.add(k, 100, 400)
    s.schedule()
    s.on_generated(1, 300, Status.DONE)  # engine 1 frees 500 tokens
    assert keys_engines(s.schedule()) == [(4, 1)]  # key 4 before key 5
    s.on_generated(0, 250, Status.DONE)
    assert keys_engines(s.schedule()) == [(5, 0)]


def test_kv_full_keeps_the_reservation_through_tool_and_returns_to_its_engine():
    s = make([1000, 2000])
    s.add("a", 100, 400)
    (d,) = s.schedule()
    assert d.engine == 1  # most free KV
    s.on_generated("a", 180, Status.TOOL)
    assert s.ledger.used(1) == 500  # full mode holds it while the tool runs
    s.on_tool_done("a", 200)
    (d2,) = s.schedule()
    assert (d2.engine, d2.max_tokens) == (1, 300)  # affinity; budget left = 500 - 200


def test_kv_serves_continuing_trajectories_before_new_ones():
    s = make([500], max_active_per_engine=1)  # engine runs one request at a time
    s.add("old", 100, 400)
    s.schedule()
    s.on_generated("old", 150, Status.TOOL)
    s.on_tool_done("old", 170)
    s.add("new", 50, 100)
    assert keys_engines(s.schedule()) == [("old", 0)]


def test_kv_rejects_a_trajectory_that_can_never_fit():
    s = make([400, 300])
    with pytest.raises(ValueError, match="KV tokens"):
        s.add("huge", 100, 400)


def test_kv_running_cap_is_respected():
    s = make([10_000], max_active_per_engine=2)
    for k in range(4):
        s.add(k, 10, 10)
    assert len(s.schedule()) == 2
    s.on_generated(0, 15, Status.DONE)
    assert keys_engines(s.schedule()) == [(2, 0)]


def test_block_budget_rounds_reservations():
    # 16-token blocks: 100 + 400 = 500 -> 512 tokens, so a 1024-token engine holds two, not three
    # (three would need 1536; with token accounting 2 x 500 leaves 24 but the third needs 500).
    s = Scheduler([1024], SchedulerConfig(kv_mode="full"), block_size_tokens=16, clock=lambda: 0.0)
    for k in range(3):
        s.add(k, 100, 400)
    assert len(s.schedule()) == 2 and s.ledger.used(0) == 1024


# -- kv policy, per_turn mode ---------------------------------------------------------------------


def test_per_turn_reserves_context_plus_step_and_releases_during_tool():
    s = make([1000], kv_mode="per_turn", step_tokens=200)
    s.add("a", 100, 1000)  # full mode could never admit it (1100 > 1000)
    (d,) = s.schedule()
    assert d.max_tokens == 200 and s.ledger.used(0) == 300
    s.on_generated("a", 300, Status.TOOL)
    assert s.ledger.used(0) == 0  # nothing held while the tool runs
    s.on_tool_done("a", 340)
    (d2,) = s.schedule()
    assert d2.max_tokens == 200 and s.ledger.used(0) == 540


def test_per_turn_step_is_capped_by_the_remaining_budget():
    s = make([1000], kv_mode="per_turn", step_tokens=200)
    s.add("a", 100, 250)
    s.schedule()
    s.on_generated("a", 300, Status.WAITING)  # the turn was cut by the step: continue it
    (d,) = s.schedule()
    assert d.max_tokens == 50


def test_per_turn_affinity_then_migration_then_waiting():
    s = make([1000, 1000], kv_mode="per_turn", step_tokens=100)
    s.add("a", 100, 2000)
    (d,) = s.schedule()
    home = d.engine
    other = 1 - home
    s.on_generated("a", 200, Status.TOOL)
    s.on_tool_done("a", 220)
    # home has room: back home even though both engines are equally free
    assert keys_engines(s.schedule()) == [("a", home)]
    s.on_generated("a", 320, Status.TOOL)
    s.ledger.force_reserve("filler-home", home, 800)  # home now has 200 free, needs 340 + 100
    s.on_tool_done("a", 340)
    assert keys_engines(s.schedule()) == [("a", other)]
    assert s.num_migrations == 1 and s.slots["a"].engine == other
    s.on_generated("a", 440, Status.TOOL)
    s.ledger.force_reserve("filler-other", other, 700)  # neither engine fits 460 + 100 now
    s.on_tool_done("a", 460)
    assert s.schedule() == [] and s.slots["a"].status is Status.WAITING
    s.ledger.release("filler-home")
    assert keys_engines(s.schedule()) == [("a", home)]


# -- kv policy, incremental mode -----------------------------------------------------------------


def test_incremental_reserves_step_and_keeps_the_context_through_the_tool():
    s = make([1000], kv_mode="incremental", step_tokens=200)
    s.add("a", 100, 600)
    (d,) = s.schedule()
    assert d.max_tokens == 200 and s.ledger.used(0) == 300
    s.on_generated("a", 300, Status.TOOL)
    assert s.ledger.used(0) == 300  # the context stays reserved: its prefix stays cached
    s.on_tool_done("a", 340)
    (d2,) = s.schedule()
    assert (d2.engine, d2.max_tokens) == (0, 200) and s.ledger.used(0) == 540
    s.on_generated("a", 540, Status.DONE)
    assert s.ledger.used(0) == 0


def test_incremental_rejects_a_trajectory_whose_budget_can_never_fit():
    s = make([1000], kv_mode="incremental", step_tokens=100)
    with pytest.raises(ValueError, match="KV tokens"):
        s.add("a", 100, 1000)  # its first step fits, its last could not


def test_overcommit_lets_reservations_reach_that_multiple_of_the_kv_and_no_further():
    s = make([1000], kv_mode="incremental", step_tokens=200, kv_overcommit=1.25)
    for k in "abcde":
        s.add(k, 50, 400)  # each reserves 250; 1000 holds four, 1250 five
    assert len(s.schedule()) == 5 and s.ledger.used(0) == 1250
    s.add("f", 50, 400)
    assert s.schedule() == []  # a sixth would pass 1.25 x the KV
    with pytest.raises(ValueError, match="largest engine has 1000"):
        s.add("g", 100, 1000)  # its whole budget must still fit the real KV


def test_overcommit_leaves_the_papers_full_mode_and_the_baselines_exact():
    for policy, mode in (("kv", "full"), ("least-requests", "full"), ("static", "full")):
        s = make([1000], policy=policy, kv_mode=mode, kv_overcommit=1.5)
        assert s.ledger.capacity_tokens == [1000] and s.capacity_tokens == [1000]


def test_incremental_waits_for_home_then_migrates_after_the_timeout():
    now = [0.0]
    s = make(
        [1000, 1000],
        kv_mode="incremental",
        step_tokens=100,
        migrate_after_s=5.0,
        drain_balance=None,  # the drain's own moves are tested below
        clock=lambda: now[0],
    )
    for k in ("a", "b", "c"):
        s.add(k, 100, 800)
    assert keys_engines(s.schedule()) == [("a", 0), ("b", 1), ("c", 0)]  # tie -> fewer running
    s.on_generated("a", 200, Status.TOOL)
    s.ledger.force_reserve("filler", 0, 550)  # engine 0: a 200 + c 200 + 550; 50 free
    s.on_tool_done("a", 220)  # needs 320: 120 more than it holds
    assert s.schedule() == []  # c still runs at home: wait there rather than re-prefill elsewhere
    now[0] = 5.0
    assert keys_engines(s.schedule()) == [("a", 1)]
    assert s.num_migrations == 1 and s.ledger.used(0) == 750 and s.ledger.used(1) == 520


def test_incremental_owes_freed_room_to_its_waiting_trajectory_before_new_ones():
    s = make([1000], kv_mode="incremental", step_tokens=100, min_step_tokens=100)
    s.add("a", 100, 800)
    s.add("b", 100, 800)
    s.schedule()
    s.on_generated("a", 200, Status.TOOL)
    s.ledger.force_reserve("filler", 0, 500)  # a 200 + b 200 + 500: 100 free
    s.on_tool_done("a", 220)  # needs 120 more
    s.add("new", 50, 50)  # needs 100: it fits, but the room is owed to a
    assert s.schedule() == []
    s.on_generated("b", 200, Status.DONE)
    assert keys_engines(s.schedule()) == [("a", 0), ("new", 0)]
    assert s.ledger.used(0) == 500 + 320 + 100


def test_incremental_goes_on_at_home_with_a_smaller_step_when_a_full_one_does_not_fit():
    s = make([1000], kv_mode="incremental", step_tokens=100, min_step_tokens=50)
    s.add("a", 100, 800)
    s.add("b", 100, 800)
    s.schedule()
    s.on_generated("a", 200, Status.TOOL)
    s.ledger.force_reserve("filler", 0, 500)  # 100 free: a can grow by 80, not 100
    s.on_tool_done("a", 220)
    (d,) = s.schedule()
    assert (d.key, d.engine, d.max_tokens) == ("a", 0, 80) and s.ledger.free(0) == 0
    s.on_generated("a", 300, Status.WAITING)  # cut by its smaller step; next one is full again
    s.on_generated("b", 200, Status.DONE)
    (d2,) = s.schedule()
    assert d2.max_tokens == 100 and s.ledger.used(0) == 500 + 400


def _drain_setup(**kw):
    s = make([1000, 1000], kv_mode="incremental", step_tokens=100, migrate_after_s=1e9, **kw)
    for k in ("a", "b", "c"):
        s.add(k, 100, 800)
    assert keys_engines(s.schedule()) == [("a", 0), ("b", 1), ("c", 0)]
    s.on_generated("b", 200, Status.DONE)  # engine 1 is empty now
    s.ledger.force_reserve("filler", 0, 500)  # engine 0: c 200 + 500 besides a
    s.on_generated("a", 200, Status.WAITING)  # a needs 200 + 100; 300 are free at home
    return s


def test_incremental_drain_moves_a_ready_trajectory_off_a_much_fuller_engine():
    s = _drain_setup()  # default drain_balance 0.7: 0 + 300 < 0.7 * 700 on engine 1
    assert keys_engines(s.schedule()) == [("a", 1)]
    assert s.num_migrations == 1 and s.ledger.used(0) == 700 and s.ledger.used(1) == 300


def test_incremental_drain_stays_while_trajectories_wait_to_start_or_when_off():
    s = _drain_setup()
    s.add("d", 100, 800)  # something is still to start: this is not the drain
    assert keys_engines(s.schedule()) == [("a", 0), ("d", 1)]
    s = _drain_setup(drain_balance=None)
    assert keys_engines(s.schedule()) == [("a", 0)]
    s = _drain_setup(drain_balance=0.4)  # 300 is not under 0.4 * 700
    assert keys_engines(s.schedule()) == [("a", 0)]


def test_incremental_moves_at_once_when_nothing_runs_at_home():
    s = make([1000, 1000], kv_mode="incremental", step_tokens=100, migrate_after_s=1e9)
    s.add("a", 100, 800)
    s.schedule()
    s.on_generated("a", 200, Status.TOOL)
    s.ledger.force_reserve("filler", 0, 750)  # nothing will free room on engine 0
    s.on_tool_done("a", 220)
    assert keys_engines(s.schedule()) == [("a", 1)]
    assert s.ledger.used(0) == 750  # its old hold was released


# -- baselines -----------------------------------------------------------------------------------


def test_static_splits_evenly_up_front_and_never_helps_another_engine():
    s = make([10_000, 10_000], policy="static", max_active_per_engine=1)
    for k in range(4):
        s.add(k, 10, 100)
    # contiguous halves: keys 0, 1 -> engine 0; keys 2, 3 -> engine 1
    assert keys_engines(s.schedule()) == [(0, 0), (2, 1)]
    s.on_generated(2, 50, Status.DONE)
    # engine 1 runs its own next share (key 3), never key 1, which belongs to engine 0
    assert keys_engines(s.schedule()) == [(3, 1)]
    s.on_generated(3, 50, Status.DONE)
    assert s.schedule() == []  # engine 1 idles while engine 0 still has key 1 queued
    s.on_generated(0, 50, Status.DONE)
    assert keys_engines(s.schedule()) == [(1, 0)]


def test_static_over_commits_in_the_ledger_instead_of_waiting():
    s = make([1000], policy="static", max_active_per_engine=3)
    for k in range(3):
        s.add(k, 100, 400)
    assert len(s.schedule()) == 3
    assert s.ledger.used(0) == 1500 and s.ledger.over_committed()


def test_least_requests_picks_fewest_in_flight_and_sticks():
    s = make([10_000, 10_000, 10_000], policy="least-requests", max_active_per_engine=2)
    for k in range(7):
        s.add(k, 10, 100)
    assert keys_engines(s.schedule()) == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2)]
    s.on_generated(0, 30, Status.TOOL)  # engine 0: 1 in flight, 2 active (full)
    s.on_generated(4, 30, Status.TOOL)
    s.on_generated(1, 30, Status.DONE)  # engine 1: 0 in flight, 1 active
    assert keys_engines(s.schedule()) == [(6, 1)]
    s.on_tool_done(0, 40)
    assert keys_engines(s.schedule()) == [(0, 0)]  # sticky: back to engine 0


# -- whole runs: invariants ------------------------------------------------------------------------


def run_script(s, scripts, tool_s=3.0):
    """Play scripted trajectories; each request produces the scripted tokens at 1 token per time
    unit. scripts[key] = list of (num_tokens, "tool" | "stop"). Returns the finish time."""
    now = [0.0]
    s.clock = lambda: now[0]
    turn = {k: 0 for k in scripts}
    length = {k: s.slots[k].num_tokens for k in scripts}
    events, seq = [], 0
    while not s.all_done:
        for d in s.schedule():
            n, kind = scripts[d.key][turn[d.key]]
            n = min(n, d.max_tokens)
            heapq.heappush(events, (now[0] + n, seq, "gen", d.key, n, kind, d.max_tokens))
            seq += 1
        assert_no_over_commit(s)
        if not events:
            raise AssertionError("deadlock: nothing running, not all done")
        t, _, what, key, n, kind, max_tokens = heapq.heappop(events)
        now[0] = t
        if what == "tool":
            length[key] += 5
            s.on_tool_done(key, length[key])
            continue
        length[key] += n
        budget_left = s.slots[key].worst_case_tokens - length[key]
        if n == max_tokens and budget_left > 0 and n < scripts[key][turn[key]][0]:
            scripts[key][turn[key]] = (scripts[key][turn[key]][0] - n, kind)  # cut by the step
            s.on_generated(key, length[key], Status.WAITING)
        elif kind == "tool" and turn[key] + 1 < len(scripts[key]) and budget_left > 5:
            turn[key] += 1
            s.on_generated(key, length[key], Status.TOOL)
            heapq.heappush(events, (now[0] + tool_s, seq, "tool", key, 0, "", 0))
            seq += 1
        else:
            s.on_generated(key, length[key], Status.DONE)
        assert_no_over_commit(s)
    return now[0]


def assert_no_over_commit(s):
    if s.config.policy == "kv":
        for e in range(s.num_engines):
            assert s.ledger.used(e) <= s.ledger.capacity_tokens[e]


def random_scripts(rng, num, max_response):
    scripts = {}
    for k in range(num):
        num_turns = rng.randint(1, 4)
        scripts[k] = [
            (rng.choice([5, 20, 60, max_response // 2]), "tool" if i + 1 < num_turns else "stop")
            for i in range(num_turns)
        ]
    return scripts


@pytest.mark.parametrize("overcommit", [1.0, 1.2])
@pytest.mark.parametrize("kv_mode", ["full", "per_turn", "incremental"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kv_never_over_commits_and_finishes_everything(kv_mode, seed, overcommit):
    rng = random.Random(seed)
    caps = [rng.choice([600, 900, 1200]) for _ in range(3)]
    s = make(caps, kv_mode=kv_mode, step_tokens=64, kv_overcommit=overcommit)
    scripts = random_scripts(rng, 40, max_response=400)
    for k in scripts:
        s.add(k, rng.randint(20, 150), 400)
    run_script(s, scripts)
    assert s.all_done and all(s.ledger.used(e) == 0 for e in range(3))
    budget = [int(c * (1.0 if kv_mode == "full" else overcommit)) for c in caps]
    assert s.count(Status.DONE) == 40
    assert all(s.ledger.max_used_tokens[e] <= budget[e] for e in range(3))


def test_busy_time_is_time_with_requests_in_flight():
    s = make([1000, 1000], max_active_per_engine=1)
    s.add("a", 10, 100)
    s.add("b", 10, 100)
    end = run_script(s, {"a": [(10, "tool"), (10, "stop")], "b": [(4, "stop")]}, tool_s=3.0)
    # a: runs 0-10, tool 10-13, runs 13-23 on its engine; b: 0-4 on the other.
    assert end == 23.0
    assert sorted([s.busy_s(0), s.busy_s(1)]) == [4.0, 20.0]


def test_kv_beats_static_on_a_long_tail_in_fake_time():
    # One long trajectory per engine share would pin static; kv hands work to whoever has room.
    scripts = {k: [(300 if k == 0 else 20, "stop")] for k in range(12)}
    ends = {}
    for policy in ("kv", "static"):
        s = make([2000, 2000], policy=policy, max_active_per_engine=1)
        for k in scripts:
            s.add(k, 10, 400)
        ends[policy] = run_script(s, {k: list(v) for k, v in scripts.items()})
    # static: engine 0 runs key 0 (300) then its share 1..5 (5 x 20) -> 400;
    # kv: engine 1 takes every short one while engine 0 runs key 0 -> 300.
    assert (ends["kv"], ends["static"]) == (300.0, 400.0)


# -- predicted lengths: admission order and tail engines -------------------------------------------


def test_predicted_admission_spreads_the_first_wave_then_starts_the_longest_group_first():
    s = make([700], kv_mode="incremental", step_tokens=100, admission="predicted")
    for g in "ab":
        for i in range(3):
            s.add((g, i), 100, 400, group=g)  # each start reserves 100 + 100
    # nothing known yet: one sample of every prompt before a second of any (data order would
    # start a0 a1 a2)
    assert [d.key for d in s.schedule()] == [("a", 0), ("b", 0), ("a", 1)]
    s.on_generated(("a", 0), 150, Status.DONE)  # a's first sample stopped at 50 tokens
    s.on_generated(("b", 0), 200, Status.WAITING)  # b's is at 100 and still going
    # predicted: a's median 50 (its one finished sample sits at share 1/2); b's at least 100.
    # b0 continues first (300 reserved), then b's next sample starts before a's: 200 + 300 + 200
    assert [d.key for d in s.schedule()] == [("b", 0), ("b", 1)]
    assert s.ledger.used(0) == 700


def _tail_setup():
    s = make(
        [2000, 2000],
        admission="data",  # g0 g1 g2 start before x: g2 on engine 0, x on engine 1
        kv_mode="incremental",
        step_tokens=100,
        tail_kv_fraction=0.5,
        drain_balance=None,
        migrate_after_s=1e9,
    )
    for i in range(3):
        s.add(("g", i), 100, 400, group="g")
    s.add("x", 100, 400)
    engine_of = {d.key: d.engine for d in s.schedule()}
    assert engine_of[("g", 2)] == 0 and engine_of["x"] == 1
    s.on_generated(("g", 0), 480, Status.DONE)  # both siblings ran to 380 of their 400 tokens
    s.on_generated(("g", 1), 480, Status.DONE)
    s.ledger.force_reserve("filler", 0, 800)  # engine 0 is the busier one
    return s


def test_a_trajectory_predicted_long_moves_to_a_tail_engine_at_its_tool_call():
    s = _tail_setup()
    s.on_generated(("g", 2), 150, Status.TOOL)
    s.on_tool_done(("g", 2), 170)  # siblings at 380: predicted ~380 >= 3/4 of its 400
    # engine 1 (the less used) becomes a tail engine; g2 moves there and re-prefills its context
    assert keys_engines(s.schedule()) == [(("g", 2), 1)]
    assert s.tail.engines == {1} and s.num_tail_moves == 1 and s.num_migrations == 1
    assert s.ledger.used(1) == 200 + 270 and s.ledger.used(0) == 800  # x + (170 + 100); filler
    s.add("new", 100, 400)  # nothing known of it: not long, so not onto the tail engine
    assert keys_engines(s.schedule()) == [("new", 0)]  # though engine 1 has more free KV


def test_a_trajectory_predicted_long_stays_at_a_step_boundary():
    s = _tail_setup()
    s.on_generated(("g", 2), 200, Status.WAITING)  # its request was cut by the step, mid-turn
    assert keys_engines(s.schedule()) == [(("g", 2), 0)]
    assert s.num_tail_moves == 0 and not s.tail.engines


def test_a_single_engine_never_becomes_a_tail_engine():
    """A tail engine takes nothing that is not predicted long: were the only engine one, a new
    trajectory could never start (the rollout would wait forever)."""
    s = make([2000], kv_mode="incremental", step_tokens=100, tail_kv_fraction=0.5)
    for i in range(3):
        s.add(("g", i), 100, 400, group="g")
    assert len(s.schedule()) == 3
    s.on_generated(("g", 0), 480, Status.DONE)
    s.on_generated(("g", 1), 480, Status.DONE)
    s.on_generated(("g", 2), 150, Status.TOOL)
    s.on_tool_done(("g", 2), 170)  # predicted long, at a tool call: with two engines it moves
    assert keys_engines(s.schedule()) == [(("g", 2), 0)]
    assert not s.tail.engines and s.num_tail_moves == 0
    s.add("new", 100, 400)
    assert keys_engines(s.schedule()) == [("new", 0)]


@pytest.mark.parametrize("tail_kv_fraction", [None, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_predicted_admission_and_tail_engines_never_over_commit_and_finish(seed, tail_kv_fraction):
    rng = random.Random(seed)
    caps = [rng.choice([600, 900, 1200]) for _ in range(8)]
    s = make(
        caps,
        kv_mode="incremental",
        step_tokens=64,
        kv_overcommit=1.1,
        admission="predicted",
        tail_kv_fraction=tail_kv_fraction,
    )
    scripts = {}
    for k in range(48):  # 8 prompts x 6 samples; a prompt's turns share their length
        turn = [20, 60, 200][k // 6 % 3]
        num_turns = rng.randint(1, 4)
        scripts[k] = [(turn, "tool" if i + 1 < num_turns else "stop") for i in range(num_turns)]
        s.add(k, rng.randint(20, 150), 400, group=k // 6)
    run_script(s, scripts)
    assert s.all_done and all(s.ledger.used(e) == 0 for e in range(8))
    assert all(s.ledger.max_used_tokens[e] <= int(c * 1.1) for e, c in enumerate(caps))
