"""Shared-prompt rows (rstar2cli/rl/shared_prompt.py): the same log-probs and gradients as one row
per sample, on the tiny model; packing and the planner's budget worked by hand."""

from __future__ import annotations

import pytest
import torch

from rstar2cli.lm_scoring import ScoringLM
from rstar2cli.rl.batch import TrainSample, collate
from rstar2cli.rl.shared_prompt import collate_shared, pack_rows
from rstar2cli.rl.trainer import plan_update


def _sample(prompt, response, mask, adv=1.0, stale=0):
    lps = [-0.5 - 0.01 * i if m else 0.0 for i, m in enumerate(mask)]
    return TrainSample(prompt, response, mask, adv, rollout_logprobs=lps, num_stale_tokens=stale)


def _samples():
    p1, p2 = [5, 6, 7, 8, 9], [11, 12, 13]
    return [
        _sample(p1, [20, 21, 22, 23], [1, 1, 0, 1], adv=1.0, stale=2),
        _sample(p2, [30, 31], [1, 1], adv=-0.5),
        _sample(p1, [40, 41, 42], [1, 0, 1], adv=-1.0),
        _sample(p1, [50], [1], adv=0.25),
    ]


def test_pack_rows_by_prompt_and_length():
    samples = _samples()
    # unlimited: p1's three samples in one row (5 + 4 + 3 + 1 = 13 tokens), p2's in another
    rows = pack_rows(samples, max_row_tokens=100)
    assert [[samples.index(s) for s in r.samples] for r in rows] == [[0, 2, 3], [1]]
    assert [r.num_tokens for r in rows] == [13, 5]
    assert [r.num_model_tokens for r in rows] == [6, 2]
    # 12 tokens per row: 5 + 4 + 3 = 12 fits, the last sample of p1 starts a row of its own
    rows = pack_rows(samples, max_row_tokens=12)
    assert [[samples.index(s) for s in r.samples] for r in rows] == [[0, 2], [3], [1]]


def test_layout_of_a_shared_row():
    samples = _samples()
    batch = collate_shared(samples, pad_id=0, max_row_tokens=100)
    # row 0: p1 (positions 0-4) | s0 (5-8) | s2 (9-11) | s3 (12); row 1: p2 | s1, padded to 13
    assert batch.input_ids[0].tolist() == [5, 6, 7, 8, 9, 20, 21, 22, 23, 40, 41, 42, 50]
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 5]
    allowed = batch.attention_mask[0, 0]  # [L, L]
    assert allowed[9, :5].all() and not allowed[9, 5:9].any()  # s2 sees p1, never s0
    assert allowed[12].tolist() == [True] * 5 + [False] * 7 + [True]
    assert batch.attention_mask[1, 0, 7].tolist() == [False] * 7 + [True] + [False] * 5  # pad
    # model tokens, sample by sample: s0 predicts 20 at the prompt's end (col 4), 21 at 5,
    # 23 at 7; s1 (row 1) 30 at 2, 31 at 3; s2 40 at 4, 42 at 10; s3 50 at 4
    assert batch.targets.tolist() == [20, 21, 23, 30, 31, 40, 42, 50]
    assert batch.rows.tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert batch.cols.tolist() == [4, 5, 7, 2, 3, 4, 10, 4]
    assert batch.sequence_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 3]
    assert batch.advantages.tolist() == [1.0, 1.0, 1.0, -0.5, -0.5, -1.0, -1.0, 0.25]
    assert batch.stale.tolist() == [True, True, False, False, False, False, False, False]
    assert batch.rollout_logprobs[:3].tolist() == pytest.approx([-0.5, -0.51, -0.53])


def _grads_and_logprobs(model, batch):
    model.zero_grad()
    logp, _ = model(
        input_ids=batch.input_ids,
        rows=batch.rows,
        cols=batch.cols,
        targets=batch.targets,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
    )
    (logp * batch.advantages).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


def test_same_logprobs_and_gradients_as_one_row_per_sample(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = ScoringLM(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
    samples = _samples()
    plain_lp, plain_grads = _grads_and_logprobs(model, collate(samples, pad_id=0))
    shared_lp, shared_grads = _grads_and_logprobs(
        model, collate_shared(samples, pad_id=0, max_row_tokens=100)
    )
    assert torch.allclose(shared_lp, plain_lp, atol=1e-5), (shared_lp, plain_lp)
    assert plain_grads.keys() == shared_grads.keys()
    for name, g in plain_grads.items():
        assert torch.allclose(shared_grads[name], g, atol=1e-5, rtol=1e-4), name


def test_planner_deals_shared_rows_and_counts_their_tokens():
    samples = _samples()
    plan, tokens = plan_update(
        samples,
        num_mini_batches=1,
        world=1,
        max_tokens_per_micro_batch=13,
        seed_key=(0,),
        share_prompt_rows=True,
    )
    # rows of 13 and 5 tokens: 2 x 13 > 13, so two micro-batches; each holds whole rows' samples
    assert [[samples.index(s) for s in micro] for micro in plan[0][0]] == [[0, 2, 3], [1]]
    assert tokens == [8]
