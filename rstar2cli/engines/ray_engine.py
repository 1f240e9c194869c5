"""Engines as Ray actors: one actor per engine, and a thin async proxy with the `Engine` surface.

Each actor builds one in-process engine (`VllmEngine` or `HfEngine`, engines.build_engine) and
serves it from its own event loop (an async actor, so many generate calls run at once). The proxy
(`RayEngine`) forwards generate / update_weights / the weight-sync and sleep calls / shutdown and
answers the synchronous getters from a cache: capacity, receivers and placement (node id, GPU ids)
are fixed at start-up; KV use and metrics come back with every finished generate call and are
polled every `poll_s` while calls are in flight.

`ray_address="local"` starts a local Ray instance of this process's own (`ray.init(address=
"local")`, never another process's); any other address joins that cluster. A Ray session started earlier in the process is reused as is. Each actor goes
into its bundle of a placement group (placement.py): the caller's, or one reserved here for these
engines (an engine's `tensor_parallel_size` GPUs in one bundle, hence one node), released when
the last of them closes.

What it does not do: restart dead actors (a call to one raises `errors.EngineDead`, as the
engine inside an actor does when it dies). A HF folder given to `update_weights` must be readable
on the actor's node (shared storage); a dict of tensors travels through Ray's object store (the
disk path; the broadcast path moves no weights through Ray).
Tested in tests/integration/test_ray_engines.py (two actors on a local Ray instance).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rstar2cli.engines.base import GenOutput, SamplingSpec
from rstar2cli.engines.local import build_engine
from rstar2cli.errors import EngineDead, UserError, first_line

if TYPE_CHECKING:
    from rstar2cli.cluster.placement import RayPlacement
    from rstar2cli.cluster.weight_sync import GroupAddress, SyncPlan


# NOTE: a colocated engine actor asks Ray for no GPU and runs on its bundle's (`devices`); Ray
# must leave the node's CUDA_VISIBLE_DEVICES alone for it (2.60's default; older Rays blanked it
# unless told so by this variable).
ENGINE_RUNTIME_ENV = {"runtime_env": {"env_vars": {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}}}


class EngineActor:
    """The actor body: one engine, its calls, and a stats snapshot with every result."""

    def __init__(self, kind: str, settings: dict[str, Any]):
        self.devices = list(settings.get("devices", ()))
        self.engine = build_engine(kind, **settings)

    def info(self) -> dict[str, Any]:
        from rstar2cli.cluster.placement import where_am_i

        receivers = getattr(self.engine, "num_weight_receivers", None)
        return {
            "name": self.engine.name,
            "kv_capacity_tokens": self.engine.kv_capacity_tokens(),
            "kv_block_size_tokens": self.engine.kv_block_size_tokens(),
            "num_weight_receivers": receivers() if receivers is not None else 0,
            "weight_dtype": getattr(self.engine, "weight_dtype", lambda: None)(),
            "on_gpu": bool(getattr(self.engine, "on_gpu", False)),
            "shares_prefixes": bool(getattr(self.engine, "shares_prefixes", False)),
            "devices": self.devices,  # set explicitly (colocated); else Ray's gpu_ids apply
            **where_am_i(),
        }

    def stats(self) -> tuple[int, dict[str, float]]:
        return self.engine.kv_used_tokens(), self.engine.metrics()

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec):
        out = await self.engine.generate(request_id, prompt_ids, spec)
        return out, self.stats()

    async def update_weights(self, named_tensors: Any) -> None:
        await self.engine.update_weights(named_tensors)

    async def join_weight_group(self, address: GroupAddress, rank_offset: int) -> None:
        await self._vllm.join_weight_group(address, rank_offset)

    async def receive_weights(self, plan: SyncPlan) -> list[int]:
        return await self._vllm.receive_weights(plan)

    async def sleep(self) -> None:
        await self._vllm.sleep()

    async def wake_up(self, tags: list[str] | None) -> None:
        await self._vllm.wake_up(tags)

    async def is_sleeping(self) -> bool:
        return await self._vllm.is_sleeping()

    @property
    def _vllm(self) -> Any:
        return self.engine  # only vLLM engines report num_weight_receivers > 0 or sleep

    async def shutdown(self) -> None:
        await self.engine.shutdown()


class RayEngine:
    """Proxy for one `EngineActor`; same surface as the in-process engines."""

    def __init__(
        self,
        actor: Any,
        info: dict[str, Any],
        poll_s: float = 0.5,
        on_close: Callable[[], None] | None = None,
    ):
        self._actor = actor
        self.name = info["name"]
        self.placement = {k: info[k] for k in ("node_id", "gpu_ids", "devices")}
        self._capacity = int(info["kv_capacity_tokens"])
        self._block_size = int(info["kv_block_size_tokens"])
        self._num_receivers = int(info["num_weight_receivers"])
        self._weight_dtype = info["weight_dtype"]
        self.on_gpu = bool(info["on_gpu"])
        self.shares_prefixes = bool(info.get("shares_prefixes", False))
        self._kv_used = 0
        self._metrics: dict[str, float] = {}
        self._num_in_flight = 0
        self._poll_s = poll_s
        self._poller: asyncio.Task | None = None
        self._on_close = on_close
        self._closed = False

    def kv_capacity_tokens(self) -> int:
        return self._capacity

    def kv_block_size_tokens(self) -> int:
        return self._block_size

    def kv_used_tokens(self) -> int:
        return self._kv_used

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def num_weight_receivers(self) -> int:
        return self._num_receivers

    def weight_dtype(self) -> str:
        return str(self._weight_dtype)

    async def generate(
        self, request_id: str, prompt_ids: list[int], spec: SamplingSpec
    ) -> GenOutput:
        import ray

        ref = self._actor.generate.remote(request_id, list(prompt_ids), spec)
        self._num_in_flight += 1
        self._ensure_poller()
        try:
            out, stats = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except ray.exceptions.ActorDiedError as exc:
            raise EngineDead(f"engine {self.name} died: {first_line(exc)}") from None
        except ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, UserError):  # the engine in the actor died, or refused
                raise cause from None
            return GenOutput(token_ids=[], logprobs=None, finish_reason="error")
        finally:
            self._num_in_flight -= 1
        self._kv_used, self._metrics = stats
        return out

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while self._num_in_flight > 0 and not self._closed:
            try:
                self._kv_used, self._metrics = await self._actor.stats.remote()
            except Exception:  # a dead actor shows up in generate; stats just stop updating
                return
            await asyncio.sleep(self._poll_s)

    async def update_weights(self, named_tensors: dict[str, Any] | str) -> None:
        if not isinstance(named_tensors, str):
            named_tensors = {k: v.detach().to("cpu") for k, v in named_tensors.items()}
        await self._actor.update_weights.remote(named_tensors)

    async def join_weight_group(self, address: GroupAddress, rank_offset: int) -> None:
        await self._actor.join_weight_group.remote(address, rank_offset)

    async def receive_weights(self, plan: SyncPlan) -> list[int]:
        return await self._actor.receive_weights.remote(plan)

    async def sleep(self) -> None:
        await self._actor.sleep.remote()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._actor.wake_up.remote(tags)

    async def is_sleeping(self) -> bool:
        return await self._actor.is_sleeping.remote()

    async def shutdown(self) -> None:
        if self._closed:
            return
        try:
            await self._actor.shutdown.remote()
        finally:
            self.close()

    def close(self) -> None:
        import ray

        if self._closed:
            return
        self._closed = True
        if self._poller is not None and not self._poller.done():
            self._poller.cancel()
        ray.kill(self._actor)
        if self._on_close is not None:
            self._on_close()


class _Lease:
    """A placement reserved for a set of engines, released when the last of them closes."""

    def __init__(self, placement: RayPlacement, num_holders: int):
        self._placement, self._num_holders = placement, num_holders

    def drop(self) -> None:
        self._num_holders -= 1
        if self._num_holders == 0:
            self._placement.release()


def start_ray_engines(
    kind: str,
    settings: list[dict[str, Any]],
    address: str = "local",
    placement: RayPlacement | None = None,
    num_cpus_per_engine: float = 1.0,
) -> list[RayEngine]:
    """One actor per settings dict, each in its slot of `placement` (None: a placement group
    reserved here for these engines, released when the last one closes); blocks until every
    engine is up (they start in parallel)."""
    import ray

    from rstar2cli.cluster.placement import (
        RayPlacement,
        check_paths_on_nodes,
        has_cluster_gpus,
        plan_bundles,
    )
    from rstar2cli.procguard import ray_init

    if not ray.is_initialized():
        # NOTE: "local" starts an instance of this process's own, even where another process on
        # this machine runs one (None would join that one)
        ray_init(address=address)
    check_paths_on_nodes(sorted({s["model_path"] for s in settings}))  # one line if a node lacks it
    owned = placement is None
    if placement is None:
        tp = int(settings[0].get("tensor_parallel_size", 1))
        plan = plan_bundles(
            len(settings), tp, 0, has_cluster_gpus(), num_cpus_per_actor=num_cpus_per_engine
        )
        placement = RayPlacement.reserve(plan)
    actor_cls = ray.remote(EngineActor)
    # NOTE: Any: Ray's stubs do not know an actor handle's remote methods
    actors: list[Any] = []
    for i, s in enumerate(settings):
        if placement.engine_devices:
            s = {**s, "devices": placement.engine_devices[i]}
        options = placement.options(placement.plan.engines[i]) | ENGINE_RUNTIME_ENV
        actors.append(actor_cls.options(**options).remote(kind, s))
    try:
        infos = ray.get([a.info.remote() for a in actors])
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        if owned:
            placement.release()
        raise
    lease = _Lease(placement, len(actors)) if owned else None
    return [
        RayEngine(actor, info, on_close=lease.drop if lease else None)
        for actor, info in zip(actors, infos, strict=True)
    ]
