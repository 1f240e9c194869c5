"""The SFT trainer: DeepSpeed engine, packed micro-batches, exact resume, HF folder at the end.

One optimizer step takes the next `global_batch_size` examples of a seeded, per-epoch shuffled
order, splits them into micro-batches of `micro_batch_size` examples (dealt round-robin to the
ranks), packs each into rows (`rstar2cli.sft.packing`) and accumulates gradients; the loss is the
token-level mean over all target tokens of the global batch, whatever the packing. AdamW (a torch
optimizer object: DeepSpeed's CPU Adam would compile for ~40 s), cosine schedule with linear
warm-up, gradient clipping, gradient checkpointing and ZeRO stage come from the recipe; bf16 on
GPU, fp32 on CPU (`DS_ACCELERATOR=cpu`, gloo). The engine is the shared one
(`rstar2cli.train_utils.build_deepspeed`: under ZeRO-3 the model is built partitioned) and the loss
sums the chunked log-probs of the targets (`rstar2cli.lm_scoring`), so no [tokens x vocab] fp32
tensor exists for a whole micro-batch. One process needs no launcher; several come from torchrun
(`torchrun --nproc_per_node N --no-python rstar2 sft-coldstart ...`, which sets RANK, WORLD_SIZE,
LOCAL_RANK and the rendezvous; tested with 2 CPU ranks in tests/integration/test_sft_ranks.py and
tests/integration/test_paper_pipeline.py), or any launcher that sets the same variables.
Every rank enters every collective: each micro-batch's backward, the checkpoint, the final
gather of the weights for the HF folder (module by module, rank 0 writes).

Every `checkpoint.every_steps` it saves model, optimizer, scheduler, RNG states and the step
(which fixes the data position, since the order is a function of seed and epoch). Rerunning the
same command loads the newest checkpoint and continues; on CPU the resumed run is bit-identical to
an uninterrupted one. Output under OUT: metrics.jsonl, tb/ (TensorBoard), checkpoints/,
rejects.jsonl, final/ (save_pretrained + tokenizer + chat template, what vLLM and `rl-stage`
load). With `train.lora` the base stays frozen and adapters train (rstar2cli/lora.py): checkpoints
hold the adapter and its optimizer state, final/ the merged weights, final_adapter/ the adapter. Tested in tests/integration/test_sft_resume.py (resume; 2 ranks under ZeRO 0/3).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from rstar2cli import protocol as P
from rstar2cli.errors import UserError
from rstar2cli.sft.coldstart_recipe import SftRecipe, check_world_size
from rstar2cli.train_utils import (
    batch_indices,
    prune_checkpoints,
    rng_state,
    set_rng_state,
    step_with_grad_norm,
)


def cosine_factor(step: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """LR multiplier for the optimizer step with index `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def total_steps(recipe: SftRecipe, num_examples: int) -> int:
    if recipe.train.max_steps is not None:
        return recipe.train.max_steps
    return max(1, int(recipe.train.num_epochs * num_examples) // recipe.train.global_batch_size)


# ---------------------------------------------------------------------------------------------
# Model and data


def _model_path(recipe: SftRecipe, out: Path, rank: int) -> str:
    if recipe.model != "tiny":
        return recipe.model
    import torch.distributed as dist

    path = out / "init_model"
    if rank == 0 and not (path / "config.json").exists():
        from rstar2cli.data.tiny import build_tiny_model_dir

        build_tiny_model_dir(path, seed=recipe.train.seed)
    dist.barrier()
    return str(path)


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(P.IM_END, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise UserError(f"the tokenizer of {path} does not have {P.IM_END} as one token")
    if tok.pad_token_id is None:
        tok.pad_token = P.IM_END
    return tok


def _load_data(recipe: SftRecipe, tok: Any, out: Path, rank: int) -> list[Any]:
    from rstar2cli.fileio import write_jsonl_atomic
    from rstar2cli.sft.data import build_examples

    examples, rejects = build_examples(recipe.data, tok, recipe.train.seed)
    if rank == 0:
        write_jsonl_atomic(out / "rejects.jsonl", rejects)
    if not examples:
        raise UserError(
            f"no usable SFT examples ({len(rejects)} rejected; see {out / 'rejects.jsonl'})"
        )
    return examples


def _build_engine(recipe: SftRecipe, model_path: str, num_steps: int, world: int, bf16: bool):
    import torch

    from rstar2cli.train_utils import DeepSpeedSpec, build_deepspeed

    t = recipe.train
    torch.manual_seed(t.seed)
    spec = DeepSpeedSpec(
        model_path=model_path,
        zero_stage=t.zero_stage,
        bf16=bf16,
        gradient_checkpointing=t.gradient_checkpointing,
        grad_clip=t.grad_clip,
        lr=t.lr,
        betas=(t.adam_beta1, t.adam_beta2),
        weight_decay=t.weight_decay,
        adam_eps=t.adam_eps,
        lora=t.lora,
    )
    warmup = math.ceil(t.warmup_ratio * num_steps)
    return build_deepspeed(
        spec, world, lambda s: cosine_factor(s, num_steps, warmup, t.min_lr_ratio)
    )


# ---------------------------------------------------------------------------------------------
# Checkpoints


def _resume(engine: Any, ckpt_dir: Path) -> int:
    """Load the newest checkpoint if there is one; returns the number of steps already done."""
    from rstar2cli.lora import load_engine_checkpoint

    if not (ckpt_dir / "latest").exists():
        return 0
    client = load_engine_checkpoint(engine, ckpt_dir)
    if client is None:
        raise UserError(f"cannot load the checkpoint in {ckpt_dir}")
    set_rng_state(client["rng"])
    return int(client["step"])


def _save(engine: Any, ckpt_dir: Path, step: int, keep_last: int, rank: int) -> None:
    from rstar2cli.lora import save_engine_checkpoint

    # with LoRA: the adapter and its optimizer state, not the frozen base
    save_engine_checkpoint(
        engine, ckpt_dir, tag=f"step{step}", client_state={"step": step, "rng": rng_state()}
    )
    if rank == 0:
        prune_checkpoints(ckpt_dir, keep_last)


def save_final(engine: Any, tok: Any, out: Path, recipe: SftRecipe, rank: int) -> Path:
    """Collective: the HF folder (weights, tokenizer, chat template, generation config) written
    atomically by rank 0 from weights gathered module by module."""
    from rstar2cli.train_utils import save_hf

    lm = engine.module.lm
    lm.generation_config.eos_token_id = tok.convert_tokens_to_ids(P.IM_END)
    lm.generation_config.pad_token_id = tok.pad_token_id
    return save_hf(
        lm=lm, tokenizer=tok, out_dir=out / "final", zero3=recipe.train.zero_stage == 3, rank=rank
    )


# ---------------------------------------------------------------------------------------------
# Training loop


def _train_step(
    engine: Any,
    examples: list[Any],
    idx: list[int],
    recipe: SftRecipe,
    pad_id: int,
    rank: int,
    world: int,
) -> tuple[float, int, int, float | None]:
    """One optimizer step; returns this rank's (loss sum, target tokens, tokens, grad norm)."""
    from rstar2cli.sft.packing import collate, forward_loss_sum

    t = recipe.train
    global_targets = sum(sum(examples[i].loss_mask[1:]) for i in idx)
    micro = [idx[j : j + t.micro_batch_size] for j in range(0, len(idx), t.micro_batch_size)]
    loss_sum, num_targets, num_tokens = 0.0, 0, 0
    # NOTE: check_world_size makes the micro-batches a multiple of the ranks: every rank runs
    # as many backward passes (each one a collective under ZeRO-2/3)
    mine = micro[rank::world]
    for j, chunk in enumerate(mine):
        engine.set_gradient_accumulation_boundary(j == len(mine) - 1)
        batch = collate([examples[i] for i in chunk], recipe.data.max_seq_len, pad_id, t.packing)
        dev = engine.device
        batch.input_ids, batch.position_ids, batch.labels = (
            batch.input_ids.to(dev),
            batch.position_ids.to(dev),
            batch.labels.to(dev),
        )
        summed = forward_loss_sum(engine, batch)
        # NOTE: DeepSpeed averages over ranks; scaling by world/targets makes the update the
        # gradient of (sum over the global batch) / (global target count).
        engine.backward(summed * (world / max(1, global_targets)))
        loss_sum += float(summed.detach())
        num_targets += batch.num_targets
        num_tokens += batch.num_tokens
    grad_norm = step_with_grad_norm(engine, t.zero_stage)
    return loss_sum, num_targets, num_tokens, grad_norm


def _all_sum(values: list[float], device: Any) -> list[float]:
    """Sum over the ranks. `device`: the engine's; NOTE: on GPU the default group is NCCL only,
    which refuses a CPU tensor ("No backend type associated with device type cpu")."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def _step_and_report(
    *,
    step: int,
    engine: Any,
    examples: list[Any],
    recipe: SftRecipe,
    pad_id: int,
    rank: int,
    world: int,
    reporter: Any,
) -> None:
    """Train step `step` (0-based) on its batch and report its loss, summed over the ranks."""
    began = time.perf_counter()
    idx = batch_indices(step, len(examples), recipe.train.global_batch_size, recipe.train.seed)
    lr = engine.get_lr()[0]  # NOTE: read before the step; the scheduler advances in it
    *local, grad_norm = _train_step(
        engine=engine,
        examples=examples,
        idx=idx,
        recipe=recipe,
        pad_id=pad_id,
        rank=rank,
        world=world,
    )
    loss_sum, num_targets, num_tokens = _all_sum(local, engine.device)
    reporter.step(
        step=step + 1,
        loss=loss_sum / max(1.0, num_targets),
        lr=lr,
        grad_norm=grad_norm,
        num_tokens=int(num_tokens),
        step_time_s=time.perf_counter() - began,
    )


def run(recipe: SftRecipe, out: Path) -> Path:
    """Train (or resume) into `out`; returns the final HF folder."""
    import torch

    from rstar2cli.sft.progress import Reporter
    from rstar2cli.train_utils import init_distributed

    rank, world = init_distributed()
    on_gpu = torch.cuda.is_available()
    check_world_size(recipe, world)
    bf16 = recipe.train.precision == "bf16" or (recipe.train.precision == "auto" and on_gpu)
    model_path = _model_path(recipe, out, rank)
    tok = _load_tokenizer(model_path)
    examples = _load_data(recipe, tok, out, rank)
    num_steps = total_steps(recipe, len(examples))
    engine = _build_engine(
        recipe=recipe, model_path=model_path, num_steps=num_steps, world=world, bf16=bf16
    )
    ckpt_dir = out / "checkpoints"
    start = _resume(engine, ckpt_dir)
    if start and rank == 0:
        print(f"sft-coldstart: resuming from step {start} (checkpoint in {ckpt_dir})")
    reporter = Reporter(
        out=out,
        recipe=recipe,
        start_step=start,
        num_steps=num_steps,
        num_examples=len(examples),
        enabled=rank == 0,
    )
    with reporter:
        for step in range(start, num_steps):
            _step_and_report(
                step=step,
                engine=engine,
                examples=examples,
                recipe=recipe,
                pad_id=tok.pad_token_id,
                rank=rank,
                world=world,
                reporter=reporter,
            )
            if (step + 1) % recipe.checkpoint.every_steps == 0 or step + 1 == num_steps:
                _save(
                    engine=engine,
                    ckpt_dir=ckpt_dir,
                    step=step + 1,
                    keep_last=recipe.checkpoint.keep_last,
                    rank=rank,
                )
    final = save_final(engine=engine, tok=tok, out=out, recipe=recipe, rank=rank)
    _leave_group(world)
    return final


def _leave_group(world: int) -> None:
    """Wait for every rank; with several, end the process group before the ranks exit."""
    import torch.distributed as dist

    dist.barrier()
    if world > 1:
        # NOTE: several ranks come from a launcher and exit next; a process group left to
        # interpreter exit can abort a rank ("terminate called without an active exception":
        # gloo's threads outlive it), which the launcher reports as a failed run. One rank keeps
        # it: `rstar2 quickstart` runs the next stages in this process, and DeepSpeed holds on
        # to the group.
        dist.destroy_process_group()
