"""Pre-flight arithmetic: the response budget against the model's context, read from config.json.

The checks that fail a whole command (files, sandboxes, Ray, hub ids) are tested through the CLI in
tests/cli/test_rollout_preflight.py and tests/cli/test_stage_preflight.py.
"""

from __future__ import annotations

import json
from functools import partial

import pytest

from rstar2cli.errors import UserError
from rstar2cli.preflight import budget_for_model, model_context_tokens


def test_budget_left_to_its_default_is_clipped_to_the_context_with_a_warning():
    said: list[str] = []
    # context 4096, longest prompt 300: room for 3796 response tokens
    budget = partial(budget_for_model, requested=None, longest_prompt=300, warn=said.append)
    assert budget(default=30000, context=4096) == 3796
    assert said and "clipped to 3796" in said[0] and "4096" in said[0]
    said.clear()
    assert budget(default=1000, context=4096) == 1000 and not said
    assert budget(default=30000, context=None) == 30000  # context unknown


def test_budget_asked_for_beyond_the_context_is_one_line_with_both_numbers():
    budget = partial(budget_for_model, default=30000, context=4096, warn=print)
    assert budget(requested=3796, longest_prompt=300) == 3796  # exactly fits
    with pytest.raises(UserError) as err:
        budget(requested=3797, longest_prompt=300)
    msg = str(err.value)
    assert "\n" not in msg and "4097" in msg and "4096" in msg and "3796 or less" in msg
    with pytest.raises(UserError, match="longest prompt"):
        budget(requested=None, default=100, longest_prompt=5000)


def test_model_context_reads_max_position_embeddings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert model_context_tokens(tmp_path) == 2048
    (tmp_path / "config.json").write_text(
        json.dumps({"text_config": {"max_position_embeddings": 8}})
    )
    assert model_context_tokens(tmp_path) == 8
    (tmp_path / "config.json").write_text("{}")
    assert model_context_tokens(tmp_path) is None
