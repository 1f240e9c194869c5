"""Settings that only matter on a GPU, decided on the CPU: the DeepSpeed config's gradient
accumulation dtype, the device of the SFT all-reduce, vLLM's executor backend under tensor
parallelism, where an engine decides it is on a GPU, the Ray runtime environment of engine actors,
and the checkpoint RNG state not touching CUDA. What they do on a GPU is tests/gpu/smoke.py's."""

from __future__ import annotations

import pytest

from rstar2cli import train_utils
from rstar2cli.engines import ray_engine, vllm_args


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_under_zero_accumulates_gradients_in_fp32(stage):
    config = train_utils.ds_config(stage, bf16=True, grad_clip=1.0, world=2)
    assert config["data_types"] == {"grad_accum_dtype": "fp32"}
    assert config["bf16"] == {"enabled": True}


def test_fp32_and_zero0_keep_deepspeeds_default_accumulation():
    # fp32: accumulation is already fp32; ZeRO-0 + bf16: DeepSpeed refuses fp32 accumulation
    # (NotImplementedError "unsupported mix"), so none is asked for
    assert "data_types" not in train_utils.ds_config(3, bf16=False, grad_clip=1.0, world=1)
    assert "data_types" not in train_utils.ds_config(0, bf16=True, grad_clip=1.0, world=1)


def test_deepspeed_accepts_the_bf16_zero2_config_and_accumulates_in_fp32():
    """Real DeepSpeed config parsing: the engine's data types read from our config."""
    from deepspeed.runtime.config import DeepSpeedConfig

    config = train_utils.ds_config(2, bf16=True, grad_clip=1.0, world=1)
    parsed = DeepSpeedConfig(config)
    assert parsed.bfloat16_config.enabled
    assert parsed.grad_accum_dtype == "fp32"
    assert parsed.zero_optimization_stage == 2


def test_sft_sums_over_ranks_on_the_engine_device(monkeypatch):
    """On GPU the default group is NCCL only: the all-reduced tensor must live on the engine's
    device (a CPU one raised "No backend type associated with device type cpu")."""
    import torch
    import torch.distributed as dist

    from rstar2cli.sft import train

    seen = []
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)  # as in a 2-rank run
    monkeypatch.setattr(dist, "all_reduce", lambda t: seen.append(t.device) or t.mul_(2))
    # NOTE: a recorder stands in for the collective: its input's device is what is checked
    assert train._all_sum([1.0, 2.0, 3.0], torch.device("cpu")) == [2.0, 4.0, 6.0]
    assert seen == [torch.device("cpu")]
    with pytest.raises(NotImplementedError):  # a meta tensor has no values to read back
        train._all_sum([1.0], torch.device("meta"))
    assert seen[-1] == torch.device("meta")  # the tensor is made on the device it is given


def test_tensor_parallel_engines_use_multiprocessing_workers():
    assert vllm_args.executor_backend(1) is None  # vLLM's own choice: one worker in-process
    assert vllm_args.executor_backend(2) == "mp"  # never Ray's backend inside our bundle
    assert vllm_args.executor_backend(8) == "mp"


def test_an_engine_given_gpus_is_on_a_gpu_whatever_torch_sees():
    # a colocated Ray actor asked for 0 GPUs; Ray < 2.60 blanked CUDA_VISIBLE_DEVICES for it
    assert vllm_args.runs_on_gpu(("0",)) is True
    assert vllm_args.runs_on_gpu(("GPU-1a2b",)) is True
    assert vllm_args.runs_on_gpu(()) is False  # this machine has no CUDA


def test_engine_actors_keep_the_nodes_visible_devices():
    env = ray_engine.ENGINE_RUNTIME_ENV["runtime_env"]["env_vars"]
    assert env == {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def test_checkpoint_rng_state_leaves_cuda_alone_until_it_is_up():
    import torch

    state = train_utils.rng_state()
    assert "cuda" not in state  # no CUDA here; on a GPU driver, none unless initialised
    assert not torch.cuda.is_initialized()


def test_a_bf16_run_loads_the_model_in_bf16(tiny_model_dir):
    """ZeRO 0-2: the module DeepSpeed casts to bf16 is loaded in bf16 (not an fp32 copy per rank),
    so the HF folder saved from it says bfloat16 too; fp32 runs stay fp32."""
    import torch

    config = train_utils.ds_config(2, bf16=True, grad_clip=1.0, world=1)
    model = train_utils._scoring_model(str(tiny_model_dir), config, bf16=True, zero3=False)
    assert model.lm.dtype == torch.bfloat16 and model.lm.config.dtype == torch.bfloat16
    model = train_utils._scoring_model(str(tiny_model_dir), config, bf16=False, zero3=False)
    assert model.lm.dtype == torch.float32
