"""One PolicyTrainer rank as its own process (torch.distributed, gloo, real DeepSpeed ZeRO-0), for
tests/integration/test_trainer_ranks.py: `python trainer_rank.py MODEL OUT` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in the environment.

It runs two RL steps and saves what they gave to OUT/rank<R>.pt:
1. `same_step`: one mini-batch of SAMPLES, one optimizer step, the optimizer swapped for plain SGD
   (AdamW divides each gradient element by its own size, so a constant factor in the gradient
   would not show in the weights): its gradient norm, and rank 0's weights after the step.
2. `no_model_tokens`: a step whose last micro-batch on every rank holds only a trajectory with
   no model token (an engine error on its first request: response_ids == []); whether it ran.
"""

from __future__ import annotations

import random
import sys
import traceback
from pathlib import Path

# 5 trajectories of one step (prompt, response, loss mask with a tool response inside, advantage)
SAMPLE_SEED = 11
NUM_SAMPLES = 5
MAX_TOKENS_PER_MICRO_BATCH = 48
SGD_LR = 1.0


def samples(vocab: int, seed: int = SAMPLE_SEED) -> list:
    from rstar2cli.rl.batch import TrainSample

    rng = random.Random(seed)
    out = []
    for i in range(NUM_SAMPLES):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(6, 12))]
        response = [rng.randrange(vocab) for _ in range(rng.randint(4, 30))]
        mask = [0 if 3 <= j < 6 else 1 for j in range(len(response))]
        out.append(TrainSample(prompt, response, mask, 1.0 if i % 2 else -1.0))
    return out


def engine_error_samples(vocab: int) -> list:
    """Other SAMPLES plus two trajectories with no response (engine_error on the first request):
    the shortest, so longest-first packing puts them last, in a micro-batch of their own on one
    rank, or one on each of two ranks (prompts of 20 and 19 tokens: the first tips the lighter
    rank over the other)."""
    from rstar2cli.rl.batch import TrainSample

    failed = [TrainSample([1] * 20, [], [], -1.0), TrainSample([2] * 19, [], [], -1.0)]
    return samples(vocab, seed=SAMPLE_SEED + 1) + failed


def plan(batch: list, world: int) -> tuple[list, list[int]]:
    from rstar2cli.rl.trainer import plan_update

    return plan_update(
        batch,
        num_mini_batches=1,
        world=world,
        max_tokens_per_micro_batch=MAX_TOKENS_PER_MICRO_BATCH,
        seed_key=(0, 0, 2),
    )


def config(world: int):
    from rstar2cli.rl.train_recipe import RlTrainConfig

    return RlTrainConfig(
        lr=SGD_LR,
        warmup_steps=0,
        weight_decay=0.0,
        grad_clip=1.0e9,  # no clipping: the step is -lr x the gradient itself
        num_mini_batches=1,
        max_tokens_per_micro_batch=MAX_TOKENS_PER_MICRO_BATCH,
        num_trainer_ranks=world,
        zero_stage=0,
        gradient_checkpointing=False,
        precision="fp32",
    )


def main(model: str, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    from rstar2cli.rl.trainer import PolicyTrainer
    from rstar2cli.train_utils import init_distributed

    torch.set_num_threads(1)
    rank, world = init_distributed()
    vocab = len(AutoTokenizer.from_pretrained(model))
    trainer = PolicyTrainer(model, config(world), rank=rank, world=world)
    # NOTE: DeepSpeed's fp32 ZeRO-0 step is optimizer.step() on the module's gradients (after the
    # boundary's all-reduce), then zero_grad on the module: any torch optimizer can take its place
    trainer.engine.optimizer = torch.optim.SGD(trainer.engine.module.parameters(), lr=SGD_LR)
    plans, tokens = plan(samples(vocab), world)
    result: dict = {"same_step": trainer.update(plans[rank], tokens).grad_norms}
    if rank == 0:
        result["weights"] = {k: v.clone() for k, v in trainer.engine.module.lm.state_dict().items()}
    plans, tokens = plan(engine_error_samples(vocab), world)
    result["plan"] = [[[len(s.response_ids) for s in mb] for mb in mini] for mini in plans[rank]]
    try:
        trainer.update(plans[rank], tokens)
        result["no_model_tokens"] = "ok"
    except Exception as exc:  # reported to the test, which fails on it
        result["no_model_tokens"] = "".join(traceback.format_exception_only(exc)).strip()
    torch.save(result, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
