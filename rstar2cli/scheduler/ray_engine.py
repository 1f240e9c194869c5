"""Engines as Ray actors: one actor per engine, and a thin async proxy with the `Engine` surface.

Each actor builds one in-process engine (`VllmEngine` or `HfEngine`, engines.build_engine) and
serves it from its own event loop (an async actor, so many generate calls run at once). The proxy
(`RayEngine`) forwards generate / update_weights / shutdown and answers the synchronous getters
from a cache: capacity is fixed at start-up; KV use and metrics come back with every finished
generate call and are polled every `poll_s` while calls are in flight.

`ray_address="local"` starts (or joins) a local Ray instance with `ray.init()`; any other address
joins that cluster. A Ray session started earlier in the process is reused as is. Each actor asks
for one GPU when the cluster has GPUs, else for `num_cpus_per_engine` CPUs.

What it does not do: placement across nodes beyond Ray's defaults, restarting dead actors.
A HF folder given to `update_weights` must be readable on the actor's node (shared storage); a dict
of tensors travels through Ray's object store.
Tested in tests/integration/test_ray_engines.py (two actors on a local Ray instance).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rstar2cli.scheduler.engines import GenOutput, SamplingSpec, build_engine


class EngineActor:
    """The actor body: one engine, its calls, and a stats snapshot with every result."""

    def __init__(self, kind: str, settings: dict[str, Any]):
        self.engine = build_engine(kind, **settings)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.engine.name,
            "kv_capacity_tokens": self.engine.kv_capacity_tokens(),
            "kv_block_size_tokens": self.engine.kv_block_size_tokens(),
        }

    def stats(self) -> tuple[int, dict[str, float]]:
        return self.engine.kv_used_tokens(), self.engine.metrics()

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec):
        out = await self.engine.generate(request_id, prompt_ids, spec)
        return out, self.stats()

    async def update_weights(self, named_tensors: Any) -> None:
        await self.engine.update_weights(named_tensors)

    async def shutdown(self) -> None:
        await self.engine.shutdown()


class RayEngine:
    """Proxy for one `EngineActor`; same surface as the in-process engines."""

    def __init__(self, actor: Any, info: dict[str, Any], poll_s: float = 0.5):
        self._actor = actor
        self.name = info["name"]
        self._capacity = int(info["kv_capacity_tokens"])
        self._block_size = int(info["kv_block_size_tokens"])
        self._kv_used = 0
        self._metrics: dict[str, float] = {}
        self._num_in_flight = 0
        self._poll_s = poll_s
        self._poller: asyncio.Task | None = None
        self._closed = False

    def kv_capacity_tokens(self) -> int:
        return self._capacity

    def kv_block_size_tokens(self) -> int:
        return self._block_size

    def kv_used_tokens(self) -> int:
        return self._kv_used

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

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
        except ray.exceptions.RayError:  # actor died or its call raised: an engine error
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

    async def shutdown(self) -> None:
        if self._closed:
            return
        try:
            await self._actor.shutdown.remote()
        finally:
            self.close()

    def close(self) -> None:
        import ray

        self._closed = True
        if self._poller is not None and not self._poller.done():
            self._poller.cancel()
        ray.kill(self._actor)


def start_ray_engines(
    kind: str,
    settings: list[dict[str, Any]],
    address: str = "local",
    num_cpus_per_engine: float = 1.0,
) -> list[RayEngine]:
    """One actor per settings dict; blocks until every engine is up (they start in parallel)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address)
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    options = {"num_gpus": 1} if has_gpus else {"num_cpus": num_cpus_per_engine}
    actor_cls = ray.remote(EngineActor)
    # NOTE: Any: Ray's stubs do not know an actor handle's remote methods
    actors: list[Any] = [actor_cls.options(**options).remote(kind, s) for s in settings]
    try:
        infos = ray.get([a.info.remote() for a in actors])
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        raise
    return [RayEngine(actor, info) for actor, info in zip(actors, infos, strict=True)]
