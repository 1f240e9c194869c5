"""One set of knobs for both sides of benchmarks/peer_trl.py: rl-stage `--set` overrides, and the
GRPOConfig arguments that give TRL's GRPOTrainer the same run from rl-stage's resolved recipe.

What both sides share (the issue's "same everything"): the SFT checkpoint, the training and
held-out files, the prompts of each step (rl-stage's seeded per-epoch order, handed to TRL in that
order with its shuffling off), samples per prompt, response budget (tool output included, on both
sides), turns, temperature and top-p, learning rate and its schedule, AdamW betas and weight
decay, gradient clip, PPO clip (0.2 / 0.28, token-level loss averaged over the batch's tokens:
TRL's "dapo"), group-normalised advantages, no KL, no entropy term, fp32, no gradient
checkpointing, seed. What differs by design: rl-stage keeps G = n/2 of a prompt's n rollouts
(GRPO-RoC) and trains those; TRL trains all n.

What it does not do: run anything, or import TRL (the mapping is plain data, testable without
the `peer` extra). Tested in tests/unit/test_peer_trl.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2cli.rl.stage_recipe import RlRecipe

REPO = Path(__file__).resolve().parents[2]
PRETRAINED_RECIPE = REPO / "recipes" / "pretrained" / "rl.yaml"
# transformers' continuous batching: tokens per KV page (its default)
CB_PAGE_TOKENS = 256


@dataclass(frozen=True)
class Knobs:
    """What the benchmark's options set on both sides."""

    num_steps: int
    num_prompts_per_step: int
    num_samples_per_prompt: int
    max_response_tokens: int
    temperature: float
    lr: float

    def check(self) -> None:
        """rl-stage keeps G = n/2 rollouts of n with at least one right and one wrong: n >= 4."""
        if self.num_samples_per_prompt < 4 or self.num_samples_per_prompt % 2:
            raise ValueError(
                f"samples per prompt must be even and >= 4 (RoC keeps n/2 with at least one "
                f"correct and one wrong), got {self.num_samples_per_prompt}"
            )
        if min(self.num_steps, self.num_prompts_per_step, self.max_response_tokens) < 1:
            raise ValueError("steps, prompts per step and the response budget must be >= 1")


def recipe_knobs(recipe: RlRecipe) -> Knobs:
    """The knobs a recipe sets (the benchmark's defaults come from recipes/pretrained/rl.yaml)."""
    return Knobs(
        num_steps=recipe.train.num_steps,
        num_prompts_per_step=recipe.rollout.num_prompts_per_step,
        num_samples_per_prompt=recipe.rollout.num_samples_per_prompt,
        max_response_tokens=recipe.rollout.max_response_tokens,
        temperature=recipe.rollout.temperature,
        lr=recipe.train.lr,
    )


def yaml_float(value: float) -> str:
    """A float YAML reads back as a float: `1e-05` is a string to YAML 1.1, `1.0e-05` is not."""
    text = repr(float(value))
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def stage_sets(knobs: Knobs, train: Path, test: Path) -> list[str]:
    """rl-stage's `--set` overrides of recipes/pretrained/rl.yaml for these knobs."""
    return [
        f"data.train={train}",
        f"data.eval={test}",
        f"rollout.num_prompts_per_step={knobs.num_prompts_per_step}",
        f"rollout.num_samples_per_prompt={knobs.num_samples_per_prompt}",
        f"rollout.max_response_tokens={knobs.max_response_tokens}",
        f"rollout.temperature={yaml_float(knobs.temperature)}",
        f"roc.group_size={knobs.num_samples_per_prompt // 2}",
        f"train.num_steps={knobs.num_steps}",
        f"train.lr={yaml_float(knobs.lr)}",
        # one checkpoint, at the end (rl-stage writes it after the step's clock stops)
        f"checkpoint.every_steps={knobs.num_steps}",
    ]


def grpo_args(recipe: RlRecipe, output_dir: str) -> dict[str, Any]:
    """GRPOConfig keyword arguments for the run rl-stage made from `recipe` (its resolved
    OUT/recipe.yaml). One optimizer step per RL step: the micro-batches of one generation batch
    (a prompt's n samples each) accumulate into one step, as rl-stage's one mini-batch does."""
    r, t = recipe.rollout, recipe.train
    if t.num_mini_batches != 1:
        raise ValueError("the comparison holds one optimizer step per RL step: num_mini_batches 1")
    # NOTE: rl-stage's factor at optimizer step s is min(1, (s + 1) / warmup); transformers'
    # constant_with_warmup is s / warmup, one step later. warmup 1 (the recipe's) is constant.
    warmup = 0 if t.warmup_steps <= 1 else t.warmup_steps
    kv_tokens = r.kv_cache_tokens or r.max_prompt_tokens + r.max_response_tokens
    cb_blocks = -(-kv_tokens // CB_PAGE_TOKENS)
    return {
        "output_dir": output_dir,
        "max_steps": t.num_steps,
        "num_generations": r.num_samples_per_prompt,
        "per_device_train_batch_size": r.num_samples_per_prompt,
        "gradient_accumulation_steps": r.num_prompts_per_step,
        "num_iterations": 1,
        "max_completion_length": r.max_response_tokens,
        "max_tool_calling_iterations": r.max_turns - 1,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "learning_rate": t.lr,
        "lr_scheduler_type": "constant" if warmup == 0 else "constant_with_warmup",
        "warmup_steps": warmup,
        "weight_decay": t.weight_decay,
        "adam_beta1": t.adam_beta1,
        "adam_beta2": t.adam_beta2,
        "max_grad_norm": t.grad_clip,
        "epsilon": t.eps_low,
        "epsilon_high": t.eps_high,
        "beta": t.kl_coef,
        "entropy_coef": t.entropy_coef,
        "loss_type": "dapo",
        "scale_rewards": "group",
        # generation on a CPU (see benchmarks/peer_trl.py): continuous batching with a KV cache of
        # rl-stage's size; left to itself it takes half the free memory (0.9 outside TRL)
        "use_transformers_continuous_batching": True,
        "transformers_continuous_batching_config": {"num_blocks": cb_blocks},
        "gradient_checkpointing": t.gradient_checkpointing,
        "bf16": False,
        "use_cpu": True,
        "seed": t.seed,
        "shuffle_dataset": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }
