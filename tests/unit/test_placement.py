"""Where engines and trainer ranks go, worked out on the CPU: local GPU choice, memory shares,
thread binding, Ray bundle plans (separate and colocated), the GPU check, and paths."""

from __future__ import annotations

import os

import pytest

from rstar2cli.cluster import placement as pl
from rstar2cli.errors import UserError


def test_local_devices_take_tp_gpus_each_in_order_and_wrap_when_short():
    assert pl.local_engine_devices(2, 2, None, num_visible=4) == [(0, 1), (2, 3)]
    assert pl.local_engine_devices(3, 1, None, num_visible=2) == [(0,), (1,), (0,)]
    assert pl.local_engine_devices(2, 1, [3, 1], num_visible=4) == [(3,), (1,)]
    assert pl.local_engine_devices(2, 1, None, num_visible=0) == [(), ()]  # CPU engines


def test_local_devices_refuse_gpus_that_do_not_exist_in_one_line():
    with pytest.raises(UserError, match=r"GPU\(s\) 2 asked for, but this machine has 2") as err:
        pl.local_engine_devices(1, 1, [0, 2], num_visible=2)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="has 0 visible"):
        pl.local_engine_devices(1, 1, [0], num_visible=0)
    with pytest.raises(UserError, match="tensor_parallel_size 4 needs 4 GPUs"):
        pl.local_engine_devices(1, 4, None, num_visible=2)


def test_memory_share_is_split_among_engines_on_one_gpu():
    assert pl.gpu_memory_fraction([(0,), (1,)], colocated=False) == pl.GPU_MEMORY_FRACTION
    # three engines on two GPUs: GPU 0 holds two of them
    assert pl.gpu_memory_fraction([(0,), (1,), (0,)], colocated=False) == pytest.approx(0.45)
    assert pl.gpu_memory_fraction([(0,)], colocated=True) == pl.COLOCATED_GPU_MEMORY_FRACTION
    assert pl.gpu_memory_fraction([(0,), (0,)], colocated=True, fraction=0.6) == pytest.approx(0.3)


def test_engines_beside_an_in_process_trainer():
    # the trainer takes GPU 0: with more GPUs the engines get the others, not shared
    assert pl.engines_beside_trainer(4, colocate=False) == ([1, 2, 3], False)
    # one GPU: the engines share it with the trainer, so they run colocated (sleep, gloo sync)
    assert pl.engines_beside_trainer(1, colocate=False) == ([0], True)
    # asked to colocate: every GPU, shared
    assert pl.engines_beside_trainer(4, colocate=True) == (None, True)
    # CPU: nothing shared on a GPU
    assert pl.engines_beside_trainer(0, colocate=False) == (None, False)


def test_cpu_thread_binding_gives_each_worker_its_cores():
    assert pl.cpu_thread_binding(2, [0, 1, 2, 3]) == "0,1|2,3"
    assert pl.cpu_thread_binding(2, [0, 1]) == "0|1"
    assert pl.cpu_thread_binding(3, [0, 1]) == "0|1|0"  # fewer cores than workers: shared


def test_engine_env_sets_and_restores_the_variables(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    with pl.engine_env(("2", "3"), 2, on_gpu=True):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
        assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    with pl.engine_env((), 2, on_gpu=False):
        assert "|" in os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    # a CPU engine with cores of its own binds its one worker inside them
    with pl.engine_env((), 1, on_gpu=False, cpu_cores=(1,)):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    with pl.engine_env((), 1, on_gpu=False):  # one engine, no cores named: vLLM's own binding
        assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_cpu_engines_split_the_allowed_cores(monkeypatch):
    assert pl.core_runs(2, [3, 2, 1, 0]) == [(0, 1), (2, 3)]
    assert pl.core_runs(4, [0, 1]) == [(0,), (1,), (0,), (1,)]  # fewer cores: engines share
    monkeypatch.setattr(pl.os, "sched_getaffinity", lambda pid: {0, 1})
    assert pl.cpu_engine_cores(2) == [(0,), (1,)]
    from rstar2cli.engines import build

    two = build._engine_settings(
        {"model_path": "m", "kv_cache_tokens": 4096, "max_model_len": 512},
        kind="vllm",
        seed=0,
        num_engines=2,
        tensor_parallel_size=1,
        devices=None,
        on_ray=False,
        colocated=False,
        gpu_memory_fraction=None,
    )
    assert [s["cpu_cores"] for s in two] == [(0,), (1,)]
    # one engine takes every core; a Ray actor the CPUs Ray gives it
    assert build._cpu_cores("vllm", 1, on_ray=False, per_engine=[()]) == []
    assert build._cpu_cores("vllm", 2, on_ray=True, per_engine=[(), ()]) == []
    assert build._cpu_cores("vllm", 2, on_ray=False, per_engine=[(0,), (1,)]) == []  # GPUs


def test_separate_plan_spreads_engine_bundles_and_packs_trainer_ranks():
    plan = pl.plan_bundles(2, 2, 3, has_gpus=True)
    engines, ranks = plan.groups
    assert engines.strategy == "SPREAD" and engines.bundles == ({"CPU": 1.0, "GPU": 2.0},) * 2
    assert ranks.strategy == "PACK" and ranks.bundles == ({"CPU": 1.0, "GPU": 1.0},) * 3
    assert [(s.group, s.index, s.num_gpus) for s in plan.engines] == [(0, 0, 2.0), (0, 1, 2.0)]
    assert [(s.group, s.index) for s in plan.trainers] == [(1, 0), (1, 1), (1, 2)]
    assert plan.num_gpus == 7 and not plan.colocated
    cpu = pl.plan_bundles(2, 1, 0, has_gpus=False)  # a CPU cluster, engines only
    assert len(cpu.groups) == 1 and cpu.groups[0].bundles == ({"CPU": 1.0},) * 2
    assert cpu.num_gpus == 0 and cpu.trainers == ()


def test_colocated_plan_puts_tp_ranks_in_each_engine_bundle():
    plan = pl.plan_bundles(2, 2, 4, has_gpus=True, colocate=True)
    (group,) = plan.groups
    assert group.strategy == "PACK" and group.bundles == ({"CPU": 3.0, "GPU": 2.0},) * 2
    assert [(s.index, s.num_gpus) for s in plan.engines] == [(0, 0.0), (1, 0.0)]
    assert [(s.index, s.num_gpus) for s in plan.trainers] == [(0, 1.0), (0, 1.0), (1, 1.0)] + [
        (1, 1.0)
    ]
    # each engine runs on the GPUs Ray gave the ranks of its bundle
    assert pl.colocated_devices(plan, [["0"], ["1"], ["4"], ["5"]]) == [("0", "1"), ("4", "5")]
    # Ray's ids may be UUIDs: kept as they are (they were int()ed: ValueError)
    uuids = [["GPU-aa"], ["GPU-bb"], ["MIG-cc"], ["MIG-dd"]]
    assert pl.colocated_devices(plan, uuids) == [("GPU-aa", "GPU-bb"), ("MIG-cc", "MIG-dd")]
    with pytest.raises(UserError, match="num_trainer_ranks must be"):
        pl.plan_bundles(2, 2, 3, has_gpus=True, colocate=True)


def test_cluster_gpu_check_names_the_shortfall():
    plan = pl.plan_bundles(2, 2, 2, has_gpus=True)  # 2 x 2 + 2 = 6 GPUs
    pl.check_cluster_gpus([4.0, 2.0], plan)
    with pytest.raises(UserError, match="asked for 6 GPUs .* the Ray cluster has 4"):
        pl.check_cluster_gpus([2.0, 2.0], plan)
    with pytest.raises(UserError, match="needs 2 GPUs on one node .* largest node .* has 1"):
        pl.check_cluster_gpus([1.0] * 8, plan)
    pl.check_cluster_gpus([], pl.plan_bundles(2, 1, 2, has_gpus=False))  # CPU: nothing to check


def test_absolute_path_resolves_local_paths_and_keeps_hub_ids(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert pl.absolute_path("model") == str(tmp_path / "model")
    assert pl.absolute_path("Qwen/Qwen3-14B") == "Qwen/Qwen3-14B"


def test_engine_gpus_are_mapped_through_the_inherited_visible_devices():
    # nothing inherited: torch's indices are the physical ids
    assert pl.physical_gpu_ids([0, 1], {}, rocm=False) == ("0", "1")
    # a job given GPUs 4-7: its engine on logical 1 is physical 5 (written unmapped: another
    # job's GPU 1)
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert pl.physical_gpu_ids([1], env, rocm=False) == ("5",)
    assert pl.physical_gpu_ids([2, 3], env, rocm=False) == ("6", "7")
    # UUID and MIG ids pass through as strings
    env = {"CUDA_VISIBLE_DEVICES": "GPU-1a2b, MIG-3c4d"}
    assert pl.physical_gpu_ids([1, 0], env, rocm=False) == ("MIG-3c4d", "GPU-1a2b")
    with pytest.raises(UserError, match=r"GPU\(s\) 2 asked for, but only 2 are visible"):
        pl.physical_gpu_ids([2], env, rocm=False)


def test_rocm_reads_and_writes_hip_visible_devices_in_step():
    # ROCm with only HIP_VISIBLE_DEVICES inherited: mapped through it
    env = {"HIP_VISIBLE_DEVICES": "2,3"}
    assert pl.physical_gpu_ids([1], env, rocm=True) == ("3",)
    # the same variable means nothing to CUDA
    assert pl.physical_gpu_ids([1], env, rocm=False) == ("1",)
    # both set and equal: fine; different: one line (vLLM raises at start otherwise)
    same = {"HIP_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert pl.physical_gpu_ids([0], same, rocm=True) == ("2",)
    with pytest.raises(UserError, match="name different GPUs"):
        pl.physical_gpu_ids([0], {"HIP_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "3"}, True)
    assert pl.visibility_env(["3", "5"], rocm=True) == {
        "CUDA_VISIBLE_DEVICES": "3,5",
        "HIP_VISIBLE_DEVICES": "3,5",
    }
    assert pl.visibility_env(["GPU-1a"], rocm=False) == {"CUDA_VISIBLE_DEVICES": "GPU-1a"}
