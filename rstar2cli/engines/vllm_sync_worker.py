"""The receiving end of the weight sync inside vLLM: a worker extension class.

vLLM mixes the class named by the engine argument `worker_extension_cls` into each of its workers
(`vllm/v1/worker/worker_base.py`), and `AsyncLLM.collective_rpc(method, ...)` calls a method on
every worker of the engine (all tensor-parallel ranks). The methods here are prefixed `rstar2_`
because vLLM refuses an extension whose names clash with the worker's own.

- `rstar2_join_weight_group(address_wire, rank_offset)`: this worker joins the transfer group as
  rank `rank_offset + self.rank` (its rank inside the engine).
- `rstar2_receive_weights(plan_wire)`: receives the buckets and hands the tensors, as they arrive, to
  the worker's `reload_weights(weights_iterator=...)`, i.e. the model's own `load_weights` inside
  vLLM's layer-wise reload. NOTE why not `model.load_weights` alone: after loading, vLLM
  post-processes layers (vLLM-CPU repacks every linear weight for oneDNN and drops the original),
  and the layer-wise reload re-runs that processing per layer once the layer's tensors are in.
  Tensor-parallel workers each receive the full tensors; the weight loaders keep their shard.
  A tied-embedding model also gets `lm_head.weight` (the embedding again; the trainer sends tied
  parameters once), since vLLM's in-place reload leaves an untouched lm_head unloaded.
  Returns the combined checksum of what this worker received (weight_sync.combine).
Arguments arrive as plain dicts (`to_wire`): vLLM's RPC encodes them with msgpack.

Importing it in a vLLM worker process (vLLM does, in each, while the worker starts) makes that
worker ignore SIGTERM again (`procguard.leave_sigterm_to_the_engine_core`; vLLM's worker sets its
own handler once it has started).

Importing it also drops one warning vLLM 0.32 logs on every in-place reload, "RotaryEmbedding:
Failed to load weights": rotary caches are never in a checkpoint and the reload correctly keeps
them (see `_not_a_rotary_reload_warning`).

What it does not do: decide when to sync (the driver), reset the prefix cache (the engine does
after the call returns), or touch sleep mode (the engine's own sleep/wake_up calls).
Tested in tests/integration/test_vllm_engine.py (two real vLLM-CPU engines, gloo).
"""

from __future__ import annotations

import logging
from typing import Any

from rstar2cli.cluster import weight_sync as ws
from rstar2cli.procguard import leave_sigterm_to_the_engine_core

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
RELOAD_FAILED = "%s: Failed to load weights"  # vLLM's message, the layer's class name as %s


def _not_a_rotary_reload_warning(record: logging.LogRecord) -> bool:
    """False for vLLM's "RotaryEmbedding: Failed to load weights" after every in-place reload.

    NOTE: a rotary layer's cos/sin cache is computed from the config, never in a checkpoint, so
    the layer-wise reload always finds it unloaded and puts the layer's own tensors back, which is
    right; the warning would come once per layer per engine per step. Other layers' warnings pass.
    """
    args = record.args if isinstance(record.args, tuple) else ()
    return not (record.msg == RELOAD_FAILED and args and str(args[0]).endswith("RotaryEmbedding"))


# NOTE: this module is imported in every vLLM worker (worker_extension_cls) and by the engine
logging.getLogger(RELOAD_LOGGER).addFilter(_not_a_rotary_reload_warning)
leave_sigterm_to_the_engine_core()  # NOTE: again: vLLM's worker set its own handler meanwhile


class WeightSyncWorker:
    """Mixed into vLLM's worker class; `self` is the worker (rank, device, model_runner, ...)."""

    def rstar2_join_weight_group(self, address_wire: dict[str, Any], rank_offset: int) -> int:
        worker: Any = self
        address = ws.GroupAddress.from_wire(address_wire)
        rank = rank_offset + int(worker.rank)
        if address.backend == "nccl":
            import torch

            torch.cuda.set_device(worker.device)
        worker._rstar2_weight_group = ws.open_group(address, rank)
        return rank

    def rstar2_receive_weights(self, plan_wire: dict[str, Any]) -> int:
        worker: Any = self
        plan = ws.SyncPlan.from_wire(plan_wire)
        group = getattr(worker, "_rstar2_weight_group", None)
        if group is None:
            raise RuntimeError("rstar2_join_weight_group must come before rstar2_receive_weights")
        device = worker.device if ws.moves_device_tensors(group) else "cpu"
        sums: list[int] = []
        stream = ws.receive(group, plan, device, sums)
        tie = bool(getattr(worker.model_config.hf_config, "tie_word_embeddings", False))
        names = {s.name for b in plan.buckets for s in b}
        if tie and "lm_head.weight" not in names:
            stream = _with_tied_head(stream)
        try:
            worker.reload_weights(weights_iterator=stream)
        finally:
            for _ in stream:  # NOTE: stay in step with the sender (see weight_sync.receive)
                pass
        return ws.combine(sums)

    def rstar2_leave_weight_group(self) -> None:
        worker: Any = self
        worker._rstar2_weight_group = None


def _with_tied_head(stream: Any) -> Any:
    for name, tensor in stream:
        yield name, tensor
        if name == "model.embed_tokens.weight":
            yield "lm_head.weight", tensor
