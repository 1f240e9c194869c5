"""The RL policy trainer: a causal LM under DeepSpeed, fed GRPO-RoC batches of trajectories.

Per RL step the driver (`rstar2cli.rl.stage`) hands each rank a plan: mini-batches, each cut into
exactly `gas` micro-batches of `TrainSample`s (prompt ids, response ids, loss mask, advantage).
The rank then
1. recomputes the old log-probs of every response token of its plan with the current weights
   (no grad; also the reference log-probs when a KL term is on),
2. per mini-batch: forward each micro-batch, token-level PPO-clip loss
   (`rstar2cli.rl.loss.ppo_clip_loss`) normalised by the mini-batch's model-token count over all
   ranks, backward, and one optimizer step at the accumulation boundary (grad clip, AdamW,
   LR warm-up then constant: the paper's 20 steps at 1e-6).
Empty micro-batches (fewer trajectories than slots) run a zero-weighted one-token forward so every
rank takes the same number of backward passes (DeepSpeed counts them for the boundary).

NOTE loss scale: DeepSpeed divides each backward by `gas` and averages gradients over the `W`
ranks, so the loss is multiplied by gas * W: the update is then the gradient of (sum of the
per-token clip terms of the mini-batch) / (model tokens of the mini-batch), i.e. the core loss
averaged over all model tokens of the batch across micro-batches and ranks.

Also: weights for the engines (`send_weights`: a broadcast sync, `named_weights`: the disk
path's full copy, HF names), DeepSpeed checkpoints with client state
(step, data cursor, RNG), loading a previous stage's checkpoint with or without its optimizer,
and the final HF folder. One process needs no launcher (`setup_process_env`); several ranks are
Ray actors (`rstar2cli.rl.workers`).

What it does not do: rollouts, grading, advantages (the driver) or decide when to checkpoint.
Tested in tests/integration/test_rl_stage.py (real DeepSpeed on the tiny model, CPU).
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2cli import protocol as P
from rstar2cli.rl.loss import ppo_clip_loss, token_entropy, token_logprobs
from rstar2cli.rl.recipe import RlTrainConfig

if TYPE_CHECKING:
    from rstar2cli.scheduler.weight_sync import SyncPlan


@dataclass
class TrainSample:
    """One kept trajectory, ready for the update."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # per response token: 1 model token, 0 tool-response token
    advantage: float

    @property
    def num_model_tokens(self) -> int:
        return int(sum(self.loss_mask))


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
    grad_norms: list[float | None] = field(default_factory=list)
    lr: float = 0.0


def lr_factor(step: int, warmup_steps: int) -> float:
    """LR multiplier of optimizer step `step` (0-based): linear warm-up, then constant (paper)."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def ds_config(cfg: RlTrainConfig, gas: int, world: int, bf16: bool) -> dict[str, Any]:
    return {
        # NOTE: bookkeeping only: micro-batches are variable lists of trajectories.
        "train_batch_size": cfg.micro_batch_size * gas * world,
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "zero_allow_untested_optimizer": True,  # a torch AdamW object (DeepSpeed's compiles ~40 s)
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def collate(samples: list[TrainSample], pad_id: int) -> dict[str, Any]:
    """Right-padded prompt+response rows and the response window the loss looks at.

    Logits are kept only from position `start` = (shortest prompt) - 1 on, since earlier
    positions never predict a response token. Returns input_ids/attention_mask [B, L],
    targets/mask [B, L - 1 - start] aligned with logits[:, start:-1].
    """
    import torch

    rows = [s.prompt_ids + s.response_ids for s in samples]
    width = max(len(r) for r in rows)
    start = min(len(s.prompt_ids) for s in samples) - 1
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, L]
    attn = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    mask = torch.zeros((len(rows), width - 1), dtype=torch.bool)  # [B, L-1], over targets
    for i, (row, s) in enumerate(zip(rows, samples, strict=False)):
        ids[i, : len(row)] = torch.tensor(row)
        attn[i, : len(row)] = 1
        first = len(s.prompt_ids) - 1  # target index of the first response token
        mask[i, first : first + len(s.response_ids)] = torch.tensor(s.loss_mask, dtype=torch.bool)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "targets": ids[:, 1:][:, start:],  # [B, L-1-start]
        "mask": mask[:, start:],  # [B, L-1-start]
        "start": start,
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),  # [B]
    }


class PolicyTrainer:
    """One data-parallel rank: the DeepSpeed engine and what it does for an RL step."""

    def __init__(
        self, model_path: str, cfg: RlTrainConfig, gas: int, rank: int = 0, world: int = 1
    ):
        import deepspeed
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.gas, self.rank, self.world = cfg, gas, rank, world
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
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.config.use_cache = False
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=cfg.lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            weight_decay=cfg.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_factor(s, cfg.warmup_steps)
        )
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=ds_config(cfg, gas, world, bf16),
        )
        self.ref_model = None
        if cfg.kl_coef > 0.0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            self.ref_model.to(self.engine.device).eval().requires_grad_(False)

    # -- forward ----------------------------------------------------------------------------

    def _logits(self, model: Any, batch: dict[str, Any]) -> Any:
        dev = self.engine.device
        out = model(
            input_ids=batch["input_ids"].to(dev),
            attention_mask=batch["attention_mask"].to(dev),
            use_cache=False,
        )
        return out.logits[:, batch["start"] : -1]  # [B, L-1-start, V]

    def _no_grad_logprobs(self, model: Any, samples: list[TrainSample]) -> Any:
        import torch

        if not samples:
            return None
        with torch.no_grad():
            batch = collate(samples, self.pad_id)
            return token_logprobs(
                self._logits(model, batch), batch["targets"].to(self.engine.device)
            )

    def old_logprobs(self, plan: list[list[list[TrainSample]]]) -> list[list[Any]]:
        """Log-probs of every planned micro-batch under the current weights (before any step)."""
        self.engine.eval()
        try:
            return [
                [self._no_grad_logprobs(self.engine.module, mb) for mb in mini] for mini in plan
            ]
        finally:
            self.engine.train()

    # -- update -----------------------------------------------------------------------------

    def update(
        self, plan: list[list[list[TrainSample]]], mini_batch_tokens: list[int]
    ) -> UpdateSums:
        """Run this rank's share of one RL step; `mini_batch_tokens[m]` counts model tokens of
        mini-batch m over all ranks."""
        if any(len(mini) != self.gas for mini in plan):
            raise ValueError(
                f"every mini-batch needs exactly {self.gas} micro-batches on each rank"
            )
        old = self.old_logprobs(plan)
        ref = None
        if self.ref_model is not None:
            ref = [[self._no_grad_logprobs(self.ref_model, mb) for mb in mini] for mini in plan]
        sums = UpdateSums(lr=float(self.engine.get_lr()[0]))
        for m, mini in enumerate(plan):
            for i, samples in enumerate(mini):
                ref_lp = None if ref is None else ref[m][i]
                self._micro_step(samples, old[m][i], ref_lp, mini_batch_tokens[m], sums)
            norm = self.engine.get_global_grad_norm()
            sums.grad_norms.append(float(norm) if norm is not None else None)
        return sums

    def _micro_step(
        self,
        samples: list[TrainSample],
        old_lp: Any,
        ref_lp: Any,
        num_batch_tokens: int,
        sums: UpdateSums,
    ) -> None:
        import torch

        scale = self.gas * self.world
        if not samples or num_batch_tokens == 0:
            self._empty_step(scale)
            return
        cfg = self.cfg
        batch = collate(samples, self.pad_id)
        dev = self.engine.device
        logits = self._logits(self.engine, batch)  # [B, T, V]
        logprobs = token_logprobs(logits, batch["targets"].to(dev))  # [B, T]
        if cfg.entropy_coef > 0.0:
            entropy = token_entropy(logits)  # [B, T], with grad
        else:
            with torch.no_grad():
                entropy = token_entropy(logits.detach())  # [B, T], metric only
        loss, metrics = ppo_clip_loss(
            logprobs,
            old_lp,
            batch["advantages"].to(dev),
            batch["mask"].to(dev),
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            ref_logprobs=ref_lp,
            kl_coef=cfg.kl_coef,
            entropy=entropy,
            entropy_coef=cfg.entropy_coef,
            num_batch_tokens=num_batch_tokens,
        )
        self.engine.backward(loss * scale)
        self.engine.step()
        n = metrics.num_tokens
        sums.num_tokens += n
        sums.num_trajectories += len(samples)
        sums.loss += float(loss.detach()) * num_batch_tokens  # loss is a share of the batch mean
        sums.clip_low += metrics.clip_frac_low * n
        sums.clip_high += metrics.clip_frac_high * n
        sums.approx_kl += metrics.approx_kl * n
        sums.entropy += (metrics.entropy or 0.0) * n
        sums.kl_ref += (metrics.kl_ref or 0.0) * n

    def _empty_step(self, scale: int) -> None:
        """A backward that adds nothing, so this rank's boundary count matches the others'."""
        import torch

        ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.engine.device)
        out = self.engine(input_ids=ids, use_cache=False)
        self.engine.backward(out.logits.sum() * 0.0 * scale)
        self.engine.step()

    # -- weights and checkpoints ----------------------------------------------------------

    def named_weights(self) -> dict[str, Any]:
        """Full weights with HF names on CPU (gathered under ZeRO-3), for the engines."""
        import deepspeed

        params = list(self.engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=self.cfg.zero_stage == 3):
            return {
                k: v.detach().to("cpu").clone() for k, v in self.engine.module.state_dict().items()
            }

    def weight_plan(self, dtype: str) -> SyncPlan:
        """The buckets a broadcast sync sends (the same on every rank)."""
        from rstar2cli.scheduler.weight_sync import module_plan

        return module_plan(self.engine.module, dtype)

    def send_weights(self, group: Any | None, plan: SyncPlan) -> int | None:
        """Collective (every rank, ZeRO-3 gathers per bucket): rank 0, holding the transfer group,
        broadcasts the full weights bucket by bucket (rstar2cli/scheduler/weight_sync.py)."""
        from rstar2cli.scheduler.weight_sync import moves_device_tensors, send_module

        on_device = group is not None and moves_device_tensors(group)
        device = self.engine.device if on_device else "cpu"
        return send_module(self.engine.module, group, plan, self.cfg.zero_stage == 3, device)

    def save_checkpoint(self, ckpt_dir: Path, step: int, client_state: dict[str, Any]) -> None:
        """Collective: every rank calls it. Writes ckpt_dir/step<N> and ckpt_dir/latest."""
        self.engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}", client_state=client_state)

    def load_checkpoint(
        self, ckpt_dir: Path, module_only: bool = False, with_scheduler: bool = True
    ) -> dict[str, Any] | None:
        """Load the newest checkpoint of ckpt_dir; returns its client state (None: nothing there)."""
        if not (ckpt_dir / "latest").exists():
            return None
        _, client = self.engine.load_checkpoint(
            str(ckpt_dir),
            load_module_only=module_only,
            load_optimizer_states=not module_only,
            load_lr_scheduler_states=with_scheduler and not module_only,
        )
        return client or {}

    def save_hf(self, out_dir: Path) -> Path:
        """HF folder (weights + tokenizer) written atomically; rank 0 writes."""
        import deepspeed

        tmp = out_dir.with_name(out_dir.name + ".tmp")
        params = list(self.engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=self.cfg.zero_stage == 3):
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                module = self.engine.module
                module.config.use_cache = True
                module.save_pretrained(tmp, safe_serialization=True)
                module.config.use_cache = False
                self.tokenizer.save_pretrained(tmp)
                shutil.rmtree(out_dir, ignore_errors=True)
                os.replace(tmp, out_dir)
        return out_dir


def accumulation_steps(max_trajectories: int, cfg: RlTrainConfig, world: int) -> int:
    """Micro-batches per rank per mini-batch so the largest possible mini-batch fits."""
    per_mini = math.ceil(max_trajectories / cfg.num_mini_batches)
    return max(1, math.ceil(per_mini / (cfg.micro_batch_size * world)))


def plan_update(
    samples: list[TrainSample],
    num_mini_batches: int,
    world: int,
    gas: int,
    seed_key: tuple[int, ...],
) -> tuple[list[list[list[list[TrainSample]]]], list[int]]:
    """Split kept trajectories into mini-batches, then into `world` x `gas` micro-batches.

    Returns (plan[rank][mini][micro] -> samples, model tokens per mini-batch). Mini-batches are a
    seeded shuffle cut in equal parts; inside one, trajectories are sorted by length and dealt
    round-robin, so micro-batches have similar lengths (less padding) and sizes that differ by at
    most one. Deterministic given `seed_key`.
    """
    import numpy as np

    order = list(range(len(samples)))
    if num_mini_batches > 1:
        order = np.random.default_rng(list(seed_key)).permutation(len(samples)).tolist()
    minis = [order[m::num_mini_batches] for m in range(num_mini_batches)]
    plan: list[list[list[list[TrainSample]]]] = [
        [[[] for _ in range(gas)] for _ in minis] for _ in range(world)
    ]
    tokens = []
    for m, idx in enumerate(minis):
        ranked = sorted(
            idx, key=lambda i: (-len(samples[i].response_ids) - len(samples[i].prompt_ids), i)
        )
        for slot, i in enumerate(ranked):
            plan[slot % world][m][(slot // world) % gas].append(samples[i])
        tokens.append(sum(samples[i].num_model_tokens for i in idx))
    return plan, tokens
