"""Resume stamps: the model fingerprint, the run-state stamp and the same-settings check."""

from __future__ import annotations

import json

import pytest

from rstar2cli.errors import UserError
from rstar2cli.rollout.resume import (
    check_same_settings,
    model_fingerprint,
    read_run_state,
    start_run_state,
)


def test_changed_sample_settings_or_model_are_refused():
    now = {"model": "/m/a|w:1:2", "temperature": 0.6, "seed": 0}
    check_same_settings(earlier=None, now=now, where="x", fix="fix")  # nothing earlier
    # keys the earlier settings lack are not checked
    check_same_settings(earlier={"temperature": 0.6}, now=now, where="x", fix="fix")
    with pytest.raises(UserError, match="x was made with temperature=1.0, now 0.6: fix"):
        check_same_settings(earlier={**now, "temperature": 1.0}, now=now, where="x", fix="fix")
    with pytest.raises(UserError, match="model=/m/b, now /m/a"):
        check_same_settings(earlier={**now, "model": "/m/b|w:1:2"}, now=now, where="x", fix="fix")
    with pytest.raises(UserError, match="an earlier version of it, now changed weights"):
        check_same_settings(earlier={**now, "model": "/m/a|w:1:3"}, now=now, where="x", fix="fix")


def test_fingerprint_changes_when_the_weights_change(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    before = model_fingerprint(tmp_path)
    assert before.startswith(str(tmp_path.resolve()))
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    assert model_fingerprint(tmp_path) != before


def test_run_state_is_stamped_and_a_resume_with_other_settings_is_refused(tmp_path):
    stats = tmp_path / "out.stats.json"
    assert read_run_state(stats) == {}  # no stamp yet
    settings = {"model": "/m/a", "temperature": 1.0}
    start_run_state(
        stats_path=stats, settings=settings, run={"engines": 1}, num_done=0, what="out.jsonl"
    )
    assert json.loads(stats.read_text()) == {"settings": settings, "run": {"engines": 1}}
    # the same sample settings resume, whatever the run settings
    start_run_state(
        stats_path=stats, settings=settings, run={"engines": 2}, num_done=3, what="out.jsonl"
    )
    with pytest.raises(UserError, match="out.jsonl was made with temperature=1.0, now 0.6"):
        start_run_state(
            stats_path=stats,
            settings={**settings, "temperature": 0.6},
            run={"engines": 2},
            num_done=3,
            what="out.jsonl",
        )
    assert read_run_state(stats)["run"] == {"engines": 2}  # the refused run wrote nothing
