"""Where engines and trainer ranks run: local GPUs, Ray placement groups, and shared paths.

In this process (no Ray): engine i gets explicit GPUs (`local_engine_devices`: the ones asked for,
else the visible ones in order, tensor_parallel_size per engine; beside an in-process trainer,
`engines_beside_trainer`) and a memory share
(`gpu_memory_fraction`: vLLM's `gpu_memory_utilization`, split among the engines sharing a GPU),
so two engines, or an engine beside the trainer, fit on one GPU machine. The engine process sees
only its GPUs (`engine_env` sets CUDA_VISIBLE_DEVICES while vLLM spawns its processes). On a CPU,
several engines split the allowed cores (`cpu_engine_cores`), and each worker of an engine is
bound to its share of them.

With Ray (`plan_bundles`, then `RayPlacement.reserve`):
- separate (the default): one placement group for the engines, one bundle per engine holding its
  `tensor_parallel_size` GPUs (a bundle never spans nodes, so an engine's GPUs share a node),
  strategy SPREAD (engines on different nodes while there are nodes to spread over); then one for
  the trainer ranks, one GPU each, strategy PACK (fewest nodes for the trainer's collectives).
  Engines are placed first: packing the trainer first could leave the engines a single node.
- colocated: one placement group, one bundle per engine; the bundle's GPUs go to trainer ranks
  (one GPU each, so ranks = engines x tensor_parallel_size) and the engine actor takes no GPU of
  its own but runs on the GPUs of the ranks in its bundle (`devices`), with a smaller memory share.
  vLLM sleeps while the trainer updates (rstar2cli/rl/sync.py).
Without GPUs in the cluster, bundles hold CPUs only. Before anything starts, `check_cluster_gpus`
turns "not enough GPUs" into one line, and `reserve` waits a bounded time for the groups.

Paths handed to actors on other nodes are made absolute (`absolute_path`) and checked readable (or
writable) on every alive node by a zero-CPU task pinned to it (`check_paths_on_nodes`).

What it does not do: start actors (ray_engine.py, rstar2cli/rl/workers.py) or pick the number of
engines. Tested in tests/unit/test_placement.py (the plans and device choices, on the CPU) and
tests/integration/test_rl_stage.py (a 3-node Ray cluster on one machine).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError

GPU_MEMORY_FRACTION = 0.9  # of a GPU, for the engines on it when no trainer shares it
COLOCATED_GPU_MEMORY_FRACTION = 0.5  # the rest is the colocated trainer rank's
PLACEMENT_TIMEOUT_S = 120.0


def gpu_memory_fraction(
    devices: Sequence[Sequence[int]], colocated: bool, fraction: float | None = None
) -> float:
    """vLLM's `gpu_memory_utilization` for each engine: the share of a GPU the engines on it may
    use (`fraction`, default by mode), divided by the most engines found on one GPU."""
    share = fraction
    if share is None:
        share = COLOCATED_GPU_MEMORY_FRACTION if colocated else GPU_MEMORY_FRACTION
    per_gpu = Counter(d for engine in devices for d in engine)
    return share / max(per_gpu.values(), default=1)


def local_engine_devices(
    num_engines: int, tensor_parallel_size: int, devices: Sequence[int] | None, num_visible: int
) -> list[tuple[int, ...]]:
    """GPU ids per in-process engine: `tensor_parallel_size` distinct ones each, taken in order from
    `devices` (default: all visible), wrapping around when engines outnumber GPUs (they then share).
    No GPUs and none asked for: CPU engines (empty tuples)."""
    if devices is None:
        if num_visible == 0:
            return [() for _ in range(num_engines)]
        devices = list(range(num_visible))
    missing = [d for d in devices if not 0 <= d < num_visible]
    if missing:
        raise UserError(
            f"GPU(s) {', '.join(map(str, missing))} asked for, but this machine has "
            f"{num_visible} visible GPU(s){_cuda_env()}"
        )
    if tensor_parallel_size > len(devices):
        raise UserError(
            f"tensor_parallel_size {tensor_parallel_size} needs {tensor_parallel_size} GPUs per "
            f"engine; {len(devices)} available ({', '.join(map(str, devices))}){_cuda_env()}"
        )
    out = []
    for i in range(num_engines):
        first = (i * tensor_parallel_size) % len(devices)
        out.append(tuple(devices[(first + j) % len(devices)] for j in range(tensor_parallel_size)))
    return out


def engines_beside_trainer(num_visible: int, colocate: bool) -> tuple[list[int] | None, bool]:
    """In-process engines next to an in-process trainer (which takes GPU 0): their GPUs (None:
    all visible) and whether they share the trainer's GPU. Two or more GPUs: the others, not
    shared. One GPU: GPU 0, shared, so the engines run colocated (a colocated memory share,
    asleep while the trainer updates, weights over gloo: NCCL refuses two members on one GPU);
    run as if separate, vLLM asked for 0.9 of a GPU the trainer already used and refused to
    start. `colocate`: every GPU, shared. No GPU: CPU engines."""
    if num_visible == 0:
        return None, False
    if colocate:
        return None, True
    if num_visible > 1:
        return list(range(1, num_visible)), False
    return [0], True


def _cuda_env() -> str:
    names = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    shown = [f"{n}={os.environ[n]}" for n in names if n in os.environ]
    return f" ({', '.join(shown)})" if shown else ""


def physical_gpu_ids(
    logical: Sequence[int], environ: Mapping[str, str], rocm: bool
) -> tuple[str, ...]:
    """The ids to write into an engine's CUDA_VISIBLE_DEVICES for GPUs this process numbers
    0..N-1 (torch's indices): the entries of the visibility variable it inherited (which may be
    physical numbers, GPU-/MIG- UUIDs), else the indices themselves. With `4,5,6,7` inherited,
    logical 0 is "4"; written unmapped it would be another job's GPU 0. On ROCm,
    HIP_VISIBLE_DEVICES counts too; set to a different list than CUDA_VISIBLE_DEVICES, vLLM
    refuses to start, so that is one line here."""
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    hip = environ.get("HIP_VISIBLE_DEVICES") if rocm else None
    if cuda is not None and hip is not None and _ids(cuda) != _ids(hip):
        raise UserError(
            f"CUDA_VISIBLE_DEVICES={cuda} and HIP_VISIBLE_DEVICES={hip} name different GPUs; "
            "vLLM on ROCm needs them equal: set one of them"
        )
    visible = cuda if cuda is not None else hip
    if visible is None:
        return tuple(str(d) for d in logical)
    inherited = _ids(visible)
    missing = [d for d in logical if not 0 <= d < len(inherited)]
    if missing:
        raise UserError(
            f"GPU(s) {', '.join(map(str, missing))} asked for, but only {len(inherited)} are "
            f"visible{_cuda_env()}"
        )
    return tuple(inherited[d] for d in logical)


def _ids(visible: str) -> list[str]:
    return [v.strip() for v in visible.split(",") if v.strip()]


def visibility_env(ids: Sequence[str], rocm: bool) -> dict[str, str]:
    """The variables that confine an engine's processes to `ids` (physical ids or UUIDs): both
    on ROCm (vLLM copies HIP_VISIBLE_DEVICES into CUDA_VISIBLE_DEVICES and raises when they
    differ), CUDA_VISIBLE_DEVICES elsewhere."""
    value = ",".join(ids)
    return {"CUDA_VISIBLE_DEVICES": value} | ({"HIP_VISIBLE_DEVICES": value} if rocm else {})


def on_rocm() -> bool:
    import torch

    return getattr(torch.version, "hip", None) is not None


def core_runs(num_parts: int, cores: Sequence[int]) -> list[tuple[int, ...]]:
    """`cores` cut into `num_parts` runs of equal length ([0, 1, 2, 3] in 2: (0, 1), (2, 3));
    with fewer cores than parts, part r shares core r mod len(cores)."""
    cores = sorted(cores)
    per = max(1, len(cores) // num_parts)
    return [
        tuple(cores[r * per : (r + 1) * per] or [cores[r % len(cores)]]) for r in range(num_parts)
    ]


def cpu_thread_binding(tensor_parallel_size: int, cores: Sequence[int]) -> str:
    """vLLM-CPU's VLLM_CPU_OMP_THREADS_BIND for T workers: the allowed cores cut into T runs
    ("0,1|2,3"); with fewer cores than workers they share ("0|1|0"). vLLM's own "auto" binding
    wants one NUMA node per worker and refuses T > 1 on a one-node machine."""
    runs = core_runs(tensor_parallel_size, cores)
    return "|".join(",".join(str(c) for c in run) for run in runs)


def cpu_engine_cores(num_engines: int) -> list[tuple[int, ...]]:
    """Each of `num_engines` in-process CPU engines' own cores, out of this process's allowed
    ones (`core_runs`). vLLM's "auto" binding puts every engine's threads on every core: two
    busy engines then time-share all of them, each one's threads waiting on the other's."""
    return core_runs(num_engines, sorted(os.sched_getaffinity(0)))


@contextmanager
def engine_env(
    devices: Sequence[str],
    tensor_parallel_size: int,
    on_gpu: bool,
    cpu_cores: Sequence[int] = (),
) -> Iterator[None]:
    """The environment an engine's processes start with (they inherit it): the GPUs `devices`
    (physical ids: `physical_gpu_ids`, or Ray's) when given (`visibility_env`); on a CPU, when
    the engine has cores of its own (`cpu_cores`, `cpu_engine_cores`) or tensor parallelism, a
    thread binding per worker inside its cores (unless one is set already)."""
    updates: dict[str, str] = {}
    if devices:
        updates |= visibility_env([str(d) for d in devices], on_rocm())
    bind = tensor_parallel_size > 1 or bool(cpu_cores)
    if not on_gpu and bind and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        cores = sorted(cpu_cores or os.sched_getaffinity(0))
        updates["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(tensor_parallel_size, cores)
    before = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- Ray ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bundle:
    """Where one actor goes: bundle `index` of placement group `group`, and what it asks for."""

    group: int
    index: int
    num_gpus: float
    num_cpus: float


@dataclass(frozen=True)
class GroupSpec:
    bundles: tuple[dict[str, float], ...]
    strategy: str  # a Ray placement strategy: "SPREAD", "PACK"


@dataclass(frozen=True)
class BundlePlan:
    groups: tuple[GroupSpec, ...]
    engines: tuple[Bundle, ...]
    trainers: tuple[Bundle, ...]
    colocated: bool

    @property
    def num_gpus(self) -> int:
        return int(sum(b.get("GPU", 0) for g in self.groups for b in g.bundles))


def plan_bundles(
    num_engines: int,
    tensor_parallel_size: int,
    num_trainer_ranks: int,
    has_gpus: bool,
    colocate: bool = False,
    num_cpus_per_actor: float = 1.0,
) -> BundlePlan:
    """The placement groups and each actor's bundle (see the module docstring). `num_trainer_ranks`
    0: engines only (rollout, eval, filter-hard)."""
    if colocate:
        return _colocated_plan(
            num_engines=num_engines,
            tp=tensor_parallel_size,
            num_trainer_ranks=num_trainer_ranks,
            has_gpus=has_gpus,
            cpus=num_cpus_per_actor,
        )
    tp, cpus = tensor_parallel_size, num_cpus_per_actor
    engine_gpus = float(tp) if has_gpus else 0.0
    groups = [GroupSpec(_bundles(num_engines, cpus, engine_gpus), "SPREAD")]
    engines = tuple(Bundle(0, e, engine_gpus, cpus) for e in range(num_engines))
    rank_gpus = 1.0 if has_gpus else 0.0
    trainers = tuple(Bundle(1, r, rank_gpus, cpus) for r in range(num_trainer_ranks))
    if trainers:
        groups.append(GroupSpec(_bundles(num_trainer_ranks, cpus, rank_gpus), "PACK"))
    return BundlePlan(tuple(groups), engines, trainers, colocated=False)


def _colocated_plan(
    num_engines: int, tp: int, num_trainer_ranks: int, has_gpus: bool, cpus: float
) -> BundlePlan:
    if num_trainer_ranks != num_engines * tp:
        raise UserError(
            f"colocated: one trainer rank per engine GPU, so num_trainer_ranks must be "
            f"num_engines x tensor_parallel_size = {num_engines * tp}, not {num_trainer_ranks}"
        )
    bundles = _bundles(num_engines, cpus * (tp + 1), float(tp) if has_gpus else 0.0)
    engines = tuple(Bundle(0, e, 0.0, cpus) for e in range(num_engines))
    rank_gpus = 1.0 if has_gpus else 0.0
    trainers = tuple(Bundle(0, r // tp, rank_gpus, cpus) for r in range(num_trainer_ranks))
    return BundlePlan((GroupSpec(bundles, "PACK"),), engines, trainers, colocated=True)


def _bundles(count: int, cpus: float, gpus: float) -> tuple[dict[str, float], ...]:
    return tuple({"CPU": cpus, **({"GPU": gpus} if gpus else {})} for _ in range(count))


def colocated_devices(
    plan: BundlePlan, trainer_gpu_ids: Sequence[Sequence[str]]
) -> list[tuple[str, ...]]:
    """Colocated: each engine runs on the GPUs Ray gave the trainer ranks of its bundle (Ray's
    ids: the node's physical ids or UUIDs, written into the engine's environment as they are)."""
    out: list[tuple[str, ...]] = []
    for engine in plan.engines:
        ids = [
            g
            for bundle, gpus in zip(plan.trainers, trainer_gpu_ids, strict=True)
            if bundle.index == engine.index
            for g in gpus
        ]
        out.append(tuple(ids))
    return out


def check_cluster_gpus(node_gpus: Sequence[float], plan: BundlePlan) -> None:
    """One line when the cluster cannot hold the plan's GPUs: too few in all, or no node with
    enough for one bundle (an engine's GPUs must share a node)."""
    need = plan.num_gpus
    if need == 0:
        return
    total = int(sum(node_gpus))
    largest = max((b.get("GPU", 0) for g in plan.groups for b in g.bundles), default=0)
    if total < need:
        raise UserError(
            f"asked for {need} GPUs ({len(plan.engines)} engine(s), {len(plan.trainers)} trainer "
            f"rank(s)) but the Ray cluster has {total}"
        )
    if largest > max(node_gpus, default=0):
        raise UserError(
            f"an engine needs {int(largest)} GPUs on one node (tensor_parallel_size) but the "
            f"largest node of the Ray cluster has {int(max(node_gpus, default=0))}"
        )


@dataclass
class RayPlacement:
    """Reserved placement groups for one `BundlePlan`; `options(bundle)` places an actor."""

    plan: BundlePlan
    groups: list[Any] = field(default_factory=list)
    # colocated: the GPU ids each engine runs on (its bundle's trainer ranks'); else empty
    engine_devices: list[tuple[str, ...]] = field(default_factory=list)

    @classmethod
    def reserve(cls, plan: BundlePlan, timeout_s: float = PLACEMENT_TIMEOUT_S) -> RayPlacement:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        gpus = [float(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["Alive"]]
        check_cluster_gpus(gpus, plan)
        groups = []
        try:
            for spec in plan.groups:  # one after the other: the engines' group is placed first
                groups.append(placement_group(list(spec.bundles), strategy=spec.strategy))
                ray.get(groups[-1].ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            for g in groups:
                remove_placement_group(g)
            wanted = "; ".join(f"{g.strategy} {list(g.bundles)}" for g in plan.groups)
            raise UserError(
                f"Ray could not place {wanted} within {timeout_s:.0f} s; cluster resources: "
                f"{ray.cluster_resources()}"
            ) from None
        return cls(plan, groups)

    def options(self, bundle: Bundle) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_gpus": bundle.num_gpus,
            "num_cpus": bundle.num_cpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.groups[bundle.group],
                placement_group_bundle_index=bundle.index,
            ),
        }

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for g in self.groups:
            remove_placement_group(g)
        self.groups = []


def has_cluster_gpus() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def where_am_i() -> dict[str, Any]:
    """Inside a Ray actor: its node id and the GPU ids Ray gave it."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        # NOTE: strings: Ray returns the entries of the node's CUDA_VISIBLE_DEVICES, which may be
        # GPU-/MIG- UUIDs
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    }


# -- paths ----------------------------------------------------------------------------------


def absolute_path(path: str | Path) -> str:
    """An absolute path when `path` names something here; anything else (a hub id) unchanged."""
    p = Path(path).expanduser()
    return str(p.resolve()) if p.exists() else str(path)


def _unusable(readable: list[str], writable: list[str]) -> list[str]:
    bad = [p for p in readable if not os.access(p, os.R_OK)]
    return bad + [p for p in writable if not os.access(p, os.W_OK)]


def check_paths_on_nodes(readable: Sequence[str], writable: Sequence[str] = ()) -> None:
    """Every alive node of the connected Ray cluster can read `readable` and write `writable`
    (absolute paths); else one line naming the first node and its paths."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(_unusable)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = [
        probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(list(readable), list(writable))
        for n in nodes
    ]
    for node, bad in zip(nodes, ray.get(refs), strict=True):
        if bad:
            raise UserError(
                f"{', '.join(bad)} not usable on Ray node {node['NodeManagerAddress']} "
                f"({node['NodeID'][:12]}): actors there need the same paths (shared storage)"
            )
