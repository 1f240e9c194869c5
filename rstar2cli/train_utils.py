"""What the SFT and RL trainers share: the process group, the DeepSpeed engine, the weights out of
it, RNG state, checkpoint pruning, run logs and the seeded data order.

- `init_distributed`: torch.distributed from RANK/WORLD_SIZE/MASTER_* (a launcher or a Ray
  actor sets them; one process without either gets a world of one). gloo on CPU, nccl on GPU.
- `build_deepspeed`: a `rstar2cli.lm_scoring.ScoringLM` around the HF model, a torch AdamW and a
  LambdaLR schedule under DeepSpeed ZeRO 0-3. Under ZeRO-3 the model is built inside
  `deepspeed.zero.Init` and filled module by module from the safetensors files (rank 0 reads,
  each module is scattered before the next is read), so no rank ever holds the whole model.
  Gradient checkpointing of the decoder layers is a switch. The accumulation boundary is not
  DeepSpeed's count: the trainers mark it (`engine.set_gradient_accumulation_boundary`), since
  their micro-batches vary in number from one optimizer step to the next.
- `without_dropout`: every dropout probability of a model at 0 (the RL trainer's: its ratio
  compares a pass in eval mode with one in train mode, which gradient checkpointing needs).
- `weight_buckets` / `save_hf`: collectives. Every rank walks the modules in the same order and
  enters each module's ZeRO-3 gather; rank 0 copies the full tensors out, in buckets of about
  `BUCKET_BYTES`, so neither the trainer nor the receiver holds a second copy of the whole model.
- `rng_state` / `set_rng_state` (python, numpy, torch CPU, CUDA when present: what an exact resume
  needs), `prune_checkpoints`, `open_run_logs`, `batch_indices` (the per-epoch seeded order).

Kept free of torch/deepspeed imports at module level. Exercised by
tests/integration/test_trainer_ranks.py (2 ranks, ZeRO 0/2/3), tests/integration/test_sft_resume.py
and tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2cli.lora import LoraConfig

# NOTE: 256 MB: big enough that a 14B model syncs in ~100 buckets, small next to a GPU's memory.
BUCKET_BYTES = 256 * 2**20


def setup_process_env() -> None:
    """Single process without a launcher: fill in what torch.distributed expects."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        )
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # NOTE: must be set before deepspeed imports


def init_distributed() -> tuple[int, int]:
    """torch.distributed for this process; returns (rank, world size)."""
    setup_process_env()
    import deepspeed
    import torch
    import torch.distributed as dist

    deepspeed.utils.logger.setLevel("WARNING")
    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("WORLD_SIZE") == "1":
        # NOTE: DeepSpeed JIT-builds a shared-memory all-reduce op for CPU ranks under a lock file
        # in ~/.cache/torch_extensions; one rank has nothing to all-reduce, and a process killed
        # while holding that lock would hang every later run, so one CPU rank skips it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return dist.get_rank(), dist.get_world_size()


# ---------------------------------------------------------------------------------------------
# The engine


@dataclass(frozen=True)
class DeepSpeedSpec:
    """What the engine is built from (the trainers fill it from their recipes)."""

    model_path: str
    zero_stage: int
    bf16: bool
    gradient_checkpointing: bool
    grad_clip: float
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    adam_eps: float = 1.0e-8
    lora: LoraConfig | None = None  # adapters on the frozen base when enabled (rstar2cli/lora.py)


def ds_config(zero_stage: int, bf16: bool, grad_clip: float, world: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": zero_stage}
    if zero_stage == 3:
        # NOTE: DeepSpeed keeps parameters under 1e5 elements whole on every rank by default;
        # partitioning all of them costs a few small gathers per layer and keeps every rank at
        # exactly 1/W of the model.
        zero["stage3_param_persistence_threshold"] = 0
    return {
        # NOTE: bookkeeping only: the trainers mark the accumulation boundary themselves.
        "train_batch_size": world,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # a torch AdamW object (DeepSpeed's compiles ~40 s)
        "bf16": {"enabled": bf16},
        **_accumulation(zero_stage, bf16),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _accumulation(zero_stage: int, bf16: bool) -> dict[str, Any]:
    """bf16 under ZeRO 1-3: gradients accumulate in fp32 across micro-batches (DeepSpeed's default
    is the model's dtype, so a step of many micro-batches summed in bf16 lost precision).
    NOTE: ZeRO-0 has no fp32 accumulation for bf16 (DeepSpeed raises NotImplementedError for the
    mix) and keeps bf16 gradients; the recipes at scale use ZeRO-3. Whether the fp32 buffers are
    in effect on a GPU is checked by tests/gpu/smoke.py (stage "train")."""
    if bf16 and zero_stage >= 1:
        return {"data_types": {"grad_accum_dtype": "fp32"}}
    return {}


def build_deepspeed(spec: DeepSpeedSpec, world: int, lr_lambda: Callable[[int], float]) -> Any:
    """The DeepSpeed engine of a `ScoringLM` with AdamW and LambdaLR(lr_lambda)."""
    import deepspeed
    import torch

    config = ds_config(spec.zero_stage, spec.bf16, spec.grad_clip, world)
    model = _scoring_model(spec.model_path, config, spec.bf16, spec.zero_stage == 3)
    if spec.lora is not None and spec.lora.enabled:
        from rstar2cli.lora import add_adapters

        # NOTE ZeRO-3: the factors are made whole on every rank (same seed) after the base was
        # partitioned; deepspeed.initialize partitions them from rank 0's copy
        add_adapters(model.lm, spec.lora)
    if spec.gradient_checkpointing:
        model.lm.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],  # with LoRA: the adapters alone
        lr=spec.lr,
        betas=spec.betas,
        eps=spec.adam_eps,
        weight_decay=spec.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
    )
    return engine


def build_frozen(model_path: str, zero_stage: int, bf16: bool, world: int) -> Any:
    """A frozen `ScoringLM` (the KL reference): partitioned under ZeRO-3, else whole per rank."""
    import deepspeed
    import torch

    config = ds_config(zero_stage, bf16, 1.0, world)
    model = _scoring_model(model_path, config, bf16, zero_stage == 3)
    model.eval().requires_grad_(False)
    if zero_stage == 3:
        engine, _, _, _ = deepspeed.initialize(model=model, config=config)
        return engine
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return model.to(device=device, dtype=torch.bfloat16 if bf16 else torch.float32)


def _scoring_model(path: str, config: dict[str, Any], bf16: bool, zero3: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from rstar2cli.lm_scoring import ScoringLM

    if zero3:
        lm = _partitioned_lm(path, config, torch.bfloat16 if bf16 else torch.float32)
    else:
        # NOTE: bf16 runs load bf16: DeepSpeed casts the module to bf16 and makes its fp32 master
        # copy from that anyway, so an fp32 load only doubled each rank's host memory (~59 GB at
        # 14B) and made save_hf write config dtype float32 beside bf16 tensors
        lm = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16 if bf16 else torch.float32
        )
    lm.config.use_cache = False
    return ScoringLM(lm)


def without_dropout(lm: Any) -> Any:
    """`lm` with every dropout probability at 0: nn.Dropout modules, the probabilities modules
    copied from the config at build time (attention_dropout, ...) and the config's own fields
    (read at forward time by some models). Returns `lm`."""
    from torch import nn
    from transformers import PretrainedConfig

    # a composite config (a text_config inside) holds its parts' fields
    configs = [lm.config, *(v for v in vars(lm.config).values() if isinstance(v, PretrainedConfig))]
    for holder in [*configs, *lm.modules()]:
        if isinstance(holder, nn.Dropout):
            holder.p = 0.0
        else:
            for name, value in list(vars(holder).items()):
                if _is_dropout_probability(name, value):
                    setattr(holder, name, 0.0)
    return lm


def _is_dropout_probability(name: str, value: Any) -> bool:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return is_number and ("dropout" in name or "pdrop" in name)


def _partitioned_lm(path: str, config: dict[str, Any], dtype: Any) -> Any:
    """The model built inside zero.Init, then loaded module by module (rank 0 reads the files)."""
    import deepspeed
    import torch.distributed as dist
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    # NOTE: no random init (the weights are read next; HF's init also indexes into the empty
    # partitions), which skips the tying of the output layer to the embedding as well: redone here.
    # NOTE: the dtype comes from the config's bf16 flag (an explicit dtype= is overridden by the
    # accelerator's preference in DeepSpeed 0.19: bf16 on a CPU even for an fp32 run).
    with deepspeed.zero.Init(config_dict_or_path=config), no_init_weights():
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    lm.tie_weights()
    files = _tensor_files(Path(path))
    modules = _param_modules(lm)
    missing = [n for _, named in modules for n, p in named if n not in files and not p.shared]
    if missing:  # NOTE: checked on every rank before any gather, so all ranks fail together
        from rstar2cli.errors import UserError

        raise UserError(f"{path} lacks weights for {', '.join(missing[:5])}")
    is_rank0 = dist.get_rank() == 0
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for _, named in modules:
            params = [p.param for _, p in named]
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                if not is_rank0:
                    continue
                for name, p in named:
                    if name not in files:
                        continue  # a tied weight, loaded under its other name
                    file = files[name]
                    if file not in handles:
                        handles[file] = stack.enter_context(safe_open(str(file), "pt"))
                    p.param.data.copy_(handles[file].get_tensor(name))
    return lm


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    import json

    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    with safe_open(str(single), "pt") as f:
        return {name: single for name in f.keys()}


@dataclass
class _Param:
    param: Any
    shared: bool  # the same tensor under another name too (tied embeddings)


def _param_modules(root: Any) -> list[tuple[str, list[tuple[str, _Param]]]]:
    """(module name, [(full parameter name, parameter)]) for every module owning parameters, in
    the module order; a tied parameter appears under each of its names."""
    counts = Counter(id(p) for m in root.modules() for p in m.parameters(recurse=False))
    out = []
    for prefix, module in root.named_modules():
        named = [
            (f"{prefix}.{n}" if prefix else n, _Param(p, counts[id(p)] > 1))
            for n, p in module.named_parameters(recurse=False)
        ]
        if named:
            out.append((prefix, named))
    return out


# ---------------------------------------------------------------------------------------------
# Weights out of the engine


def weight_buckets(
    lm: Any, zero3: bool, is_rank0: bool, max_bucket_bytes: int = BUCKET_BYTES
) -> Iterator[list[tuple[str, Any]]]:
    """Collective: the full weights of `lm` (HF names, CPU tensors) in buckets of about
    `max_bucket_bytes`. Every rank must iterate it to the end: each module's parameters are
    gathered by all ranks together (ZeRO-3); rank 0's buckets hold the tensors, the other ranks'
    buckets are empty lists yielded at the same points. A tied weight is one tensor under both
    of its names. With LoRA adapters the weights are the merged ones under the names of the
    model without adapters (`rstar2cli.lora.weight_sources`)."""
    import deepspeed

    from rstar2cli.lora import weight_sources

    bucket: list[tuple[str, Any]] = []
    num_bytes = 0
    shared: dict[int, Any] = {}
    for group in weight_sources(lm):
        params = [p for src in group for p in src.params]
        with deepspeed.zero.GatheredParameters(params, enabled=zero3):
            for src in group:
                num_bytes += src.numel * src.params[0].element_size()
                if not is_rank0:
                    continue
                tensor = shared.get(id(src.params[0]))
                if tensor is None:
                    tensor = src.full().detach().to("cpu", copy=True)
                    if src.shared:
                        shared[id(src.params[0])] = tensor
                bucket.append((src.name, tensor))
        if num_bytes >= max_bucket_bytes:
            yield bucket
            bucket, num_bytes = [], 0
    if num_bytes:
        yield bucket


def save_hf(lm: Any, tokenizer: Any, out_dir: Path, zero3: bool, rank: int) -> Path:
    """Collective: every rank calls it. Rank 0 writes the HF folder (safetensors, config,
    generation config, tokenizer) atomically from the gathered buckets. With LoRA adapters the
    folder holds the merged weights, and the adapter folder (PEFT's format) goes beside it as
    `<out_dir>_adapter`."""
    from rstar2cli.lora import has_adapters, save_adapter

    state = {name: t for bucket in weight_buckets(lm, zero3, rank == 0) for name, t in bucket}
    if has_adapters(lm):
        save_adapter(lm, out_dir.with_name(out_dir.name + "_adapter"), zero3, rank)
    if rank == 0:
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        lm.config.use_cache = True
        lm.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        lm.config.use_cache = False
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    return out_dir


# ---------------------------------------------------------------------------------------------
# RNG, checkpoints, logs, data order


def rng_state() -> dict[str, Any]:
    """Every global RNG a training step may draw from."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    # NOTE: only where CUDA is already up: the rl-stage driver does no CUDA work, and reading the
    # state would create a context on a GPU that an engine or trainer rank has budgeted
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_tags(ckpt_dir: Path) -> list[Path]:
    """Checkpoint folders named step<N>, oldest first."""
    tags = [p for p in ckpt_dir.glob("step*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(tags, key=lambda p: int(p.name[4:]))


def prune_checkpoints(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step<N> folders."""
    for old in step_tags(ckpt_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def open_run_logs(out: Path, start_step: int, tensorboard: bool) -> tuple[Any, Any]:
    """metrics.jsonl cut back to `start_step` (a resumed run rewrites what came after its
    checkpoint) opened for appending, and a TensorBoard writer purging the same steps (or None)."""
    from rstar2cli.fileio import JsonlAppender, read_jsonl_if_exists, write_jsonl_atomic

    path = out / "metrics.jsonl"
    kept = [r for r in read_jsonl_if_exists(path) if r.get("step", 0) <= start_step]
    write_jsonl_atomic(path, kept)
    writer = None
    if tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tb"), purge_step=start_step + 1)
    return JsonlAppender(path), writer


def batch_indices(step: int, num_examples: int, batch_size: int, seed: int) -> list[int]:
    """Example indices of one step: positions step*B .. step*B+B-1 of the stream of per-epoch
    permutations (a permutation depends only on seed and epoch, so resume needs only the step)."""
    return stream_indices(step * batch_size, batch_size, num_examples, seed)


def stream_indices(start: int, count: int, num_examples: int, seed: int) -> list[int]:
    """Example indices at positions start .. start+count-1 of the stream of per-epoch
    permutations (each a function of seed and epoch only)."""
    import torch

    out, perms = [], {}
    for pos in range(start, start + count):
        epoch = pos // num_examples
        if epoch not in perms:
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perms[epoch] = torch.randperm(num_examples, generator=g).tolist()
        out.append(perms[epoch][pos % num_examples])
    return out


def step_with_grad_norm(engine: Any, zero_stage: int) -> float | None:
    """`engine.step()`, returning the global gradient norm before clipping. DeepSpeed reports it
    itself only under bf16 or ZeRO 1-3; under ZeRO-0 the gradients held in the module after the
    boundary's all-reduce are the global ones, so their norm is taken before the step."""
    norm = _module_grad_norm(engine.module) if zero_stage == 0 else None
    engine.step()
    if norm is None:
        norm = engine.get_global_grad_norm()
    return None if norm is None else float(norm)


def reset_peak_memory(device: Any) -> None:
    """Start a new peak for `peak_memory_gib` on a GPU; a CPU's peak cannot be reset."""
    import torch

    if getattr(device, "type", None) == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: Any) -> float:
    """This process's peak memory in GiB: on a GPU (CUDA or ROCm) the most its tensors held
    since `reset_peak_memory`; on a CPU its peak resident size since it started (which also
    counts whatever else the process holds, such as a driver's records)."""
    import resource

    import torch

    if getattr(device, "type", None) == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux counts KiB


def _module_grad_norm(module: Any) -> float:
    import torch

    norms = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
