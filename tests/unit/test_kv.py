"""The KV ledger with fake block budgets: reserve, refuse, release, blocks, over-commit records."""

import pytest

from rstar2cli.scheduler.kv import KVLedger


def test_reserve_until_full_then_refuse_without_change():
    ledger = KVLedger([100, 50])
    assert ledger.reserve("a", 0, 60)
    assert ledger.free(0) == 40
    assert not ledger.reserve("b", 0, 41)  # 60 + 41 > 100
    assert ledger.used(0) == 60 and ledger.holding("b") is None
    assert ledger.reserve("b", 0, 40)  # exactly full is allowed
    assert ledger.free(0) == 0 and ledger.used(1) == 0
    assert not ledger.over_committed()


def test_release_returns_the_reservation_and_frees_it():
    ledger = KVLedger([100])
    ledger.reserve("a", 0, 70)
    res = ledger.release("a")
    assert (res.engine, res.num_tokens) == (0, 70)
    assert ledger.free(0) == 100
    assert ledger.release("a") is None  # releasing twice is a no-op


def test_reservations_round_up_to_whole_blocks():
    # 16-token blocks, 4 blocks per engine: 17 tokens take 2 blocks (32 tokens).
    ledger = KVLedger([64], block_size_tokens=16)
    assert ledger.reserve("a", 0, 17)
    assert ledger.used(0) == 32
    assert ledger.fits(0, 32) and not ledger.fits(0, 33)
    assert not ledger.reserve("b", 0, 33)


def test_double_reserve_is_a_bug():
    ledger = KVLedger([100])
    ledger.reserve("a", 0, 10)
    with pytest.raises(ValueError):
        ledger.reserve("a", 0, 10)


def test_force_reserve_records_over_commit_and_peak():
    ledger = KVLedger([100, 100])
    ledger.force_reserve("a", 1, 80)
    ledger.force_reserve("b", 1, 80)
    assert ledger.used(1) == 160 and ledger.over_committed()
    assert ledger.max_used_tokens == [0, 160]
    ledger.release("b")
    assert not ledger.over_committed() and ledger.max_used_tokens[1] == 160


def test_bad_capacities_are_rejected():
    with pytest.raises(ValueError):
        KVLedger([])
    with pytest.raises(ValueError):
        KVLedger([0])
    with pytest.raises(ValueError):
        KVLedger([10], block_size_tokens=0)


def test_resize_grows_only_into_free_room_and_shrinks_freely():
    ledger = KVLedger([100], block_size_tokens=10)
    ledger.reserve("a", 0, 35)  # 40 (4 blocks)
    ledger.reserve("b", 0, 50)
    assert not ledger.resize("a", 51)  # 60 needs 20 more; 10 free
    assert ledger.used(0) == 90 and ledger.holding("a").num_tokens == 40
    assert ledger.resize("a", 50) and ledger.free(0) == 0  # exactly full is allowed
    assert ledger.resize("a", 12) and ledger.used(0) == 70  # shrink to 2 blocks
    assert not ledger.over_committed()
