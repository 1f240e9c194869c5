"""benchmarks/correction_ab.py: each arm's overrides, read by the real recipe loader, give exactly
the correction it names; the summary keeps the step-0 held-out eval apart from the steps."""

from __future__ import annotations

from pathlib import Path

from benchmarks.correction_ab import ARMS, arm_sets, summarise
from rstar2cli.recipe import load_recipe
from rstar2cli.rl.stage_recipe import RlRecipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes/pretrained/rl.yaml"


def test_each_arm_sets_its_own_correction_and_nothing_else():
    got = {}
    for arm in ARMS:
        sets = arm_sets(arm, steps=3, seed=7, dtype="bfloat16", extra=["rollout.max_turns=2"])
        recipe = load_recipe(RECIPE, RlRecipe, sets)
        assert (recipe.train.num_steps, recipe.train.seed) == (3, 7)
        assert (recipe.rollout.dtype, recipe.rollout.max_turns) == ("bfloat16", 2)
        got[arm] = recipe.correction.model_dump()
    off = dict(
        token_is_cap=None,
        token_mask_low=None,
        token_mask_high=None,
        seq_mask_low=None,
        seq_mask_high=None,
        bypass=False,
        mask_stale=False,
    )
    assert got["none"] == off
    assert got["token-TIS"] == {**off, "token_is_cap": 2.0}
    assert got["geometric"] == {**off, "seq_mask_low": 0.99, "seq_mask_high": 1.01}
    assert got["bypass"] == {**off, "bypass": True}


def _row(step: int, reward: float, step_s: float, kl: float) -> dict:
    row = dict.fromkeys(
        ["tool_error_share_correct", "is_ratio_mean", "clip_frac", "grad_norm", "eval_accuracy"]
    )
    row.update(
        step=step,
        reward=reward,
        mismatch_kl=kl,
        tool_calls_per_rollout=0.5,
        is_ratio_max=1.0 + kl,
        truncated_token_share=0.0,
        masked_token_share=0.0,
        masked_sequence_share=0.0,
        time_rollout_s=step_s / 2,
        time_update_s=step_s / 2,
        time_step_s=step_s,
    )
    return row


def test_summary_separates_the_start_eval_from_the_steps():
    start = {k: None for k in _row(0, 0.0, 0.0, 0.0)} | {"step": 0, "eval_accuracy": 0.5}
    steps = [start, _row(1, 0.25, 10.0, 0.01), _row(2, 0.5, 30.0, 0.03)]
    steps[-1]["eval_accuracy"] = 0.75
    s = summarise(steps)
    assert s["steps"] == 2
    assert (s["eval_start"], s["eval_end"]) == (0.5, 0.75)
    assert (s["accuracy_first_half"], s["accuracy_second_half"]) == (0.25, 0.5)
    assert s["median_step_s"] == 20.0
    assert abs(s["mismatch_kl"] - 0.02) < 1e-12 and s["is_ratio_max"] == 1.03
