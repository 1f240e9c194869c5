"""RL trainer ranks with real DeepSpeed, gloo on CPU: two Ray actors under ZeRO-0, ZeRO-2 and ZeRO-3;
one rank against two ranks as plain processes.

The same two RL steps (fixed trajectories, two mini-batches each, token-budget micro-batches that
leave one rank an empty one, a KL term to the initial policy) run under each stage. Every collective is entered by both ranks:
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

After its two steps the ZeRO-0 pair meets a rank that fails (a token past the vocabulary on rank
1 only, while rank 0 waits for it in the gradient all-reduce): the call raises at once, as one
line naming the rank, the exception and its message (rstar2cli/rl/ranks.py).

`same_step` (tests/integration/trainer_rank.py, torch.distributed without Ray): the same RL step
on one rank and on two ranks gives the same gradient, its norm and the weights after one plain
SGD step; and a micro-batch holding only trajectories without a model token (an engine error on
the first request) trains as an empty one.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
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
        # a KL term: a frozen reference per rank (partitioned under ZeRO-3), and reference
        # log-probs for every micro-batch, the padded empty ones included
        kl_coef=0.05,
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
                if stage == 0:  # last: rank 0 is left waiting in a collective
                    out["rank_failure"] = _fail_on_rank_one(trainers, cfg, vocab)
                if stage == 3:
                    out["zero3_reloaded"] = _reload_and_repeat(trainers, cfg, folder, vocab)
            finally:
                trainers.close()
    finally:
        ray.shutdown()
    return out


def _fail_on_rank_one(trainers, cfg, vocab: int) -> BaseException:
    """Step 3 with a token past the vocabulary in rank 1's share: rank 1 raises in its forward
    while rank 0 goes on into the all-reduce and waits there. Returns what update() raised."""
    from rstar2cli.rl.ranks import TrainerRankError

    plans, tokens = _plan(cfg, NUM_STEPS, vocab)
    bad = plans[1][0][0][0]
    bad.response_ids = [*bad.response_ids[:-1], vocab + 5]
    with pytest.raises(TrainerRankError) as err:
        trainers.update(plans, tokens)
    return err.value


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
            # each rank's own peak (a CPU rank: its process's resident peak, torch included)
            assert all(0.1 < s.peak_mem_gib < 1024 for s in step_sums)
    # the old log-probs are taken before the first optimizer step, so the second mini-batch
    # sees ratios away from 1 and some of its tokens fall outside [0.8, 1.28]
    clipped = sum(s.clip_low + s.clip_high for step_sums in runs[0][1] for s in step_sums)
    assert clipped > 0
    # the KL to the initial policy: 0 before the first optimizer step, then above 0
    assert sum(s.kl_ref for step_sums in runs[0][1] for s in step_sums) > 0


def test_zero3_checkpoint_reload_repeats_the_step_exactly(runs):
    import torch

    first, again = runs["zero3_reloaded"]
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_a_failing_rank_is_one_line_naming_it_and_debug_keeps_its_traceback(
    runs, monkeypatch, capsys
):
    """The error of a rank that failed (rank 1, IndexError in its embedding) as the user reads it:
    one line with the rank, the call, the exception and its message, never Ray's colour codes,
    actor id or process details; `--debug` prints the rank's own traceback."""
    import typer
    from ray.exceptions import RayTaskError

    from rstar2cli import cli

    exc = runs["rank_failure"]
    assert str(exc) == "trainer rank 1 failed in update: IndexError: index out of range in self"
    cause = exc.__cause__  # what --debug shows: Ray's error, with the rank's own frames
    assert isinstance(cause, RayTaskError) and "rl/trainer.py" in str(cause)

    def fail() -> None:
        raise exc

    def root(debug: bool = typer.Option(False, "--debug")) -> None:
        pass  # the real app's root option, which main() moves to the front

    app = typer.Typer()
    app.callback()(root)
    app.command("rl-stage")(fail)
    monkeypatch.setattr(cli, "app", app)
    for debug in ([], ["--debug"]):
        with pytest.raises(SystemExit) as code:
            cli.main(["rl-stage", *debug])
        assert code.value.code == 1
        err = capsys.readouterr().err
        if not debug:
            assert err.strip().splitlines() == [
                f"error: TrainerRankError: {exc} (rerun with --debug for the traceback)"
            ]
            assert "\x1b" not in err and "actor_id" not in err and "pid=" not in err
        else:
            assert "Traceback" in err and "ray::TrainerActor.update" in err
            assert "rl/trainer.py" in err and "IndexError" in err


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def same_step(tiny_model_dir, tmp_path_factory) -> dict:
    """tests/integration/trainer_rank.py as a world of one and, at the same time, a world of two
    processes: {world: [rank 0's results, ...]}."""
    import torch

    script = Path(__file__).with_name("trainer_rank.py")
    repo = Path(__file__).resolve().parents[2]
    started = {}
    for world in (1, 2):
        out = tmp_path_factory.mktemp(f"world{world}")
        port = _free_port()
        procs = []
        for rank in range(world):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                DS_ACCELERATOR="cpu",
                OMP_NUM_THREADS="1",
                PYTHONPATH=str(repo),
            )
            cmd = [sys.executable, str(script), str(tiny_model_dir), str(out)]
            procs.append(
                subprocess.Popen(
                    cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            )
        started[world] = (out, procs)
    try:
        for _, procs in started.values():
            for proc in procs:
                _, err = proc.communicate(timeout=300)
                assert proc.returncode == 0, err.decode()[-3000:]
    finally:
        for _, procs in started.values():
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return {
        world: [torch.load(out / f"rank{r}.pt") for r in range(world)]
        for world, (out, _) in started.items()
    }


def test_one_rank_and_two_ranks_take_the_same_sgd_step(same_step, tiny_model_dir):
    """One mini-batch of 5 trajectories (token-budget micro-batches: 4 on one rank, 2 and 2 on
    two, so the loss scale meets uneven accumulation), one plain SGD step of lr 1 without
    clipping: the gradient norms agree to float rounding and so do the weights, tensor by tensor,
    to 1e-5 of how far the step moved them. A constant factor in the gradient (a loss scaled by
    the wrong world size or accumulation count) would show in both."""
    from safetensors.torch import load_file

    init = load_file(str(tiny_model_dir / "model.safetensors"))
    (one,), (two, two_b) = same_step[1], same_step[2]
    assert len(one["same_step"]) == 1 and one["same_step"][0] > 0
    assert two["same_step"] == pytest.approx(one["same_step"], rel=1e-6)
    assert two_b["same_step"] == pytest.approx(one["same_step"], rel=1e-6)  # after the all-reduce
    for name, before in init.items():
        moved = float((one["weights"][name] - before).norm())
        assert moved > 0.0, name
        assert float((two["weights"][name] - one["weights"][name]).norm()) <= 1.0e-5 * moved, name


def test_a_micro_batch_without_model_tokens_trains_as_an_empty_one(same_step):
    """The two trajectories without a response are packed last: in one micro-batch of their own
    on one rank, one alone on each of two ranks. Each such micro-batch takes the zero-weighted
    pass (its loss would have no graph and the backward would raise)."""
    for world, results in same_step.items():
        for result in results:
            assert result["no_model_tokens"] == "ok", (world, result["no_model_tokens"])
            assert any(mb and not any(mb) for mb in result["plan"][0]), result["plan"]
