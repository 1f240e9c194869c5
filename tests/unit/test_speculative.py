"""Speculative decoding's settings and counts: `--speculative METHOD:TOKENS` is parsed once
(one-line errors), becomes vLLM's speculative config with its batch-size schedule, and the
engine's stat recorder turns vLLM's per-position draft counts into drafted, accepted and tried
(the acceptance the scheduler benchmark's `--sim-spec` takes). The real drafter runs in
tests/integration/test_vllm_engine.py."""

from __future__ import annotations

import pytest

from rstar2cli.engines.base import SPECULATIVE_MAX_BATCH, parse_speculative
from rstar2cli.engines.vllm_args import VllmStats, speculative_config
from rstar2cli.errors import UserError


def test_method_and_tokens_parse_and_bad_ones_are_one_line_errors():
    assert parse_speculative("ngram:4") == ("ngram", 4, SPECULATIVE_MAX_BATCH)
    assert parse_speculative("ngram:4:64") == ("ngram", 4, 64)
    bad_ones = ("ngram", "ngram:", "ngram:0", "ngram:17", "ngram:x", "eagle:4", ":4", "ngram:4:0")
    for bad in (*bad_ones, "ngram:4:64:1", "ngram:4:-1"):
        with pytest.raises(UserError, match="expected METHOD:TOKENS") as exc:
            parse_speculative(bad)
        assert "\n" not in str(exc.value)


def test_suffix_is_refused_with_the_reason():
    # vLLM's suffix drafter asserts that every step asks it for its full count: under the
    # batch-size schedule it killed the engine core at the first batch above the limit, and
    # drafting at every batch made a rollout ~10x slower (benchmarks/speculative.py)
    with pytest.raises(UserError, match="cannot be limited to low batches"):
        parse_speculative("suffix:4")


def test_vllm_config_drafts_only_up_to_the_batch_limit():
    assert speculative_config(None) is None
    config = speculative_config("ngram:3")
    assert config is not None
    assert (config["method"], config["num_speculative_tokens"]) == ("ngram", 3)
    # vLLM carries the last range's count to every larger batch: 0 drafts above the limit
    assert config["num_speculative_tokens_per_batch_size"] == [
        (1, SPECULATIVE_MAX_BATCH, 3),
        (SPECULATIVE_MAX_BATCH + 1, SPECULATIVE_MAX_BATCH + 1, 0),
    ]
    wider = speculative_config("ngram:3:128")
    assert wider is not None
    assert wider["num_speculative_tokens_per_batch_size"] == [(1, 128, 3), (129, 129, 0)]


def test_drafts_are_counted_per_position_and_tried_only_where_reached():
    stats = VllmStats()
    # 10 drafts reached position 1; 6 of them were accepted there, so at most 6 reached
    # position 2, where 8 draft tokens existed (two drafts ran longer than their accepted run)
    stats.record_drafts(drafted=[10, 8, 5, 2], accepted=[6, 3, 1, 0])
    assert stats.num_draft_tokens == 25
    assert stats.num_accepted_draft_tokens == 10
    assert stats.num_tried_draft_tokens == 10 + 6 + 3 + 1
    stats.record_drafts(drafted=[], accepted=[])  # a step with nothing drafted
    assert (stats.num_draft_tokens, stats.num_tried_draft_tokens) == (25, 20)
