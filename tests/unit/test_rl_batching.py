"""The RL step's pure parts: collate alignment, update plans, and group selection with RoC."""

from __future__ import annotations

from pathlib import Path

import torch

from rstar2cli.recipe import load_recipe
from rstar2cli.rl.recipe import RlRecipe
from rstar2cli.rl.stage import rollout_metrics, select
from rstar2cli.rl.trainer import TrainSample, accumulation_steps, collate, lr_factor, plan_update

REPO = Path(__file__).resolve().parents[2]


def test_collate_targets_are_the_response_tokens_under_the_mask():
    a = TrainSample([1, 2, 3], [7, 8, 9], [1, 0, 1], 0.5)
    b = TrainSample([1, 2], [5, 6], [1, 1], -0.5)
    batch = collate([a, b], pad_id=0)
    # start = shortest prompt (2) - 1 = 1: targets begin at the token after position 1
    assert batch["start"] == 1
    assert batch["input_ids"].tolist() == [[1, 2, 3, 7, 8, 9], [1, 2, 5, 6, 0, 0]]
    masked = [
        [t for t, m in zip(ts, ms, strict=False) if m]
        for ts, ms in zip(batch["targets"].tolist(), batch["mask"].tolist(), strict=False)
    ]
    assert masked == [[7, 9], [5, 6]]  # tool-response token 8 is not trained on
    assert batch["advantages"].tolist() == [0.5, -0.5]


def test_lr_warms_up_then_stays_constant():
    assert [lr_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, 0) == 1.0


def test_plan_splits_evenly_and_counts_tokens():
    samples = [TrainSample([1] * 3, [2] * (i + 1), [1] * (i + 1), 1.0) for i in range(7)]
    plan, tokens = plan_update(samples, num_mini_batches=1, world=2, gas=2, seed_key=(0, 0))
    sizes = [[len(mb) for mb in mini] for rank in plan for mini in rank]
    assert sizes == [[2, 2], [2, 1]]  # 7 trajectories over 2 ranks x 2 micro-batches
    assert tokens == [sum(range(1, 8))]
    again, _ = plan_update(samples, 2, 1, 4, (0, 3))
    twice, _ = plan_update(samples, 2, 1, 4, (0, 3))
    assert [[[id(s) for s in mb] for mb in mini] for mini in again[0]] == [
        [[id(s) for s in mb] for mb in mini] for mini in twice[0]
    ]


def test_accumulation_fits_the_largest_batch():
    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe)
    assert accumulation_steps(32, recipe.train, 1) == 2  # 32 kept / micro 16
    assert accumulation_steps(32, recipe.train, 2) == 1


def _record(pid: str, sample: int, reward: float, statuses: list[str]) -> dict:
    return {
        "id": pid,
        "sample": sample,
        "reward": reward,
        "prompt_ids": [1, 2],
        "response_ids": [3, 4],
        "loss_mask": [1, 1],
        "tool_calls": [{"status": s} for s in statuses],
        "num_turns": 2,
        "num_answer_tags": 1,
        "finish_reason": "answer",
    }


def test_select_drops_equal_groups_and_keeps_clean_successes():
    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe)  # G = 4 of 8, min 1 / 1
    mixed = [_record("a", i, 1.0, ["ok"] if i < 2 else ["error", "ok"]) for i in range(4)]
    mixed += [_record("a", 4 + i, 0.0, ["ok"]) for i in range(4)]
    solved = [_record("b", 8 + i, 1.0, ["ok"]) for i in range(8)]  # all correct: dropped
    sel = select(mixed + solved, recipe, step=0)
    assert sel.num_groups == 2 and sel.num_dropped_groups == 1
    assert len(sel.samples) == 4
    # 4 positives of 8 -> quota 2 positives: the two zero-penalty ones (p_total 0 is drawn first)
    assert [s.tool_statuses for s in sel.kept_summaries if s.is_positive] == [("ok",), ("ok",)]
    adv = sorted(s.advantage for s in sel.samples)
    assert adv[0] < 0 < adv[-1] and abs(sum(adv)) < 1e-5
    m = rollout_metrics(mixed + solved, sel)
    assert m["reward"] == 12 / 16 and m["pass_rate"] == 1.0
    assert m["tool_error_share_correct"] == 2 / 14  # 2 errored of 14 calls in the 12 correct ones
    assert m["tool_error_share_correct_kept"] == 0.0
    plain = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe, ["roc.enabled=false"])
    assert len(select(mixed + solved, plain, step=0).samples) == 8


def test_advantages_are_tensors_of_the_kept_group():
    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe, ["roc.enabled=false"])
    recs = [_record("a", 0, 1.0, []), _record("a", 1, 0.0, [])]
    sel = select(recs, recipe, step=5)
    assert torch.allclose(
        torch.tensor([s.advantage for s in sel.samples]), torch.tensor([1.0, -1.0]), atol=1e-4
    )
