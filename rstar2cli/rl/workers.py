"""Where the trainer ranks live: in this process (one rank) or as Ray actors (several ranks).

Both groups implement `Trainers`, the typed surface the stage loop uses: `world`,
`update(plans, tokens)`, `weight_buckets()`, `save_checkpoint`, `load_checkpoint`, `save_hf`,
`close`, and for the broadcast weight sync (rstar2cli/rl/sync.py) `on_gpu`, `placements`,
`weight_group_address`, `join_weight_group`, `weight_plan`, `send_weights`. Every call that is a
collective under DeepSpeed (update, weights, save, load) goes to all ranks at once; a rank left
out would leave the others waiting in a gather forever. Rank 0 alone joins the transfer group.

- `LocalTrainers`: one `PolicyTrainer` in the driver process; torch.distributed with world size 1
  (gloo on CPU, nccl on GPU), no launcher (`rstar2cli.train_utils.init_distributed`).
- `RayTrainers`: `num_ranks` actors, each one rank of a torch.distributed group whose rendezvous
  is rank 0's node; gloo on CPU, nccl when the actors have GPUs. Placed by Ray where
  `actor_options` say (placement.RayPlacement), else one GPU (or CPU) each. Weights leave as a
  stream of buckets: every actor walks the same module gathers, rank 0's stream carries the
  tensors.

A rank that fails makes the call raise `rstar2cli.rl.ranks.TrainerRankError`, one line.

What it does not do: decide what to train on (the driver builds the plans) or restart dead actors.
Tested in tests/integration/test_trainer_ranks.py (2 Ray ranks, ZeRO 0/2/3, gloo) and
tests/integration/test_rl_stage.py (local, and a 3-node Ray cluster: two engine actors + two
trainer ranks).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from rstar2cli.cluster.weight_sync import GroupAddress, SyncPlan, free_port, open_group
from rstar2cli.rl.batch import RankPlan
from rstar2cli.rl.ranks import gather_ranks
from rstar2cli.rl.train_recipe import CorrectionConfig, RlTrainConfig
from rstar2cli.rl.trainer import PolicyTrainer, UpdateSums


class Trainers(Protocol):
    """The trainer ranks as the stage loop sees them; every method is a collective."""

    world: int

    def update(self, plans: list[RankPlan], tokens: list[int]) -> list[UpdateSums]:
        """One RL step: plans[r] to rank r; returns each rank's sums."""
        ...

    def weight_buckets(self) -> Iterator[list[tuple[str, Any]]]:
        """The full weights (HF names, CPU tensors) in buckets, gathered module by module."""
        ...

    def save_checkpoint(self, ckpt_dir: Path, step: int, client_state: dict[str, Any]) -> None: ...

    def load_checkpoint(
        self, ckpt_dir: Path, module_only: bool = False, with_scheduler: bool = True
    ) -> dict[str, Any] | None: ...

    def save_hf(self, out_dir: Path) -> None: ...

    def close(self) -> None: ...

    # the broadcast sync: rank 0 is rank 0 of the transfer group
    def on_gpu(self) -> bool: ...

    def placements(self) -> list[dict[str, Any]]: ...

    def weight_group_address(self, world_size: int, backend: str) -> GroupAddress: ...

    def join_weight_group(self, address: GroupAddress) -> None: ...

    def weight_plan(self, dtype: str) -> SyncPlan: ...

    def send_weights(self, plan: SyncPlan) -> int | None:
        """Every rank takes part (ZeRO-3 gathers); rank 0 broadcasts and returns the checksum."""
        ...

    def release_gpu_cache(self) -> None:
        """Colocated: hand the memory torch keeps cached after an update back to the GPU, so
        the engines sharing it can wake (`_release_gpu_cache`)."""
        ...


class LocalTrainers:
    world = 1

    def __init__(
        self,
        model_path: str,
        cfg: RlTrainConfig,
        correction: CorrectionConfig | None = None,
        temperature: float = 1.0,
    ):
        from rstar2cli.train_utils import init_distributed

        init_distributed()
        self.trainer = PolicyTrainer(
            model_path, cfg, rank=0, world=1, correction=correction, temperature=temperature
        )
        self.weight_group: Any = None

    def update(self, plans: list[RankPlan], tokens: list[int]) -> list[UpdateSums]:
        return [self.trainer.update(plans[0], tokens)]

    def weight_buckets(self) -> Iterator[list[tuple[str, Any]]]:
        return self.trainer.weight_buckets()

    def save_checkpoint(self, ckpt_dir: Path, step: int, client_state: dict[str, Any]) -> None:
        self.trainer.save_checkpoint(ckpt_dir, step, client_state)

    def load_checkpoint(
        self, ckpt_dir: Path, module_only: bool = False, with_scheduler: bool = True
    ) -> dict[str, Any] | None:
        return self.trainer.load_checkpoint(ckpt_dir, module_only, with_scheduler)

    def save_hf(self, out_dir: Path) -> None:
        self.trainer.save_hf(out_dir)

    def close(self) -> None:
        pass

    def on_gpu(self) -> bool:
        return self.trainer.on_gpu

    def placements(self) -> list[dict[str, Any]]:
        return []

    def weight_group_address(self, world_size: int, backend: str) -> GroupAddress:
        return _group_address(world_size, backend)

    def join_weight_group(self, address: GroupAddress) -> None:
        self.weight_group = open_group(address, 0)

    def weight_plan(self, dtype: str) -> SyncPlan:
        return self.trainer.weight_plan(dtype)

    def send_weights(self, plan: SyncPlan) -> int | None:
        return self.trainer.send_weights(self.weight_group, plan)

    def release_gpu_cache(self) -> None:
        _release_gpu_cache()


class TrainerActor:
    """One rank in its own process (a Ray actor)."""

    def __init__(self, rank: int, world: int, num_threads: int):
        import torch

        # NOTE: decided here, not from the cluster's GPU count: a node may advertise GPUs to Ray
        # that this process cannot use (the multi-node test declares GPU resources on a CPU box)
        os.environ["DS_ACCELERATOR"] = "cuda" if torch.cuda.is_available() else "cpu"
        torch.set_num_threads(num_threads)
        self.rank, self.world = rank, world
        self.trainer: PolicyTrainer | None = None
        self.weight_group: Any = None

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0 hosts the process group)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def build(
        self,
        model_path: str,
        cfg: RlTrainConfig,
        master_addr: str,
        master_port: int,
        correction: CorrectionConfig | None = None,
        temperature: float = 1.0,
    ) -> None:
        from rstar2cli.train_utils import init_distributed

        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        init_distributed()
        self.trainer = PolicyTrainer(
            model_path,
            cfg,
            rank=self.rank,
            world=self.world,
            correction=correction,
            temperature=temperature,
        )

    @property
    def _built(self) -> PolicyTrainer:
        assert self.trainer is not None, "TrainerActor.build() comes first"
        return self.trainer

    def update(self, plan: RankPlan, tokens: list[int]) -> UpdateSums:
        return self._built.update(plan, tokens)

    def release_gpu_cache(self) -> None:
        _release_gpu_cache()

    def weight_buckets(self) -> Iterator[list[tuple[str, Any]]]:
        yield from self._built.weight_buckets()

    def placement(self) -> dict[str, Any]:
        from rstar2cli.cluster.placement import where_am_i

        return {**where_am_i(), "on_gpu": self._built.on_gpu}

    def weight_group_address(self, world_size: int, backend: str) -> GroupAddress:
        return _group_address(world_size, backend)

    def join_weight_group(self, address: GroupAddress) -> None:
        self.weight_group = open_group(address, 0)

    def weight_plan(self, dtype: str) -> SyncPlan:
        return self._built.weight_plan(dtype)

    def send_weights(self, plan: SyncPlan) -> int | None:
        return self._built.send_weights(self.weight_group, plan)

    def save_checkpoint(self, ckpt_dir: str, step: int, client_state: dict[str, Any]) -> None:
        self._built.save_checkpoint(Path(ckpt_dir), step, client_state)

    def load_checkpoint(self, ckpt_dir: str, module_only: bool, with_scheduler: bool) -> Any:
        return self._built.load_checkpoint(Path(ckpt_dir), module_only, with_scheduler)

    def save_hf(self, out_dir: str) -> None:
        self._built.save_hf(Path(out_dir))


class RayTrainers:
    def __init__(
        self,
        model_path: str,
        cfg: RlTrainConfig,
        num_ranks: int,
        ray_address: str | None,
        num_cpus_per_rank: float = 1.0,
        actor_options: list[dict[str, Any]] | None = None,
        correction: CorrectionConfig | None = None,
        temperature: float = 1.0,
    ):
        """`actor_options[r]`: Ray options placing rank r (placement.RayPlacement.options);
        None: one GPU each when the cluster has GPUs, else `num_cpus_per_rank` CPUs."""
        import ray

        init_ray(ray_address, num_ranks)
        if actor_options is None:
            has_gpus = ray.cluster_resources().get("GPU", 0) > 0
            one: dict[str, Any] = {"num_gpus": 1} if has_gpus else {"num_cpus": num_cpus_per_rank}
            actor_options = [one] * num_ranks
        actor_cls = ray.remote(TrainerActor)
        threads = max(1, int(num_cpus_per_rank))
        # NOTE: Any: Ray's stubs do not know an actor handle's remote methods
        self.actors: list[Any] = [
            actor_cls.options(**actor_options[r]).remote(r, num_ranks, threads)
            for r in range(num_ranks)
        ]
        self.world = num_ranks
        addr, port = ray.get(self.actors[0].rendezvous.remote())
        gather_ranks(
            [
                a.build.remote(
                    model_path=model_path,
                    cfg=cfg,
                    master_addr=addr,
                    master_port=port,
                    correction=correction,
                    temperature=temperature,
                )
                for a in self.actors
            ],
            "build",
        )
        self._placements: list[dict[str, Any]] = gather_ranks(
            [a.placement.remote() for a in self.actors], "placement"
        )

    def update(self, plans: list[RankPlan], tokens: list[int]) -> list[UpdateSums]:
        return gather_ranks(
            [a.update.remote(p, tokens) for a, p in zip(self.actors, plans, strict=False)],
            "update",
        )

    def weight_buckets(self) -> Iterator[list[tuple[str, Any]]]:
        # NOTE: every rank's stream is started at once: the ranks gather module by module
        # together; only rank 0's buckets hold tensors.
        streams = [a.weight_buckets.options(num_returns="streaming").remote() for a in self.actors]
        try:
            for ref in streams[0]:
                yield gather_ranks([ref], "weight_buckets")[0]
        finally:
            for rank, stream in enumerate(streams[1:], start=1):
                for ref in stream:
                    # NOTE: waits for the rank, and raises its error if it failed
                    gather_ranks([ref], "weight_buckets", first_rank=rank)

    def save_checkpoint(self, ckpt_dir: Path, step: int, client_state: dict[str, Any]) -> None:
        gather_ranks(
            [a.save_checkpoint.remote(str(ckpt_dir), step, client_state) for a in self.actors],
            "save_checkpoint",
        )

    def load_checkpoint(
        self, ckpt_dir: Path, module_only: bool = False, with_scheduler: bool = True
    ) -> dict[str, Any] | None:
        out = gather_ranks(
            [
                a.load_checkpoint.remote(str(ckpt_dir), module_only, with_scheduler)
                for a in self.actors
            ],
            "load_checkpoint",
        )
        return out[0]

    def save_hf(self, out_dir: Path) -> None:
        gather_ranks([a.save_hf.remote(str(out_dir)) for a in self.actors], "save_hf")

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)

    def on_gpu(self) -> bool:
        return bool(self._placements[0]["on_gpu"])

    def placements(self) -> list[dict[str, Any]]:
        """Per rank: node id, the GPU ids Ray gave it, whether torch sees a GPU."""
        return self._placements

    def weight_group_address(self, world_size: int, backend: str) -> GroupAddress:
        import ray

        return ray.get(self.actors[0].weight_group_address.remote(world_size, backend))

    def join_weight_group(self, address: GroupAddress) -> None:
        import ray

        ray.get(self.actors[0].join_weight_group.remote(address))

    def weight_plan(self, dtype: str) -> SyncPlan:
        import ray

        return ray.get(self.actors[0].weight_plan.remote(dtype))

    def send_weights(self, plan: SyncPlan) -> int | None:
        return gather_ranks([a.send_weights.remote(plan) for a in self.actors], "send_weights")[0]

    def release_gpu_cache(self) -> None:
        import ray

        ray.get([a.release_gpu_cache.remote() for a in self.actors])


def _release_gpu_cache() -> None:
    """NOTE: torch's caching allocator keeps the update's activations reserved; a sleeping vLLM
    engine on the same GPU wakes into what is really free (a GPU-only effect, not CPU-tested)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def init_ray(address: str | None, num_actors: int) -> None:
    """Join the cluster at `address`, or start a local instance with logical CPUs for every actor.

    NOTE: locally, Ray's CPU count is a scheduling label, not a reservation; a 2-core box must
    still be able to place two engine actors and two trainer ranks, so the local instance
    advertises at least one CPU per actor.
    """
    import ray

    from rstar2cli.procguard import ray_init

    if ray.is_initialized():
        return
    if address not in (None, "local"):
        ray_init(address=address)
        return
    # NOTE: address="local" starts a new instance even when another process on this machine
    # runs one (address=None would join it, and then refuse num_cpus).
    ray_init(
        address="local", num_cpus=max(os.cpu_count() or 1, num_actors), include_dashboard=False
    )


def make_trainers(
    model_path: str,
    cfg: RlTrainConfig,
    ray_address: str | None,
    actor_options: list[dict[str, Any]] | None = None,
    correction: CorrectionConfig | None = None,
    temperature: float = 1.0,
) -> Trainers:
    """Local when one rank and no Ray address; Ray actors otherwise (placed by `actor_options`).
    `correction`: the update's correction for the engine's sampling (None: none); `temperature`:
    the rollout's, at which the ranks score log-probs."""
    if cfg.num_trainer_ranks == 1 and ray_address is None:
        return LocalTrainers(model_path, cfg, correction, temperature)
    return RayTrainers(
        model_path,
        cfg,
        cfg.num_trainer_ranks,
        ray_address,
        actor_options=actor_options,
        correction=correction,
        temperature=temperature,
    )


def _group_address(world_size: int, backend: str) -> GroupAddress:
    """This node's address and a free port for the transfer group's store (rank 0 hosts it)."""
    import ray

    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    return GroupAddress(host, free_port(), world_size, backend)
