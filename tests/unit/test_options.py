"""The shared rollout options: resume checks, one definition (the budget: test_preflight.py)."""

from __future__ import annotations

import pytest

from rstar2cli import options as O
from rstar2cli.errors import UserError


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
