"""Start the engines a command asked for: N of one kind, in this process or as Ray actors.

`EngineSpec` carries a command's engine options until the longest prompt, hence `max_model_len`,
is known; `make_engines` then starts them with their placement: tensor_parallel_size, GPUs and
memory share in this process, placement groups under Ray (rstar2cli/cluster/placement.py).

What it does not do: run an engine (local.py builds one in this process, ray_engine.py proxies an
actor) or size a GPU's KV cache (vllm_args.sizing_args).

Tested in tests/unit/test_hf_engine.py, tests/unit/test_gpu_settings.py,
tests/integration/test_vllm_engine.py and tests/integration/test_ray_engines.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rstar2cli.engines.base import (
    DEFAULT_KV_CACHE_TOKENS,
    ENGINE_KINDS,
    Engine,
    close_now,
    parse_speculative,
)
from rstar2cli.engines.local import build_engine
from rstar2cli.errors import UserError

if TYPE_CHECKING:
    from rstar2cli.cluster.placement import RayPlacement


def make_engines(
    model_path: str,
    num_engines: int,
    *,
    kind: str = "vllm",
    ray_address: str | None = None,
    kv_cache_tokens: int | None = None,
    max_model_len: int,
    seed: int = 0,
    tensor_parallel_size: int = 1,
    devices: Sequence[int] | None = None,
    gpu_memory_fraction: float | None = None,
    colocated: bool = False,
    placement: RayPlacement | None = None,
    dtype: str | None = None,
    speculative: str | None = None,
) -> list[Engine]:
    """Start `num_engines` engines of `kind` on `model_path`; blocks until every engine is ready
    (vLLM-CPU: ~25 s each).

    ray_address None: engines live in this process (vLLM: one engine-core process each), on the
    GPUs `devices` (default: the visible ones; placement.local_engine_devices), each using
    `gpu_memory_fraction` of its GPUs split among the engines sharing one (placement.py); a
    machine without GPUs runs them on the CPU. "local": one Ray actor per engine on a local Ray
    instance; any other value: the address of an existing Ray cluster. Ray engines go where
    `placement` (a reserved RayPlacement) says, else into a placement group reserved here.
    Engine i gets seed `seed + i` and the name f"{kind}{i}". `colocated`: engines share GPUs with
    trainer ranks and sleep between phases. `kv_cache_tokens`, `dtype`, `speculative`: as
    `_base_settings` says.
    """
    base = _base_settings(
        model_path=model_path,
        num_engines=num_engines,
        kind=kind,
        kv_cache_tokens=kv_cache_tokens,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        speculative=speculative,
    )
    settings = _engine_settings(
        base,
        kind=kind,
        seed=seed,
        num_engines=num_engines,
        tensor_parallel_size=tensor_parallel_size,
        devices=devices,
        on_ray=ray_address is not None,
        colocated=colocated,
        gpu_memory_fraction=gpu_memory_fraction,
    )
    if ray_address is None:
        return _build_local(kind, settings)
    from rstar2cli.engines.ray_engine import start_ray_engines

    return list(start_ray_engines(kind, settings, ray_address, placement))


def _engine_settings(
    base: dict[str, Any],
    *,
    kind: str,
    seed: int,
    num_engines: int,
    tensor_parallel_size: int,
    devices: Sequence[int] | None,
    on_ray: bool,
    colocated: bool,
    gpu_memory_fraction: float | None,
) -> list[dict[str, Any]]:
    """Each engine's settings: the shared `base`, its name and seed, its GPUs (none named for a
    Ray actor: Ray gives it its own) and the share of a GPU it uses."""
    from rstar2cli.cluster.placement import gpu_memory_fraction as memory_share

    if on_ray:
        from rstar2cli.cluster.placement import absolute_path

        base["model_path"] = absolute_path(base["model_path"])  # actors may run elsewhere
        share = memory_share([(0,)], colocated, gpu_memory_fraction)  # one engine per GPU
        per_engine: list[tuple[int, ...]] = [()] * num_engines
    else:
        per_engine = _local_devices(num_engines, tensor_parallel_size, devices)
        share = memory_share(per_engine, colocated, gpu_memory_fraction)
    cores = _cpu_cores(kind, num_engines, on_ray=on_ray, per_engine=per_engine)
    return [
        {**base, "name": f"{kind}{i}", "seed": seed + i}
        | _gpu_settings(
            kind=kind,
            tensor_parallel_size=tensor_parallel_size,
            devices=per_engine[i],
            share=share,
            colocated=colocated,
        )
        | ({"cpu_cores": cores[i]} if cores else {})
        for i in range(num_engines)
    ]


def _cpu_cores(
    kind: str, num_engines: int, on_ray: bool, per_engine: Sequence[tuple[int, ...]]
) -> list[tuple[int, ...]]:
    """Several in-process vLLM engines on the CPU: each one's own cores
    (`placement.cpu_engine_cores`); else none named (one engine takes every core, a Ray actor
    the CPUs Ray gives it)."""
    from rstar2cli.cluster.placement import cpu_engine_cores

    if kind != "vllm" or on_ray or num_engines < 2 or any(per_engine):
        return []
    return cpu_engine_cores(num_engines)


def _base_settings(
    *,
    model_path: str,
    num_engines: int,
    kind: str,
    kv_cache_tokens: int | None,
    max_model_len: int,
    tensor_parallel_size: int,
    dtype: str | None,
    speculative: str | None,
) -> dict[str, Any]:
    """Check the engine arguments and return the settings every engine of the run shares.

    `kv_cache_tokens` None: a vLLM engine on a GPU sizes its cache from its memory share
    (vllm_args.sizing_args); elsewhere DEFAULT_KV_CACHE_TOKENS, raised to one whole trajectory
    (`max_model_len`). `dtype` (vLLM engines): the weights' dtype; None: the model's own on a GPU,
    float32 on the CPU. `speculative` (vLLM engines): METHOD:TOKENS[:MAX_BATCH], speculative
    decoding without a draft model at low batches (`parse_speculative`,
    vllm_args.speculative_config).
    """
    if kind not in ENGINE_KINDS:
        raise ValueError(f"unknown engine kind {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
    if num_engines < 1:
        raise ValueError(f"num_engines must be >= 1, got {num_engines}")
    if kind == "hf" and tensor_parallel_size != 1:
        raise UserError("the transformers engine (hf) has no tensor parallelism; use vllm")
    if kv_cache_tokens is None and kind == "hf":
        kv_cache_tokens = max(DEFAULT_KV_CACHE_TOKENS, max_model_len)
    model_path = str(model_path)
    base: dict[str, Any] = dict(
        model_path=model_path, kv_cache_tokens=kv_cache_tokens, max_model_len=max_model_len
    )
    if dtype is not None:
        if kind != "vllm":
            raise UserError(f"dtype {dtype!r} is for vllm engines; the {kind} engine sets its own")
        base["dtype"] = dtype
    if speculative is not None:
        if kind != "vllm":
            raise UserError(f"--speculative is for vllm engines; the {kind} engine has none")
        parse_speculative(speculative)
        base["speculative"] = speculative
    return base


def _build_local(kind: str, settings: list[dict[str, Any]]) -> list[Engine]:
    """Build the engines in this process, one after another; close the built ones on a failure."""
    engines: list[Engine] = []
    try:
        for kwargs in settings:
            engines.append(build_engine(kind, **kwargs))
    except BaseException:
        for engine in engines:
            close_now(engine)
        raise
    return engines


def _local_devices(
    num_engines: int, tensor_parallel_size: int, devices: Sequence[int] | None
) -> list[tuple[int, ...]]:
    import torch

    from rstar2cli.cluster.placement import local_engine_devices

    num_visible = torch.cuda.device_count()  # 0 without CUDA
    return local_engine_devices(num_engines, tensor_parallel_size, devices, num_visible)


def _gpu_settings(
    kind: str, tensor_parallel_size: int, devices: tuple[int, ...], share: float, colocated: bool
) -> dict[str, Any]:
    """The placement arguments each engine kind takes (the HF engine: one device, this
    process's index; a vLLM engine: the physical ids its processes are confined to)."""
    if kind == "hf":
        return {"device": f"cuda:{devices[0]}"} if devices else {}
    import os

    from rstar2cli.cluster.placement import on_rocm, physical_gpu_ids

    physical = physical_gpu_ids(devices, os.environ, on_rocm()) if devices else ()
    return {
        "tensor_parallel_size": tensor_parallel_size,
        "devices": physical,
        "gpu_memory_utilization": share,
        "colocated": colocated,
    }


@dataclass(frozen=True)
class EngineSpec:
    """The engines a command was asked for, started once it knows `max_model_len` (the longest
    prompt plus the response budget)."""

    model_path: str
    num_engines: int = 1
    kind: str = "vllm"
    ray_address: str | None = None
    kv_cache_tokens: int | None = None  # None: `make_engines`' default size
    seed: int = 0
    tensor_parallel_size: int = 1
    devices: tuple[int, ...] | None = None  # in-process engines' GPUs; None: the visible ones
    gpu_memory_fraction: float | None = None  # None: placement.GPU_MEMORY_FRACTION
    speculative: str | None = None  # METHOD:TOKENS[:MAX_BATCH] (`parse_speculative`); None: none

    def check_fits(self, max_model_len: int) -> None:
        """One-line error when an asked-for KV cache cannot hold one whole trajectory."""
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < max_model_len:
            raise UserError(
                f"--kv-cache-tokens {self.kv_cache_tokens} cannot hold one trajectory: the longest "
                f"prompt + the response budget = {max_model_len} tokens"
            )

    def start(self, *, max_model_len: int) -> list[Engine]:
        self.check_fits(max_model_len)
        return make_engines(
            self.model_path,
            self.num_engines,
            kind=self.kind,
            ray_address=self.ray_address,
            kv_cache_tokens=self.kv_cache_tokens,
            max_model_len=max_model_len,
            seed=self.seed,
            tensor_parallel_size=self.tensor_parallel_size,
            devices=self.devices,
            gpu_memory_fraction=self.gpu_memory_fraction,
            speculative=self.speculative,
        )
