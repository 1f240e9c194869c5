"""Schema of an SFT recipe (`recipes/sft_coldstart.yaml`, `recipes/tiny/sft.yaml`).

Every field has bounds and a description; unknown keys are errors (`RecipeModel`). Checks that
involve several fields (batch arithmetic, at least one data source) are model validators, so
pydantic reports them together with the per-field problems: one run of `sft-coldstart` lists
everything that is wrong with a recipe before any work starts.

What it does not check: things only known at run time (the number of GPUs, whether a data file
exists); `rstar2cli.sft.train` checks those before it loads a model.
Tested in tests/unit/test_sft_recipe.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rstar2cli.lora import LoraConfig
from rstar2cli.recipe import RecipeModel

FORMATS = ("auto", "openai", "glaive", "toolace", "apigen", "instruction", "arith", "words")


class DataSource(RecipeModel):
    path: str = Field(
        description="A local .jsonl/.json/.parquet file (relative paths are relative to the "
        "working directory) or a Hugging Face dataset id.",
    )
    format: Literal[
        "auto", "openai", "glaive", "toolace", "apigen", "instruction", "arith", "words"
    ] = Field(
        "auto",
        description="Record schema: openai (messages + tool_calls), glaive (system + chat text), "
        "toolace (conversations with from/value, ToolACE or ShareGPT function_call/observation), "
        "apigen (query + tools + answers), instruction (instruction/input/output or "
        "prompt/response), arith or words (synthetic problems turned into tool-use transcripts; "
        "words rows carry their reference solution), or auto (detected per record from its keys; "
        "never picks arith or words).",
    )
    config: str | None = Field(None, description="HF dataset config name (HF ids only).")
    split: str = Field("train", description="HF dataset split (HF ids only).")
    max_records: int | None = Field(
        None, ge=1, description="Use at most this many records of the source (first ones)."
    )


class DataConfig(RecipeModel):
    sources: list[DataSource] = Field(
        min_length=1, description="Datasets mixed into one shuffled training set."
    )
    max_seq_len: int = Field(
        4096,
        ge=16,
        description="Longest example in tokens; longer ones are rejected (not truncated), and "
        "packed rows hold at most this many tokens.",
    )
    error_fraction: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="arith and words sources: share of transcripts whose first tool call fails "
        "(NameError or SyntaxError) and is then corrected, so RL starts with tool errors to reduce.",
    )
    direct_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="arith sources: share of transcripts that answer without the tool, by "
        "'mental arithmetic' a tiny model cannot do, so RL has a tool-use habit to learn.",
    )
    template: Literal["paper", "release"] = Field(
        "paper",
        description="Chat template of the protocol core; must match the one used at RL time "
        "(paper: assistant turns open with <reason>).",
    )


class TrainConfig(RecipeModel):
    num_epochs: float = Field(3.0, gt=0, description="Passes over the training set (paper: 3).")
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many optimizer steps (overrides num_epochs)."
    )
    global_batch_size: int = Field(
        128, ge=1, description="Examples per optimizer step over all ranks (paper: 128)."
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description="Examples per forward pass on one rank; they are packed into rows of at most "
        "data.max_seq_len tokens. Gradient accumulation = global / (micro x ranks).",
    )
    lr: float = Field(5.0e-6, gt=0, description="Peak learning rate of AdamW (paper: 5e-6).")
    min_lr_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="Cosine decays to lr x this at the last step."
    )
    warmup_ratio: float = Field(
        0.04, ge=0.0, lt=1.0, description="Share of steps with linear warm-up (paper: 4%)."
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.95, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_eps: float = Field(1.0e-8, gt=0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient norm to this.")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage (0-3).")
    gradient_checkpointing: bool = Field(
        True,
        description="Recompute each decoder layer's activations in the backward pass instead of "
        "keeping them (about 1/3 more compute; what lets long packed rows of a large model fit).",
    )
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto: bf16 on GPU, fp32 on CPU."
    )
    packing: bool = Field(
        True,
        description="Pack a micro-batch's examples into shared rows (position ids restart per "
        "example so attention never crosses examples); off: one example per padded row.",
    )
    seed: int = Field(0, description="Seed of model init (tiny), data order and torch RNG.")
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters instead of whole weights (off in the paper recipe); final/ "
        "holds the merged weights, final_adapter/ the adapter.",
    )

    # NOTE: a validator of this section (not of the whole recipe) so it still runs, and is listed,
    # when other sections have problems of their own.
    @model_validator(mode="after")
    def _batch_arithmetic(self) -> TrainConfig:
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"impossible batch arithmetic: global_batch_size ({self.global_batch_size}) is "
                f"not a multiple of micro_batch_size ({self.micro_batch_size})"
            )
        return self


class CheckpointConfig(RecipeModel):
    every_steps: int = Field(
        100,
        ge=1,
        description="Save model, optimizer, scheduler, RNG and data position every N steps.",
    )
    keep_last: int = Field(2, ge=1, description="Keep only the newest N checkpoints.")


class LogConfig(RecipeModel):
    every_steps: int = Field(1, ge=1, description="Write metrics.jsonl/TensorBoard every N steps.")
    tensorboard: bool = Field(True, description="Also write TensorBoard events to OUT/tb.")


class SftRecipe(RecipeModel):
    model: str = Field(
        "tiny",
        description="HF causal LM folder or hub id to start from, or 'tiny' for a fresh tiny "
        "model from the kit (rstar2cli.data.tiny).",
    )
    data: DataConfig = Field(description="What to train on.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints."
    )
    log: LogConfig = Field(default_factory=LogConfig, description="Metrics.")


def check_world_size(recipe: SftRecipe, world_size: int) -> None:
    """Batch arithmetic that needs the number of ranks (known only at launch)."""
    from rstar2cli.errors import UserError

    t = recipe.train
    per_step = t.micro_batch_size * world_size
    if t.global_batch_size % per_step:
        raise UserError(
            f"train.global_batch_size ({t.global_batch_size}) is not a multiple of "
            f"micro_batch_size x ranks ({t.micro_batch_size} x {world_size})"
        )


def gradient_accumulation_steps(recipe: SftRecipe, world_size: int) -> int:
    return recipe.train.global_batch_size // (recipe.train.micro_batch_size * world_size)
