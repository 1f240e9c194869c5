"""Whether an engine (and a trainer beside it) fits a GPU, checked before anything starts.

An engine on a GPU may use `memory_fraction` of the device (vLLM's `gpu_memory_utilization`):
its weights (per tensor-parallel worker), its KV cache, and a runtime reserve (activations,
CUDA/HIP graphs, the CUDA context: RUNTIME_BYTES, as benchmarks/sim/workload.py assumes).
- KV asked for in tokens (`kv_cache_tokens`): weights + tokens x bytes per token + reserve must
  fit the share; vLLM allocates such a cache whatever the share says, and a cache too big is a
  CUDA out-of-memory error minutes into the start.
- KV sized from memory (`kv_cache_tokens` None, the GPU default): what the share leaves after
  weights and reserve must hold one whole trajectory (`max_model_len` tokens).
- An engine beside a trainer on one GPU (`check_shared_gpu`): the trainer's resident state
  (weights, gradients, optimizer: `trainer_resident_bytes`) plus the engine's share must fit the
  device; the engine sleeps while the trainer updates, so the update's activations come out of
  the engine's share. With LoRA the state is the bf16 base plus gradients and optimizer of the
  adapter factors alone (`adapter_numel`, from the safetensors headers and the recipe's rank).
Each refusal is one line naming the numbers and what to change.

Device memory is read through NVML (`device_memory_bytes`), which needs no CUDA context in this
process; where NVML cannot tell (ROCm, no pynvml) the caller skips the check. NOTE: NVML numbers
devices in PCI order, CUDA fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID: on a node of one
GPU model (the usual cluster) every device has the same memory, so the order does not matter.

What it does not do: measure anything on a GPU (vLLM's own profile at start is the final word;
tests/gpu/smoke.py runs a real engine). Tested in tests/unit/test_gpu_fit.py, including the
stage recipes against an H100 and an MI300X at Qwen3-14B.
"""

from __future__ import annotations

import json
from pathlib import Path

from rstar2cli.errors import UserError

RUNTIME_BYTES = 4 * 10**9
GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}
_SAFETENSORS_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "U8": 1}


def tensor_shapes(model_path: str | Path) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor in a HF folder's *.safetensors files (headers only)."""
    out = []
    for f in sorted(Path(model_path).glob("*.safetensors")):
        with f.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        out += [
            (n, tuple(int(d) for d in e["shape"])) for n, e in header.items() if n != "__metadata__"
        ]
    return out


def model_numel(model_path: str | Path) -> int:
    """Elements of every tensor in a HF folder's *.safetensors files (headers only)."""
    return sum(shape_numel(shape) for _, shape in tensor_shapes(model_path))


def shape_numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def adapter_numel(
    shapes: list[tuple[str, tuple[int, ...]]], rank: int, target_modules: list[str]
) -> int:
    """Elements of the LoRA factors PEFT adds: rank x (in + out) for every 2-D weight whose
    layer's last name part is a target (`<...>.q_proj.weight` for target q_proj)."""
    total = 0
    for name, shape in shapes:
        parts = name.split(".")
        if (
            len(shape) == 2
            and len(parts) >= 2
            and parts[-1] == "weight"
            and parts[-2] in target_modules
        ):
            total += rank * (shape[0] + shape[1])
    return total


def weight_bytes(numel: int, dtype: str, tensor_parallel_size: int = 1) -> int:
    """One worker's weights: the model's elements at the engine's dtype, split over its workers."""
    return numel * _DTYPE_BYTES[dtype] // tensor_parallel_size


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_engine_fit(
    *,
    name: str,
    weights_bytes: int,
    kv_bytes_per_token: int,
    kv_cache_tokens: int | None,
    max_model_len: int,
    memory_fraction: float,
    device_bytes: int,
) -> int:
    """The KV tokens one worker of engine `name` can hold in its share; one-line UserError when
    the asked-for cache, or one trajectory, does not fit."""
    budget = memory_fraction * device_bytes
    room = budget - weights_bytes - RUNTIME_BYTES
    fits = max(0, int(room // kv_bytes_per_token))
    shown = f"{memory_fraction:.2f} x {_gib(device_bytes)} = {_gib(budget)}"
    if kv_cache_tokens is not None and kv_cache_tokens > fits:
        kv = kv_cache_tokens * kv_bytes_per_token
        raise UserError(
            f"engine {name}: weights {_gib(weights_bytes)} + KV {_gib(kv)} ({kv_cache_tokens} "
            f"tokens x {kv_bytes_per_token} B) + runtime {_gib(RUNTIME_BYTES)} do not fit its GPU "
            f"share ({shown}); at most {fits} KV tokens fit: lower kv_cache_tokens, or leave it "
            "unset to size the cache from memory"
        )
    if fits < max_model_len:
        raise UserError(
            f"engine {name}: weights {_gib(weights_bytes)} + runtime {_gib(RUNTIME_BYTES)} leave "
            f"room for {fits} KV tokens in its GPU share ({shown}), fewer than one trajectory "
            f"({max_model_len}); raise gpu_memory_fraction, use tensor_parallel_size > 1, or "
            "shorten the prompt/response budget"
        )
    return fits


def trainer_resident_bytes(
    numel: int, zero_stage: int, world: int, trainable_numel: int | None = None
) -> int:
    """What a trainer rank keeps on its GPU between updates (mixed precision with fp32 master
    weights, AdamW, fp32 gradient accumulation): 2 B of bf16 weights, 4 of gradients, 12 of
    fp32 master copy and Adam moments per trained parameter, the parts ZeRO partitions divided by
    the ranks (stage 1: optimizer; 2: + gradients; 3: + weights). With LoRA `trainable_numel`
    counts the adapter factors: the frozen base is 2 B a parameter, gradients and optimizer
    state are the adapters' alone. Activations are extra."""
    trained = numel if trainable_numel is None else trainable_numel
    weights = 2 * numel if trainable_numel is None else 2 * (numel + trained)
    grads, optimizer = 4 * trained, 12 * trained
    if zero_stage >= 1:
        optimizer //= world
    if zero_stage >= 2:
        grads //= world
    if zero_stage >= 3:
        weights //= world
    return weights + grads + optimizer


def check_shared_gpu(
    *, trainer_bytes: int, memory_fraction: float, device_bytes: int, lora: bool = False
) -> str:
    """An engine sharing a GPU with a trainer rank: both resident at once must fit. Returns the
    sum as one line; else a one-line UserError with the numbers and what to do instead."""
    engine = memory_fraction * device_bytes
    what = "bf16 base and adapter state" if lora else "weights, gradients and optimizer"
    numbers = (
        f"the trainer's {what} ({_gib(trainer_bytes)}) and the engine's share "
        f"({memory_fraction:.2f} x {_gib(device_bytes)} = {_gib(engine)})"
    )
    if trainer_bytes + engine > device_bytes:
        lora_hint = "" if lora else ", train LoRA adapters (train.lora.enabled)"
        raise UserError(
            f"one GPU for trainer and engine: {numbers} exceed the GPU's {_gib(device_bytes)}; "
            "give the engines their own GPU (a second GPU, or Ray with rollout.colocate: false), "
            f"lower rollout.gpu_memory_fraction{lora_hint}, or raise train.zero_stage across "
            "more ranks"
        )
    return f"one GPU for trainer and engine: {numbers} fit the GPU's {_gib(device_bytes)}"


def device_memory_bytes(physical_id: str) -> int | None:
    """Total memory of one GPU by its physical id or UUID, from NVML (no CUDA context here);
    None where NVML cannot tell (ROCm, no pynvml, a MIG id NVML does not resolve)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        if physical_id.startswith(("GPU-", "MIG-")):
            handle = pynvml.nvmlDeviceGetHandleByUUID(physical_id)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(physical_id))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()
