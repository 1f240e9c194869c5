"""Two RL trainer ranks (Ray actors, real DeepSpeed, gloo on CPU) under ZeRO-0, ZeRO-2 and ZeRO-3.

The same two RL steps (fixed trajectories, two mini-batches each, token-budget micro-batches that
leave one rank an empty one) run under each stage. Every collective is entered by both ranks:
the updates, the weight buckets for the engines (module-by-module gathers under ZeRO-3), the
DeepSpeed checkpoint and the HF folder. The final weights of ZeRO-2 and ZeRO-3 (the latter with
gradient checkpointing and the partitioned model build) equal ZeRO-0's within TOLERANCE: fp32,
and only the order of the gradient reductions differs. A hang in any collective fails the test
through pytest's timeout.

NOTE on the tolerance: Adam divides each gradient element by its own magnitude, so an element
whose gradient cancels to ~1e-8 (Adam's eps) moves by an amount that reduction-order noise
decides, anywhere up to lr. An element-wise bound would be either loose or flaky; the bound is
per tensor: |w - w_zero0| (L2) <= TOLERANCE x |w_zero0 - w_init| (L2), i.e. the runs' weights
differ by at most 0.1% of how far the two steps moved them.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

TOLERANCE = 1.0e-3
NUM_STEPS = 2

pytestmark = pytest.mark.ray  # a local Ray instance (tests/suiteplan.py)


def _samples(vocab: int, step: int) -> list:
    from rstar2cli.rl.batch import TrainSample

    rng = random.Random(step)
    out = []
    for i in range(5):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(6, 12))]
        response = [rng.randrange(vocab) for _ in range(rng.randint(4, 30))]
        mask = [0 if 3 <= j < 6 else 1 for j in range(len(response))]  # a tool response inside
        out.append(TrainSample(prompt, response, mask, 1.0 if i % 2 else -1.0))
    return out


def _config(zero_stage: int, **extra):
    from rstar2cli.rl.train_recipe import RlTrainConfig

    return RlTrainConfig(
        lr=1.0e-2,  # large, so the first mini-batch's step moves the second one's ratios past the clip
        warmup_steps=0,
        weight_decay=0.0,
        num_mini_batches=2,
        max_tokens_per_micro_batch=48,
        num_trainer_ranks=2,
        zero_stage=zero_stage,
        gradient_checkpointing=zero_stage == 3,
        precision="fp32",
        **extra,
    )


def _plan(cfg, step: int, vocab: int) -> tuple[list, list[int]]:
    from rstar2cli.rl.trainer import plan_update

    return plan_update(
        _samples(vocab, step),
        cfg.num_mini_batches,
        cfg.num_trainer_ranks,
        cfg.max_tokens_per_micro_batch,
        (cfg.seed, step, 2),
    )


def _step(trainers, cfg, step: int, vocab: int) -> list:
    return trainers.update(*_plan(cfg, step, vocab))


def _weights(trainers) -> dict:
    return {name: t for bucket in trainers.weight_buckets() for name, t in bucket}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """Per ZeRO stage: (weights after 2 steps, the update sums, the run folder)."""
    import ray
    from transformers import AutoTokenizer

    from rstar2cli.rl.workers import RayTrainers, init_ray

    vocab = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    init_ray(None, 2)
    out = {}
    try:
        for stage in (0, 2, 3):
            cfg = _config(stage)
            folder = tmp_path_factory.mktemp(f"zero{stage}")
            trainers = RayTrainers(str(tiny_model_dir), cfg, 2, None)
            try:
                sums = [_step(trainers, cfg, s, vocab) for s in range(NUM_STEPS)]
                trainers.save_checkpoint(folder / "ckpt", NUM_STEPS, {"step": NUM_STEPS})
                trainers.save_hf(folder / "final")
                out[stage] = (_weights(trainers), sums, folder)
                if stage == 3:
                    out["zero3_reloaded"] = _reload_and_repeat(trainers, cfg, folder, vocab)
            finally:
                trainers.close()
    finally:
        ray.shutdown()
    return out


def _reload_and_repeat(trainers, cfg, folder: Path, vocab: int) -> tuple[dict, dict]:
    """Step 3 twice from the same checkpoint: the weights after each must be identical."""
    first = (_step(trainers, cfg, NUM_STEPS, vocab), _weights(trainers))
    client = trainers.load_checkpoint(folder / "ckpt")
    assert client is not None and client["step"] == NUM_STEPS
    _step(trainers, cfg, NUM_STEPS, vocab)
    return first[1], _weights(trainers)


def test_zero2_and_zero3_weights_equal_zero0_after_two_steps(runs, tiny_model_dir):
    import torch
    from safetensors.torch import load_file

    init = load_file(str(tiny_model_dir / "model.safetensors"))
    base = runs[0][0]
    assert base.keys() >= init.keys()
    moved = {k: float((base[k] - init[k]).norm()) for k in init}
    assert min(moved.values()) > 0.0, "a tensor did not move"
    for stage in (2, 3):
        weights = runs[stage][0]
        assert weights.keys() == base.keys()
        worst = max(float((weights[k] - base[k]).norm()) / moved[k] for k in init)
        assert worst <= TOLERANCE, f"ZeRO-{stage} differs from ZeRO-0 by {worst} of the update"
    for stage in (0, 3):  # the HF folder holds what the weight buckets gave
        saved = load_file(str(runs[stage][2] / "final" / "model.safetensors"))
        assert all(torch.equal(saved[k], runs[stage][0][k]) for k in saved)


def test_every_step_reports_both_ranks_and_the_second_mini_batch_is_clipped(runs, tiny_model_dir):
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    plans = [_plan(_config(0), step, vocab)[0] for step in range(NUM_STEPS)]
    # one rank ran an empty micro-batch (a zero-weighted pass) while the other trained
    assert any(not mb for plan in plans for rank in plan for mini in rank for mb in mini)
    for stage in (0, 2, 3):
        for step_sums in runs[stage][1]:
            assert len(step_sums) == 2
            assert sum(s.num_trajectories for s in step_sums) == 5
            assert all(len(s.grad_norms) == 2 for s in step_sums)  # two optimizer steps
    # the old log-probs are taken before the first optimizer step, so the second mini-batch
    # sees ratios away from 1 and some of its tokens fall outside [0.8, 1.28]
    clipped = sum(s.clip_low + s.clip_high for step_sums in runs[0][1] for s in step_sums)
    assert clipped > 0


def test_zero3_checkpoint_reload_repeats_the_step_exactly(runs):
    import torch

    first, again = runs["zero3_reloaded"]
    assert all(torch.equal(first[k], again[k]) for k in first)
