"""Setting up an RL stage before its first step: Ray placement, the trainer ranks (and the
checkpoint they resume from), the engines, and the weight-sync group.

With Ray (`--ray-address`, or several trainer ranks) the run first checks that every node can read
the model and write OUT, and reserves GPUs for engines and ranks (rstar2cli/cluster/placement.py;
one-line errors). In-process engines on the trainer's GPU are checked to fit beside it first
(gpu_fit.check_shared_gpu). OUT/placement.json records where each engine and rank landed.

Each function returns what it started; the stage run (rstar2cli.rl.stage) keeps it.
What it does not do: the step loop, rollouts or checkpoints (rstar2cli.rl.stage).
Tested in tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2cli.rl.stage_recipe import RlRecipe

if TYPE_CHECKING:
    from rstar2cli.rl.sync import WeightSync
    from rstar2cli.rl.workers import Trainers


def place(recipe: RlRecipe, *, ray_address: str | None, readable: list[str], out: Path) -> Any:
    """Join Ray, check that every node sees the paths, reserve the GPUs (one-line errors)."""
    from rstar2cli.cluster.placement import (
        RayPlacement,
        check_paths_on_nodes,
        has_cluster_gpus,
        plan_bundles,
    )
    from rstar2cli.rl.workers import init_ray

    r = recipe
    init_ray(ray_address, r.rollout.num_engines + r.train.num_trainer_ranks)
    check_paths_on_nodes(readable, writable=[str(out)])
    plan = plan_bundles(
        r.rollout.num_engines,
        r.rollout.tensor_parallel_size,
        r.train.num_trainer_ranks,
        has_cluster_gpus(),
        colocate=r.rollout.colocate,
    )
    return RayPlacement.reserve(plan)


def start_trainers(
    recipe: RlRecipe,
    *,
    model: str,
    ray_address: str | None,
    placement: Any,
    ckpt_dir: Path,
    init_checkpoint: Path | None,
    reset_optimizer: bool,
) -> tuple[Trainers, int, bool]:
    """Build the ranks and load state; returns (the ranks, first step, weights differ from
    recipe.model)."""
    from rstar2cli.rl.workers import make_trainers
    from rstar2cli.train_utils import set_rng_state

    options = None
    if placement is not None:
        options = [placement.options(bundle) for bundle in placement.plan.trainers]
    trainers = make_trainers(
        model,
        recipe.train,
        ray_address,
        actor_options=options,
        correction=recipe.correction,
        temperature=recipe.rollout.temperature,
    )
    client = trainers.load_checkpoint(ckpt_dir)
    if client is not None:
        set_rng_state(client["rng"])
        return trainers, int(client["step"]), True
    if init_checkpoint is not None:
        trainers.load_checkpoint(
            init_checkpoint,
            module_only=reset_optimizer,
            with_scheduler=False,
        )
        return trainers, 0, True
    return trainers, 0, False


def engine_devices(
    recipe: RlRecipe, *, model: str, trainers: Trainers, placement: Any
) -> tuple[list[int] | None, bool]:
    """Where in-process engines go (None: Ray places them), and whether they share the
    trainer's GPU (then checked to fit beside it first)."""
    from rstar2cli.cluster.placement import colocated_devices, engines_beside_trainer

    if placement is not None and placement.plan.colocated:
        gpu_ids = [p["gpu_ids"] for p in trainers.placements()]
        placement.engine_devices = colocated_devices(placement.plan, gpu_ids)
    if placement is not None:
        return None, False
    import torch

    devices, shared = engines_beside_trainer(torch.cuda.device_count(), recipe.rollout.colocate)
    if shared:
        check_shared_gpu(recipe, model)
    return devices, shared


def check_shared_gpu(recipe: RlRecipe, model: str) -> None:
    """In-process engines on the trainer's GPU: the trainer's resident state plus the
    engines' shares must fit it (gpu_fit.check_shared_gpu), else one line before any start."""
    import torch

    from rstar2cli.cluster.placement import gpu_memory_fraction

    r = recipe
    per_engine = [(0,)] * r.rollout.num_engines
    share = gpu_memory_fraction(per_engine, True, r.rollout.gpu_memory_fraction)
    line = shared_gpu_fit(
        recipe,
        model=model,
        memory_fraction=share * r.rollout.num_engines,
        device_bytes=torch.cuda.get_device_properties(0).total_memory,
    )
    print(f"rl-stage: {line}")


def shared_gpu_fit(
    recipe: RlRecipe, *, model: str, memory_fraction: float, device_bytes: int
) -> str:
    """The one-line fit of one trainer rank beside engines taking `memory_fraction` of a GPU
    (whole weights, or the bf16 base + adapter state with train.lora); UserError if it fails."""
    from rstar2cli.cluster import gpu_fit

    t = recipe.train
    shapes = gpu_fit.tensor_shapes(model)
    numel = sum(gpu_fit.shape_numel(shape) for _, shape in shapes)
    trainable = None
    if t.lora.enabled:
        trainable = gpu_fit.adapter_numel(shapes, t.lora.rank, t.lora.target_modules)
    return gpu_fit.check_shared_gpu(
        trainer_bytes=gpu_fit.trainer_resident_bytes(
            numel, t.zero_stage, world=1, trainable_numel=trainable
        ),
        memory_fraction=memory_fraction,
        device_bytes=device_bytes,
        lora=t.lora.enabled,
    )


async def start_sync(
    trainers: Trainers, engines: list[Any], *, colocated: bool, out: Path
) -> WeightSync:
    """The broadcast group (or the disk fallback), and where everything landed (placement.json)."""
    from rstar2cli.fileio import write_json_atomic
    from rstar2cli.rl.sync import WeightSync

    sync = WeightSync(trainers, engines, colocated=colocated)
    await sync.setup()
    broadcast = {e.name for e in sync.broadcast_engines}
    write_json_atomic(
        out / "placement.json",
        {
            "engines": [
                {"name": e.name, "weight_sync": "broadcast" if e.name in broadcast else "disk"}
                | getattr(e, "placement", {})
                for e in engines
            ],
            "trainer_ranks": trainers.placements(),
        },
    )
    return sync
