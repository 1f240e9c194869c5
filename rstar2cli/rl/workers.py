"""Where the trainer ranks live: in this process (one rank) or as Ray actors (several ranks).

Both groups have the same small surface the stage loop uses: `world`, `update(plans, tokens)`,
`named_weights()`, `save_checkpoint`, `load_checkpoint`, `save_hf`, `close`, and for the broadcast
weight sync (rstar2cli/rl/sync.py) `weight_group_address`, `join_weight_group`, `weight_plan`,
`send_weights`. Every call that is a collective under DeepSpeed (update, save, load, send_weights)
goes to all ranks at once; rank 0 alone joins the transfer group.

- `LocalTrainers`: one `PolicyTrainer` in the driver process; torch.distributed with world size 1
  (gloo on CPU, nccl on GPU), no launcher (`setup_process_env`).
- `RayTrainers`: `num_ranks` actors, each one rank of a torch.distributed group whose rendezvous
  is rank 0's node; gloo on CPU, nccl when the actors have GPUs. Placed by Ray (local instance by
  default, a cluster with `ray_address`). Rank 0 returns the weights for the engines.

What it does not do: decide what to train on (the driver builds the plans) or restart dead actors.
Tested in tests/integration/test_rl_stage.py: local, and
(two engine actors + two trainer ranks over gloo).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rstar2cli.rl.recipe import RlTrainConfig
from rstar2cli.rl.trainer import PolicyTrainer, UpdateSums
from rstar2cli.scheduler.weight_sync import GroupAddress, SyncPlan, free_port, open_group


def init_distributed() -> None:
    """torch.distributed for this process from RANK/WORLD_SIZE/MASTER_* (set up if missing)."""
    from rstar2cli.sft.train import setup_process_env

    setup_process_env()
    import deepspeed
    import torch

    deepspeed.utils.logger.setLevel("WARNING")
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


class LocalTrainers:
    world = 1

    def __init__(self, model_path: str, cfg: RlTrainConfig, gas: int):
        init_distributed()
        self.trainer = PolicyTrainer(model_path, cfg, gas, rank=0, world=1)
        self.weight_group: Any = None

    def update(self, plans: list[Any], tokens: list[int]) -> list[UpdateSums]:
        return [self.trainer.update(plans[0], tokens)]

    def named_weights(self) -> dict[str, Any]:
        return self.trainer.named_weights()

    # the broadcast sync (rstar2cli/rl/sync.py): this process is rank 0 of the transfer group
    def on_gpu(self) -> bool:
        return self.trainer.on_gpu

    def weight_group_address(self, world_size: int, backend: str) -> GroupAddress:
        return _group_address(world_size, backend)

    def join_weight_group(self, address: GroupAddress) -> None:
        self.weight_group = open_group(address, 0)

    def weight_plan(self, dtype: str) -> SyncPlan:
        return self.trainer.weight_plan(dtype)

    def send_weights(self, plan: SyncPlan) -> int | None:
        return self.trainer.send_weights(self.weight_group, plan)

    def placements(self) -> list[dict[str, Any]]:
        return []

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
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def build(
        self, model_path: str, cfg: RlTrainConfig, gas: int, master_addr: str, master_port: int
    ) -> None:
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        init_distributed()
        self.trainer = PolicyTrainer(model_path, cfg, gas, rank=self.rank, world=self.world)

    @property
    def _built(self) -> PolicyTrainer:
        assert self.trainer is not None, "TrainerActor.build() comes first"
        return self.trainer

    def update(self, plan: Any, tokens: list[int]) -> UpdateSums:
        return self._built.update(plan, tokens)

    def named_weights(self) -> dict[str, Any] | None:
        weights = self._built.named_weights()  # a ZeRO-3 gather: every rank takes part
        return weights if self.rank == 0 else None

    def placement(self) -> dict[str, Any]:
        from rstar2cli.scheduler.placement import where_am_i

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
        gas: int,
        num_ranks: int,
        ray_address: str | None,
        num_cpus_per_rank: float = 1.0,
        actor_options: list[dict[str, Any]] | None = None,
    ):
        """`actor_options[r]`: Ray options placing rank r (placement.RayPlacement.options);
        None: one GPU each when the cluster has GPUs, else `num_cpus_per_rank` CPUs."""
        import ray

        if not ray.is_initialized():
            ray.init(address=None if ray_address in (None, "local") else ray_address)
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
        ray.get([a.build.remote(model_path, cfg, gas, addr, port) for a in self.actors])
        self._placements: list[dict[str, Any]] = ray.get(
            [a.placement.remote() for a in self.actors]
        )

    def update(self, plans: list[Any], tokens: list[int]) -> list[UpdateSums]:
        import ray

        return ray.get(
            [a.update.remote(p, tokens) for a, p in zip(self.actors, plans, strict=False)]
        )

    def named_weights(self) -> dict[str, Any]:
        """Rank 0's full copy; every rank is called, as ZeRO-3's gather is a collective."""
        import ray

        return ray.get([a.named_weights.remote() for a in self.actors])[0]

    def placements(self) -> list[dict[str, Any]]:
        """Per rank: node id, the GPU ids Ray gave it, whether torch sees a GPU."""
        return self._placements

    def on_gpu(self) -> bool:
        return bool(self._placements[0]["on_gpu"])

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
        """Every rank takes part (ZeRO-3 gathers); rank 0 broadcasts and returns the checksum."""
        import ray

        return ray.get([a.send_weights.remote(plan) for a in self.actors])[0]

    def save_checkpoint(self, ckpt_dir: Path, step: int, client_state: dict[str, Any]) -> None:
        import ray

        ray.get([a.save_checkpoint.remote(str(ckpt_dir), step, client_state) for a in self.actors])

    def load_checkpoint(
        self, ckpt_dir: Path, module_only: bool = False, with_scheduler: bool = True
    ) -> dict[str, Any] | None:
        import ray

        out = ray.get(
            [
                a.load_checkpoint.remote(str(ckpt_dir), module_only, with_scheduler)
                for a in self.actors
            ]
        )
        return out[0]

    def save_hf(self, out_dir: Path) -> None:
        import ray

        ray.get([a.save_hf.remote(str(out_dir)) for a in self.actors])

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def init_ray(address: str | None, num_actors: int) -> None:
    """Join the cluster at `address`, or start a local instance with logical CPUs for every actor.

    NOTE: locally, Ray's CPU count is a scheduling label, not a reservation; a 2-core box must
    still be able to place two engine actors and two trainer ranks, so the local instance
    advertises at least one CPU per actor.
    """
    import ray

    if ray.is_initialized():
        return
    if address not in (None, "local"):
        ray.init(address=address)
        return
    ray.init(num_cpus=max(os.cpu_count() or 1, num_actors), include_dashboard=False)


def make_trainers(
    model_path: str,
    cfg: RlTrainConfig,
    gas: int,
    ray_address: str | None,
    actor_options: list[dict[str, Any]] | None = None,
) -> Any:
    """Local when one rank and no Ray address; Ray actors otherwise (placed by `actor_options`)."""
    if cfg.num_trainer_ranks == 1 and ray_address is None:
        return LocalTrainers(model_path, cfg, gas)
    return RayTrainers(
        model_path, cfg, gas, cfg.num_trainer_ranks, ray_address, actor_options=actor_options
    )


def _group_address(world_size: int, backend: str) -> GroupAddress:
    """This node's address and a free port for the transfer group's store (rank 0 hosts it)."""
    import ray

    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    return GroupAddress(host, free_port(), world_size, backend)
