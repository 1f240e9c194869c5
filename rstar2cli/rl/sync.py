"""Getting the trainer's weights into the engines after each update, and the colocated phases.

`WeightSync.setup()` (once, after the engines start) forms the transfer group of
rstar2cli/cluster/weight_sync.py: it asks trainer rank 0 for an address on its node, gives each
engine that can receive (a vLLM engine: `num_weight_receivers()` = its workers) its range of
ranks, and has everyone join at once. `push()` then, per sync: every trainer rank streams the
weights out bucket by bucket (ZeRO-3: gathered per bucket) while rank 0 broadcasts, and the
engines load them in place; each engine worker's checksum must equal what rank 0 sent, or the
run stops. The driver handles only the plan (names and shapes).

The disk path stays as the fallback, per engine: an engine that cannot join (the transformers
engine) gets `update_weights` with `trainers.weight_buckets()` collected (a full copy through the
driver, a safetensors file, vLLM's reload from disk). If the group fails to form (an engine
dies or times out while joining), every engine falls back, with a warning.

Colocated (engines on the trainer's GPUs): `before_update()` puts the engines to sleep (vLLM
frees weights and KV on a GPU) and `push()` wakes their weights, syncs, then wakes their KV.

What it does not do: the update itself (rstar2cli/rl/trainer.py), start engines or choose
placement (rstar2cli/cluster/placement.py).
Tested in tests/integration/test_vllm_engine.py (two vLLM-CPU engines and a transformers engine:
colocated sleep -> wake -> broadcast, the disk fallback in the same push; a tensor-parallel engine)
and tests/integration/test_rl_stage.py (rl-stage on a 3-node Ray cluster, ZeRO-3 ranks).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rstar2cli.cluster import weight_sync as ws
from rstar2cli.errors import first_line

log = logging.getLogger(__name__)


def num_receivers(engine: Any) -> int:
    """Workers an engine brings to the transfer group; 0: it takes the disk path."""
    count = getattr(engine, "num_weight_receivers", None)
    return int(count()) if count is not None else 0


def rank_offsets(receivers: list[int]) -> list[int]:
    """Group rank of each engine's first worker (rank 0 is the trainer); 0 counts are skipped."""
    offsets, next_rank = [], 1
    for n in receivers:
        offsets.append(next_rank if n > 0 else 0)
        next_rank += n
    return offsets


class WeightSync:
    """Pushes weights from `trainers` (rstar2cli/rl/workers.py) to `engines`."""

    def __init__(self, trainers: Any, engines: list[Any], colocated: bool = False):
        self.trainers, self.engines, self.colocated = trainers, engines, colocated
        self.plan: ws.SyncPlan | None = None
        self._receivers = [num_receivers(e) for e in engines]
        # vLLM engines (the ones with receivers) are the ones that can sleep
        self._sleepers = [e for e, n in zip(engines, self._receivers, strict=True) if n > 0]
        self._asleep = False

    @property
    def broadcast_engines(self) -> list[Any]:
        if self.plan is None:
            return []
        return [e for e, n in zip(self.engines, self._receivers, strict=True) if n > 0]

    async def setup(self, timeout_s: float = ws.JOIN_TIMEOUT_S) -> None:
        if not any(self._receivers):
            return
        joining = [e for e, n in zip(self.engines, self._receivers, strict=True) if n > 0]
        on_gpu = self.trainers.on_gpu() and all(getattr(e, "on_gpu", False) for e in joining)
        address = self.trainers.weight_group_address(
            1 + sum(self._receivers), ws.transfer_backend(on_gpu, self.colocated)
        )
        offsets = rank_offsets(self._receivers)
        joins = [
            e.join_weight_group(address, off)
            for e, n, off in zip(self.engines, self._receivers, offsets, strict=True)
            if n > 0
        ]

        async def join_all() -> None:
            # NOTE: awaited inside a task of its own: wait_for cancelled (Ctrl-C) cancels that
            # task, which takes the gather's CancelledError; on a bare gather, wait_for leaves it
            # unretrieved and asyncio logs a traceback
            await asyncio.gather(
                asyncio.to_thread(self.trainers.join_weight_group, address), *joins
            )

        try:
            await asyncio.wait_for(join_all(), timeout_s + 30.0)
        except Exception as exc:  # one member failed: gloo/NCCL groups are all or nothing
            log.warning(
                "weight sync: no broadcast group (%s); every engine loads from disk",
                first_line(exc),
            )
            self._receivers = [0] * len(self.engines)
            return
        self.plan = self.trainers.weight_plan(joining[0].weight_dtype())

    async def before_update(self) -> None:
        """Colocated: the engines give the GPUs to the trainer while it updates."""
        if self.colocated:
            await asyncio.gather(*(e.sleep() for e in self._sleepers))
            self._asleep = True

    async def push(self) -> dict[str, Any]:
        """One sync; returns what the metrics row records (the path taken, the checksums)."""
        sleepers = self._sleepers if self._asleep else []
        if sleepers:
            await asyncio.to_thread(self.trainers.release_gpu_cache)
        await asyncio.gather(*(e.wake_up(["weights"]) for e in sleepers))
        row: dict[str, Any] = {}
        receiving = self.broadcast_engines
        if receiving:
            assert self.plan is not None
            plan = self.plan
            sent, *received = await asyncio.gather(
                asyncio.to_thread(self.trainers.send_weights, plan),
                *(e.receive_weights(plan) for e in receiving),
            )
            _check(sent, receiving, received)
            row["weight_checksum"] = sent
            row["engine_weight_checksums"] = {
                e.name: sums for e, sums in zip(receiving, received, strict=True)
            }
        rest = [e for e in self.engines if e not in receiving]
        if rest:
            # NOTE: a collective: every trainer rank gathers module by module, rank 0's buckets
            # arrive here; the engines then load the whole dict
            weights = {n: t for bucket in self.trainers.weight_buckets() for n, t in bucket}
            await asyncio.gather(*(e.update_weights(weights) for e in rest))
            del weights
        row["weight_sync"] = "broadcast" if not rest else "disk" if not receiving else "mixed"
        await asyncio.gather(*(e.wake_up(["kv_cache"]) for e in sleepers))
        self._asleep = False
        return row


def _check(sent: int, engines: list[Any], received: list[list[int]]) -> None:
    for engine, sums in zip(engines, received, strict=True):
        if any(s != sent for s in sums):
            raise RuntimeError(
                f"weight sync: engine {engine.name} received checksum(s) {sums}, the trainer "
                f"sent {sent}"
            )
