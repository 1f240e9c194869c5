"""The RL policy trainer: one data-parallel rank of a causal LM under DeepSpeed, fed GRPO-RoC
batches of trajectories.

Per RL step the driver (`rstar2cli.rl.stage`) builds a plan with `plan_update`: the kept
trajectories in `num_mini_batches` mini-batches (one optimizer step each), each dealt to the
ranks and cut into micro-batches of at most `max_tokens_per_micro_batch` padded tokens. Every
rank gets the same number of micro-batches per mini-batch (the short ones padded with empty
micro-batches), because under ZeRO every forward (ZeRO-3) and every backward (ZeRO-2/3) is a
collective that all ranks must enter. The rank then
1. computes the old log-probs of every model token of mini-batches 2.. with the weights as they
   were before the step (no grad; also the reference log-probs when a KL term is on), so from
   the second mini-batch on the ratio differs from 1 and the clip (eps_low, eps_high) acts; the
   entropy metric comes from this pass too (the policy before the step, as verl reports it).
   The first mini-batch needs no such pass: it is trained before any step, so its training
   forward gives pi_old itself (detached) and the entropy (with one mini-batch, as in the tiny
   and pretrained recipes, this saves a third of the update's work; the paper recipes use two,
   and the clip acts on the second),
2. per mini-batch: forward each micro-batch (`rstar2cli.lm_scoring.ScoringLM`: log-probs of
   model tokens only, computed in chunks), token-level PPO-clip loss
   (`rstar2cli.rl.loss.ppo_clip_loss`) normalised by the mini-batch's model-token count over all
   ranks, backward, and one optimizer step at the boundary it marks itself (grad clip, AdamW,
   LR warm-up then constant, counted in RL steps as verl does).
An empty micro-batch runs a zero-weighted one-token pass, so every rank enters the same
collectives; so does one whose trajectories have no model token (an engine error on the first
request). Log-probs are scored at the rollout's temperature (logits / T, as verl), with every
dropout probability at 0 (the two passes run in eval and train mode).

Correction for the engine's sampling (`CorrectionConfig`, rstar2cli/rl/correction.py): each
token's clip term is weighted by its importance weight and masks, from the old log-probs and the
engine's (`TrainSample.rollout_logprobs`); with `bypass` the engine's log-probs are pi_old and
step 1 is skipped (the entropy metric then comes from the training pass).

NOTE loss scale: DeepSpeed averages gradients over the W ranks, so the loss is multiplied by W:
the update is then the gradient of (sum of the per-token clip terms of the mini-batch) / (model
tokens of the mini-batch), i.e. the core loss averaged over all model tokens of the batch.

Also: the weights leaving the trainer: `weight_buckets` (a collective: every rank enters each
module's gather, rank 0 gets CPU tensors; the disk path and the HF folder) and `send_weights` (a
broadcast sync, gathered per bucket, rstar2cli/cluster/weight_sync.py), both under HF names;
DeepSpeed checkpoints with client state, loading a previous stage's checkpoint with or without its
optimizer, and the final HF folder. Several ranks are Ray actors (`rstar2cli.rl.workers`).

What it does not do: rollouts, grading, advantages (the driver) or decide when to checkpoint.
Tested in tests/unit/test_rl_batching.py (plans) and tests/integration/test_trainer_ranks.py
(2 ranks, ZeRO 0/2/3, real DeepSpeed on the tiny model, CPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2cli import protocol as P
from rstar2cli.rl.batch import MicroBatch, RankPlan, TrainSample, collate
from rstar2cli.rl.correction import CorrectionSums, token_weights
from rstar2cli.rl.loss import LossMetrics, ppo_clip_loss
from rstar2cli.rl.shared_prompt import collate_shared
from rstar2cli.rl.train_recipe import CorrectionConfig, RlTrainConfig
from rstar2cli.train_utils import peak_memory_gib, reset_peak_memory, step_with_grad_norm

if TYPE_CHECKING:
    from rstar2cli.cluster.weight_sync import SyncPlan

# the old log-probs of a micro-batch trained before any optimizer step of the RL step: its own
# training forward's, detached (the same weights, so the same numbers)
FROM_TRAINING_PASS: Any = ("from the training pass", None)


@dataclass
class UpdateSums:
    """Token-weighted sums of one rank's update metrics (the driver adds ranks and divides)."""

    num_tokens: int = 0
    num_trajectories: int = 0
    loss: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    approx_kl: float = 0.0
    entropy: float = 0.0
    kl_ref: float = 0.0
    correction: CorrectionSums = field(default_factory=CorrectionSums)
    grad_norms: list[float | None] = field(default_factory=list)
    lr: float = 0.0
    peak_mem_gib: float = 0.0  # train_utils.peak_memory_gib over the update

    def add_micro_batch(self, metrics: LossMetrics, loss_sum: float, num_trajectories: int) -> None:
        """Add one micro-batch: its loss times the batch's token count, its per-token means
        weighted by its tokens."""
        n = metrics.num_tokens
        self.num_tokens += n
        self.num_trajectories += num_trajectories
        self.loss += loss_sum
        self.clip_low += metrics.clip_frac_low * n
        self.clip_high += metrics.clip_frac_high * n
        self.approx_kl += metrics.approx_kl * n
        self.entropy += (metrics.entropy or 0.0) * n
        self.kl_ref += (metrics.kl_ref or 0.0) * n


def lr_factor(step: int, warmup_steps: int) -> float:
    """LR multiplier of RL step `step` (0-based): linear warm-up, then constant (paper)."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


class PolicyTrainer:
    """One data-parallel rank: the DeepSpeed engine and what it does for an RL step."""

    def __init__(
        self,
        model_path: str,
        cfg: RlTrainConfig,
        rank: int = 0,
        world: int = 1,
        correction: CorrectionConfig | None = None,
        temperature: float = 1.0,
    ):
        import torch
        from transformers import AutoTokenizer

        from rstar2cli.train_utils import DeepSpeedSpec, build_deepspeed, build_frozen

        self.cfg, self.rank, self.world = cfg, rank, world
        # the rollout's sampling temperature: the trainer scores logits / temperature, as verl
        self.temperature = temperature
        # None: no correction (the old pass still runs; the metrics still come)
        self.correction = correction or CorrectionConfig(token_is_cap=None)
        self.zero3 = cfg.zero_stage == 3
        self.on_gpu = torch.cuda.is_available()
        bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.on_gpu)
        torch.manual_seed(cfg.seed)
        tokenizer: Any = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer = tokenizer
        self.pad_id = int(
            tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.convert_tokens_to_ids(P.IM_END)
        )
        spec = DeepSpeedSpec(
            model_path=model_path,
            zero_stage=cfg.zero_stage,
            bf16=bf16,
            gradient_checkpointing=cfg.gradient_checkpointing,
            grad_clip=cfg.grad_clip,
            lr=cfg.lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            weight_decay=cfg.weight_decay,
            lora=cfg.lora,
        )
        # NOTE: DeepSpeed advances the schedule once per optimizer step; warm-up counts RL steps
        # (verl steps the actor's scheduler once per update), each num_mini_batches of them.
        per_step = cfg.num_mini_batches
        self.engine = build_deepspeed(
            spec, world, lambda s: lr_factor(s // per_step, cfg.warmup_steps)
        )
        # NOTE: the old pass runs in eval mode, the training pass in train mode: no dropout in
        # either, or the ratio between them would be noise where it should be 1
        from rstar2cli.train_utils import without_dropout

        without_dropout(self.engine.module.lm)
        self.ref = None
        if cfg.kl_coef > 0.0 and cfg.lora.enabled:  # the base is in the engine: adapters off
            from rstar2cli.lora import BaseOnly

            self.ref = BaseOnly(self.engine)
        elif cfg.kl_coef > 0.0:
            self.ref = build_frozen(model_path, cfg.zero_stage, bf16, world)

    # -- forward ----------------------------------------------------------------------------

    def _score(
        self, model: Any, batch: MicroBatch, entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[Any, Any]:
        dev = self.engine.device
        return model(
            input_ids=batch.input_ids.to(dev),
            rows=batch.rows.to(dev),
            cols=batch.cols.to(dev),
            targets=batch.targets.to(dev),
            attention_mask=batch.attention_mask.to(dev),
            position_ids=None if batch.position_ids is None else batch.position_ids.to(dev),
            with_entropy=entropy,
            entropy_grad=entropy_grad,
            temperature=self.temperature,
        )

    def _dummy(self) -> MicroBatch:
        """One pad token predicting itself: the pass an empty micro-batch runs."""
        import torch

        one = torch.zeros(1, dtype=torch.long)
        ids = torch.full((1, 1), self.pad_id, dtype=torch.long)
        return MicroBatch(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            rows=one,
            cols=one,
            targets=ids[0],
            advantages=torch.zeros(1),
        )

    def _collate(self, samples: list[TrainSample]) -> MicroBatch:
        if self.cfg.share_prompt_rows:
            return collate_shared(samples, self.pad_id, self.cfg.max_tokens_per_micro_batch)
        return collate(samples, self.pad_id)

    def _no_grad_logprobs(self, model: Any, plan: RankPlan, entropy: bool) -> list[list[Any]]:
        """(log-probs, entropy or None) of every planned micro-batch under `model` as it is now
        (None for an empty micro-batch)."""
        import torch

        out: list[list[Any]] = []
        with torch.no_grad():
            for mini in plan:
                out.append([])
                for samples in mini:
                    if samples:
                        out[-1].append(self._score(model, self._collate(samples), entropy))
                        continue
                    if self.zero3:  # NOTE: a ZeRO-3 forward gathers: every rank runs as many
                        self._score(model, self._dummy())
                    out[-1].append(None)
        return out

    # -- update -----------------------------------------------------------------------------

    def update(self, plan: RankPlan, mini_batch_tokens: list[int]) -> UpdateSums:
        """Run this rank's share of one RL step; `mini_batch_tokens[m]` counts model tokens of
        mini-batch m over all ranks. Collective: every rank calls it with plans whose
        mini-batches have equal numbers of micro-batches (`plan_update` makes them)."""
        bypass = self.correction.bypass
        reset_peak_memory(self.engine.device)
        self.engine.eval()
        try:
            # NOTE: the entropy metric is the policy's before the step, taken in this pass (as
            # verl reports it); the training pass computes entropy only for an entropy bonus.
            # Bypass: no such pass (the engine's log-probs are pi_old), (None, None) placeholders.
            # The first mini-batch is trained before any step, so its pi_old is the training
            # forward's own: the pass runs for the later mini-batches only (with one mini-batch,
            # not at all).
            if bypass:
                old = [[(None, None) if samples else None for samples in mini] for mini in plan]
            else:
                first = [FROM_TRAINING_PASS if samples else None for samples in plan[0]]
                old = [first, *self._no_grad_logprobs(self.engine, plan[1:], entropy=True)]
            ref = None if self.ref is None else self._no_grad_logprobs(self.ref, plan, False)
        finally:
            self.engine.train()
        sums = UpdateSums(lr=float(self.engine.get_lr()[0]))
        for m, mini in enumerate(plan):
            for i, samples in enumerate(mini):
                self.engine.set_gradient_accumulation_boundary(i == len(mini) - 1)
                # an empty micro-batch has no reference log-probs (None): it runs the empty pass
                ref_lp = None if ref is None or ref[m][i] is None else ref[m][i][0]
                # bypass: the mismatch is read on the first mini-batch, before any update
                compare = not bypass or m == 0
                self._micro_step(
                    samples=samples,
                    old=old[m][i],
                    ref_lp=ref_lp,
                    num_batch_tokens=mini_batch_tokens[m],
                    sums=sums,
                    compare=compare,
                )
            sums.grad_norms.append(step_with_grad_norm(self.engine, self.cfg.zero_stage))
        sums.peak_mem_gib = peak_memory_gib(self.engine.device)
        return sums

    def _empty_backward(self) -> None:
        """A zero-gradient backward on a dummy row: the rank still joins the collective."""
        logp, _ = self._score(self.engine, self._dummy())
        self.engine.backward(logp.sum() * 0.0)

    def _micro_step(
        self,
        samples: list[TrainSample],
        old: tuple[Any, Any] | None,
        ref_lp: Any,
        num_batch_tokens: int,
        sums: UpdateSums,
        compare: bool = True,
    ) -> None:
        import torch

        # NOTE: samples with no model token (an engine error on the first request) give an empty
        # loss with no graph: such a micro-batch takes the zero-weighted pass as an empty one
        if old is None or num_batch_tokens == 0 or not any(s.num_model_tokens for s in samples):
            self._empty_backward()
            return
        cfg = self.cfg
        batch = self._collate(samples)
        bonus = cfg.entropy_coef > 0.0
        on_policy = old is FROM_TRAINING_PASS
        old_lp: Any
        old_entropy: Any
        old_lp, old_entropy = (None, None) if on_policy else old
        with_entropy = bonus or old_lp is None  # bypass: the entropy metric comes from here
        logprobs, entropy = self._score(self.engine, batch, with_entropy, bonus)  # [N], [N]
        dev = logprobs.device
        engine_lp = batch.rollout_logprobs.to(dev)  # [N], NaN where unknown
        if on_policy:  # no step yet: pi_old is this very forward's (no second pass for it)
            old_lp, old_entropy = logprobs.detach(), entropy
        elif old_lp is None:  # bypass: pi_old is the engine's (the current one where unknown)
            old_lp = torch.where(torch.isnan(engine_lp), logprobs.detach(), engine_lp)
            old_entropy = entropy
        weights, corr = token_weights(
            old_logprobs=old_lp if not self.correction.bypass else logprobs.detach(),
            rollout_logprobs=engine_lp,
            rows=batch.sequence_ids.to(dev),
            stale=batch.stale.to(dev),
            cfg=self.correction,
            num_sequences=len(samples),
            compare=compare,
        )
        sums.correction.add(corr)
        loss, metrics = ppo_clip_loss(
            logprobs[None],
            old_lp[None],
            batch.advantages.to(dev)[None],
            torch.ones_like(logprobs, dtype=torch.bool)[None],
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            ref_logprobs=None if ref_lp is None else ref_lp[None],
            kl_coef=cfg.kl_coef,
            entropy=(entropy if bonus else old_entropy)[None],
            entropy_coef=cfg.entropy_coef,
            num_batch_tokens=num_batch_tokens,
            token_weights=weights[None],
            clip_ratio_c=cfg.clip_ratio_c,
        )
        self.engine.backward(loss * self.world)
        sums.add_micro_batch(
            metrics,
            loss_sum=float(loss.detach()) * num_batch_tokens,  # loss is a share of the batch mean
            num_trajectories=len(samples),
        )

    # -- weights and checkpoints ----------------------------------------------------------

    def weight_buckets(self) -> Iterator[list[tuple[str, Any]]]:
        """Collective: the full weights with HF names on CPU, in buckets, gathered module by
        module under ZeRO-3. Every rank iterates it to the end; rank 0's buckets hold the
        tensors, the others' are empty (`rstar2cli.train_utils.weight_buckets`)."""
        from rstar2cli.train_utils import weight_buckets

        return weight_buckets(self.engine.module.lm, self.zero3, self.rank == 0)

    def weight_plan(self, dtype: str) -> SyncPlan:
        """The buckets a broadcast sync sends (the same on every rank)."""
        from rstar2cli.cluster.weight_sync import module_plan

        return module_plan(self.engine.module.lm, dtype)

    def send_weights(self, group: Any | None, plan: SyncPlan) -> int | None:
        """Collective (every rank, ZeRO-3 gathers per bucket): rank 0, holding the transfer group,
        broadcasts the full weights bucket by bucket (rstar2cli/cluster/weight_sync.py)."""
        from rstar2cli.cluster.weight_sync import moves_device_tensors, send_module

        on_device = group is not None and moves_device_tensors(group)
        device = self.engine.device if on_device else "cpu"
        return send_module(
            module=self.engine.module.lm, group=group, plan=plan, zero3=self.zero3, device=device
        )

    def save_checkpoint(self, ckpt_dir: Path, step: int, client_state: dict[str, Any]) -> None:
        """Collective: every rank calls it. Writes ckpt_dir/step<N> and ckpt_dir/latest (with
        LoRA: the adapter and its optimizer state, not the frozen base)."""
        from rstar2cli.lora import save_engine_checkpoint

        save_engine_checkpoint(self.engine, ckpt_dir, tag=f"step{step}", client_state=client_state)

    def load_checkpoint(
        self, ckpt_dir: Path, module_only: bool = False, with_scheduler: bool = True
    ) -> dict[str, Any] | None:
        """Collective. Load the newest checkpoint of ckpt_dir; returns its client state (None:
        nothing there)."""
        from rstar2cli.lora import load_engine_checkpoint

        if not (ckpt_dir / "latest").exists():
            return None
        client = load_engine_checkpoint(
            self.engine, ckpt_dir, module_only=module_only, with_scheduler=with_scheduler
        )
        return client or {}

    def save_hf(self, out_dir: Path) -> Path:
        """Collective: HF folder (weights + tokenizer) written atomically by rank 0."""
        from rstar2cli.train_utils import save_hf

        return save_hf(
            lm=self.engine.module.lm,
            tokenizer=self.tokenizer,
            out_dir=out_dir,
            zero3=self.zero3,
            rank=self.rank,
        )


def plan_update(
    samples: list[TrainSample],
    num_mini_batches: int,
    world: int,
    max_tokens_per_micro_batch: int,
    seed_key: tuple[int, ...],
    share_prompt_rows: bool = False,
) -> tuple[list[RankPlan], list[int]]:
    """Split kept trajectories into mini-batches, deal them to `world` ranks and cut each rank's
    share into micro-batches of at most `max_tokens_per_micro_batch` padded tokens.

    Returns (plan[rank][mini][micro] -> samples, model tokens per mini-batch). Mini-batches are a
    seeded shuffle cut in equal parts. Inside one, trajectories go longest first to the rank with
    the fewest tokens so far; a rank's micro-batch takes its next-longest trajectories while
    (rows x longest row) fits the budget (a trajectory over the budget gets one of its own).
    Every rank then gets as many micro-batches as the rank that needs most (empty ones pad).
    With `share_prompt_rows` the units dealt and budgeted are shared-prompt rows
    (rstar2cli/rl/shared_prompt.py: a mini-batch's samples of one prompt, the prompt counted
    once), and a micro-batch lists their samples row by row. Deterministic given `seed_key`.
    """
    import numpy as np

    from rstar2cli.rl.shared_prompt import pack_rows

    order = list(range(len(samples)))
    if num_mini_batches > 1:
        order = np.random.default_rng(list(seed_key)).permutation(len(samples)).tolist()
    plan: list[RankPlan] = [[] for _ in range(world)]
    tokens = []
    for m in range(num_mini_batches):
        idx = order[m::num_mini_batches]
        units: list[Any] = [samples[i] for i in idx]
        if share_prompt_rows:
            units = pack_rows(units, max_tokens_per_micro_batch)
        ranked = sorted(range(len(units)), key=lambda i: (-units[i].num_tokens, i))
        shares: list[list[Any]] = [[] for _ in range(world)]
        loads = [0] * world
        for i in ranked:
            r = loads.index(min(loads))
            shares[r].append(units[i])
            loads[r] += units[i].num_tokens
        micro = [token_budget_micro_batches(share, max_tokens_per_micro_batch) for share in shares]
        if share_prompt_rows:
            micro = [[[s for row in mb for s in row.samples] for mb in mbs] for mbs in micro]
        num_micro = max(1, max(len(mb) for mb in micro))
        for r in range(world):
            plan[r].append(micro[r] + [[] for _ in range(num_micro - len(micro[r]))])
        tokens.append(sum(samples[i].num_model_tokens for i in idx))
    return plan, tokens


def token_budget_micro_batches(longest_first: list[Any], max_tokens: int) -> list[list[Any]]:
    """Consecutive runs of trajectories (sorted longest first) whose padded size, rows x the
    first (longest) row, is at most `max_tokens`."""
    out: list[list[Any]] = []
    for s in longest_first:
        if out and (len(out[-1]) + 1) * out[-1][0].num_tokens <= max_tokens:
            out[-1].append(s)
        else:
            out.append([s])
    return out
