"""The shared rollout options: budget against the model's context, resume checks, one definition."""

from __future__ import annotations

import json

import pytest

from rstar2cli import options as O
from rstar2cli.errors import UserError


def test_budget_left_to_its_default_is_clipped_to_the_context_with_a_warning():
    said = []
    # context 4096, longest prompt 300: room for 3796 response tokens
    assert O.budget_for_model(None, 30000, 300, 4096, said.append) == 3796
    assert said and "clipped to 3796" in said[0] and "4096" in said[0]
    said.clear()
    assert O.budget_for_model(None, 1000, 300, 4096, said.append) == 1000 and not said
    assert O.budget_for_model(None, 30000, 300, None, said.append) == 30000  # context unknown


def test_budget_asked_for_beyond_the_context_is_one_line_with_both_numbers():
    assert O.budget_for_model(3796, 30000, 300, 4096, print) == 3796  # exactly fits
    with pytest.raises(UserError) as err:
        O.budget_for_model(3797, 30000, 300, 4096, print)
    msg = str(err.value)
    assert "\n" not in msg and "4097" in msg and "4096" in msg and "3796 or less" in msg
    with pytest.raises(UserError, match="longest prompt"):
        O.budget_for_model(None, 100, 5000, 4096, print)


def test_model_context_reads_max_position_embeddings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert O.model_context_tokens(tmp_path) == 2048
    (tmp_path / "config.json").write_text(
        json.dumps({"text_config": {"max_position_embeddings": 8}})
    )
    assert O.model_context_tokens(tmp_path) == 8
    (tmp_path / "config.json").write_text("{}")
    assert O.model_context_tokens(tmp_path) is None


def test_changed_sample_settings_or_model_are_refused(tmp_path):
    now = {"model": "/m/a|w:1:2", "temperature": 0.6, "seed": 0}
    O.check_same_settings(None, now, "x", "fix")  # nothing earlier
    O.check_same_settings({"temperature": 0.6}, now, "x", "fix")  # keys it lacks are not checked
    with pytest.raises(UserError, match="x was made with temperature=1.0, now 0.6: fix"):
        O.check_same_settings({**now, "temperature": 1.0}, now, "x", "fix")
    with pytest.raises(UserError, match="model=/m/b, now /m/a"):
        O.check_same_settings({**now, "model": "/m/b|w:1:2"}, now, "x", "fix")
    with pytest.raises(UserError, match="an earlier version of it, now changed weights"):
        O.check_same_settings({**now, "model": "/m/a|w:1:3"}, now, "x", "fix")


def test_fingerprint_changes_when_the_weights_change(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    before = O.model_fingerprint(tmp_path)
    assert before.startswith(str(tmp_path.resolve()))
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    assert O.model_fingerprint(tmp_path) != before


def test_rollout_commands_share_each_option_definition():
    import inspect

    from rstar2cli.commands.eval import eval_cmd
    from rstar2cli.commands.filter_hard import filter_hard
    from rstar2cli.commands.rollout import rollout

    shared = ("engines", "engine", "sandbox", "ray_address", "scheduler", "kv_mode", "seed")
    for name in shared:
        defaults = {id(inspect.signature(f).parameters[name].default) for f in
                    (rollout, eval_cmd, filter_hard)}  # fmt: skip
        assert len(defaults) == 1, name  # the very same option object, so one name, one default
    flags = {
        f.__name__: inspect.signature(f).parameters["samples"].default.param_decls
        for f in (rollout, eval_cmd, filter_hard)
    }
    assert set(map(tuple, flags.values())) == {("--samples", "-n")}
