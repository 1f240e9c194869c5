"""The trainer's sections of an RL-stage recipe: `train` (optimizer, PPO clip, batching, ranks,
DeepSpeed) and `correction` (importance sampling against the engine's sampling).

Each field has bounds and a description; unknown keys are errors (`RecipeModel`). Defaults are
the paper's values (rStar2-Agent, arXiv 2508.20722) where it gives them; fields it does not give
say so. The trainer ranks (trainer.py, workers.py) take these two sections alone.

What it does not check: checks across sections (rl/stage_recipe.py's `RlRecipe` makes them).
Tested in tests/unit/test_rl_recipe.py and tests/unit/test_correction.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rstar2cli.lora import LoraConfig
from rstar2cli.recipe import RecipeModel


class RlTrainConfig(RecipeModel):
    num_steps: int = Field(300, ge=1, description="RL steps of this stage (paper: 300, 85, 125).")
    lr: float = Field(1.0e-6, gt=0.0, description="AdamW learning rate (paper: 1e-6).")
    warmup_steps: int = Field(
        20, ge=0, description="Linear warm-up steps, then constant (paper: 20)."
    )
    weight_decay: float = Field(
        0.01, ge=0.0, description="AdamW weight decay (not in the paper; verl's default)."
    )
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1 (not in the paper).")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2 (not in the paper).")
    grad_clip: float = Field(1.0, gt=0.0, description="Clip the global gradient norm to this.")
    eps_low: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip below 1 (paper: 0.2).")
    eps_high: float = Field(
        0.28, gt=0.0, description="PPO clip above 1, clip-higher (paper: 0.28)."
    )
    clip_ratio_c: float | None = Field(
        None,
        gt=1.0,
        description="Dual clip: with a negative advantage, a token's clip term is at most this "
        "times |A|, so a ratio far above 1 cannot dominate (verl's default: 3.0); null: off "
        "(paper).",
    )
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="k3 KL penalty to the stage's initial policy (paper: 0, off; > 0 keeps a frozen copy).",
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus (paper: 0, off).")
    num_mini_batches: int = Field(
        1,
        ge=1,
        description="Optimizer steps per RL step over disjoint shares of the kept rollouts; the "
        "old log-probs are taken before the first, so from the second on the clip (eps_low, "
        "eps_high) acts. 1: one on-policy step, the ratio is 1 and the clip never acts. The "
        "paper recipes use 2: the release's mini-batch is 128 prompts x 32 rollouts (verl scales "
        "ppo_mini_batch_size by rollout.n) = 4096 trajectories, and the paper's step keeps up to "
        "512 x 16.",
    )
    max_tokens_per_micro_batch: int = Field(
        20480,
        ge=16,
        description="Most tokens per forward pass on one rank, padding included: trajectories "
        "are packed longest first while rows x longest row fits (release: "
        "ppo_max_token_len_per_gpu 20480 with use_dynamic_bsz). The memory knob.",
    )
    share_prompt_rows: bool = Field(
        False,
        description="Train the kept samples of one prompt in one row that holds the prompt "
        "once (rstar2cli/rl/shared_prompt.py; the same gradients). Pays where prompts are long "
        "next to responses; needs an attention kernel that takes a dense mask (sdpa, eager), so "
        "it is off for FlashAttention runs.",
    )
    gradient_checkpointing: bool = Field(
        True,
        description="Recompute each decoder layer's activations in the backward pass instead of "
        "keeping them (release: enable_gradient_checkpointing; about 1/3 more compute).",
    )
    num_trainer_ranks: int = Field(
        1,
        ge=1,
        description="Data-parallel trainer ranks; more than 1 runs them as Ray actors (gloo/nccl).",
    )
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage (0-3).")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto: bf16 on GPU, fp32 on CPU."
    )
    seed: int = Field(0, description="Seed of data order, sampling, RoC draws and torch RNG.")
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters instead of whole weights (off in the paper recipes); a KL "
        "term then uses the base with the adapters off, and dropout must be 0.0.",
    )

    @model_validator(mode="after")
    def _lora_without_dropout(self) -> RlTrainConfig:
        # NOTE: the old-log-prob pass runs without dropout; a training pass with it would score
        # another policy, and the PPO ratio would drift from 1 with no update made
        if self.lora.enabled and self.lora.dropout > 0.0:
            raise ValueError(
                f"lora.dropout ({self.lora.dropout}) must be 0.0 in RL: the old-log-prob pass and "
                "the training pass must score the same policy"
            )
        return self


class CorrectionConfig(RecipeModel):
    """Importance-sampling correction for the engine's sampling (formulas: rl/correction.py)."""

    token_is_cap: float | None = Field(
        2.0,
        gt=0.0,
        description="Token-level truncated importance sampling: weight each model token's clip "
        "term by min(pi_old / mu, cap), mu the engine's probability of the token. 2.0 is the "
        "cap of verl (rollout_is_threshold), slime (--tis-clip) and rLLM (tis_cap); null: off. "
        "Not with bypass.",
    )
    token_mask_low: float | None = Field(
        None, gt=0.0, description="Token mask: drop tokens with pi_old / mu below this; null: none."
    )
    token_mask_high: float | None = Field(
        None, gt=0.0, description="Token mask: drop tokens with pi_old / mu above this; null: none."
    )
    seq_mask_low: float | None = Field(
        None,
        gt=0.0,
        description="Sequence mask: drop trajectories whose geometric-mean pi_old / mu over model "
        "tokens is below this (SkyRL's first choice: 0.99); null: none.",
    )
    seq_mask_high: float | None = Field(
        None,
        gt=0.0,
        description="Sequence mask: drop trajectories whose geometric-mean ratio is above this "
        "(SkyRL: 1.01); null: none.",
    )
    bypass: bool = Field(
        False,
        description="Use the engine's log-probs as pi_old: the PPO ratio is pi / mu and the "
        "trainer's old-log-prob pass is skipped (one forward pass fewer per step).",
    )
    mask_stale: bool = Field(
        False,
        description="Partial rollout: drop the tokens sampled under an older policy version "
        "(made in an earlier step) from the loss, as slime's --mask-offpolicy-in-partial-rollout.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> CorrectionConfig:
        for name in ("token_mask", "seq_mask"):
            low, high = getattr(self, f"{name}_low"), getattr(self, f"{name}_high")
            if low is not None and high is not None and low >= high:
                raise ValueError(f"{name}_low ({low}) must be below {name}_high ({high})")
        if self.bypass and self.token_is_cap is not None:
            raise ValueError(
                "bypass makes the PPO ratio pi / mu, already the importance ratio: set "
                "token_is_cap to null with bypass (the masks still apply)"
            )
        return self

    @property
    def reads_ratios(self) -> bool:
        """Whether the update depends on the engine's log-probs (not only on stale counts)."""
        bounds = (self.token_mask_low, self.token_mask_high, self.seq_mask_low, self.seq_mask_high)
        return self.bypass or self.token_is_cap is not None or any(b is not None for b in bounds)
