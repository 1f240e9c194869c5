"""The pre-flight GPU fit checks and KV sizing, worked out with the numbers of real devices:
Qwen3-14B (14.77e9 parameters, 163,840 KV bytes per token in bf16) on an 80 GB H100 and a 192 GB
MI300X, and the stage recipes against both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2cli.cluster import gpu_fit
from rstar2cli.cluster.placement import GPU_MEMORY_FRACTION
from rstar2cli.engines.vllm_args import kv_bytes_per_token, sizing_args
from rstar2cli.errors import UserError
from rstar2cli.recipe import load_recipe
from rstar2cli.rl.stage_recipe import RlRecipe

REPO = Path(__file__).resolve().parents[2]
QWEN3_14B_PARAMS = 14_770_000_000
H100_BYTES = 80 * 10**9
MI300X_BYTES = 192 * 10**9
STAGE_RECIPES = [
    "recipes/stage1_8k.yaml",
    "recipes/stage2_12k.yaml",
    "recipes/stage3_12k_hard.yaml",
]


@pytest.fixture
def qwen3_14b_config(tmp_path) -> Path:
    config = {
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 5120,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _fit(kv_cache_tokens, device_bytes, per_token=163_840, max_model_len=14_336):
    return gpu_fit.check_engine_fit(
        name="vllm0",
        weights_bytes=gpu_fit.weight_bytes(QWEN3_14B_PARAMS, "bfloat16"),
        kv_bytes_per_token=per_token,
        kv_cache_tokens=kv_cache_tokens,
        max_model_len=max_model_len,
        memory_fraction=GPU_MEMORY_FRACTION,
        device_bytes=device_bytes,
    )


def test_kv_bytes_per_token_of_qwen3_14b(qwen3_14b_config):
    # 2 (K, V) x 40 layers x 8 KV heads x 128 x 2 bytes
    assert kv_bytes_per_token(qwen3_14b_config, "auto") == 163_840
    assert kv_bytes_per_token(qwen3_14b_config, "auto", tensor_parallel_size=2) == 81_920


def test_kv_tokens_a_share_leaves():
    # H100: 0.9 x 80e9 = 72e9 - 29.54e9 weights - 4e9 runtime = 38.46e9 B / 163,840 = 234,741
    assert _fit(None, H100_BYTES) == 234_741
    # MI300X: 0.9 x 192e9 = 172.8e9 - 33.54e9 = 139.26e9 B / 163,840 = 849,975
    assert _fit(None, MI300X_BYTES) == 849_975


def test_a_kv_cache_that_does_not_fit_is_one_line_with_the_numbers():
    # the stage recipes' old sizes: 524,288 tokens = 80 GiB of KV, beside 27.5 GiB of weights
    with pytest.raises(UserError) as err:
        _fit(524_288, H100_BYTES)
    message = str(err.value)
    assert "\n" not in message
    assert "weights 27.5 GiB + KV 80.0 GiB (524288 tokens x 163840 B)" in message
    assert "0.90 x 74.5 GiB = 67.1 GiB" in message and "at most 234741 KV tokens fit" in message
    assert _fit(786_432, MI300X_BYTES) == 849_975  # the old stage-2 size fits an MI300X
    # a 38 GB GPU: 34.2e9 - 33.54e9 leaves 4,028 tokens, fewer than one 14,336-token trajectory
    with pytest.raises(UserError, match="room for 4028 KV tokens .* fewer than one trajectory"):
        _fit(None, 38 * 10**9)


@pytest.mark.parametrize("name", STAGE_RECIPES)
@pytest.mark.parametrize("device_bytes", [H100_BYTES, MI300X_BYTES], ids=["h100", "mi300x"])
def test_stage_recipes_fit_h100_and_mi300x_at_qwen3_14b(name, device_bytes, qwen3_14b_config):
    """What each engine of a stage recipe checks before it starts, on both clusters."""
    recipe = load_recipe(REPO / name, RlRecipe)
    r = recipe.rollout
    assert r.kv_cache_tokens is None  # sized from memory on the GPU it lands on
    per_token = kv_bytes_per_token(qwen3_14b_config, "auto", r.tensor_parallel_size)
    fits = gpu_fit.check_engine_fit(
        name="vllm0",
        weights_bytes=gpu_fit.weight_bytes(QWEN3_14B_PARAMS, "auto", r.tensor_parallel_size),
        kv_bytes_per_token=per_token,
        kv_cache_tokens=r.kv_cache_tokens,
        max_model_len=r.max_prompt_tokens + r.max_response_tokens,
        memory_fraction=r.gpu_memory_fraction or GPU_MEMORY_FRACTION,
        device_bytes=device_bytes,
    )
    assert fits >= 16 * (r.max_prompt_tokens + r.max_response_tokens)  # many trajectories


def test_engine_sizing_on_gpu_leaves_kv_to_memory_and_lifts_batch_limits():
    gpu = sizing_args(
        on_gpu=True,
        kv_cache_tokens=None,
        kv_bytes_per_token=163_840,
        max_model_len=14_336,
        gpu_memory_utilization=0.9,
    )
    assert "kv_cache_memory_bytes" not in gpu  # vLLM sizes it from the share
    assert gpu["gpu_memory_utilization"] == 0.9
    assert (gpu["max_num_seqs"], gpu["max_num_batched_tokens"]) == (1024, 16384)
    asked = sizing_args(
        on_gpu=True,
        kv_cache_tokens=200_000,
        kv_bytes_per_token=163_840,
        max_model_len=20_000,
        gpu_memory_utilization=0.9,
    )
    assert asked["kv_cache_memory_bytes"] == 200_000 * 163_840
    assert asked["max_num_batched_tokens"] == 20_000  # one whole prompt at least
    cpu = sizing_args(
        on_gpu=False,
        kv_cache_tokens=None,
        kv_bytes_per_token=1_000,
        max_model_len=4_096,
        gpu_memory_utilization=None,
    )
    assert cpu["kv_cache_memory_bytes"] == 65_536 * 1_000  # the CPU default size
    assert cpu["enable_chunked_prefill"] is False and cpu["gpu_memory_utilization"] == 0.3


def test_trainer_resident_memory_by_zero_stage():
    n = 1_000
    assert gpu_fit.trainer_resident_bytes(n, zero_stage=0, world=1) == 18_000
    assert gpu_fit.trainer_resident_bytes(n, zero_stage=1, world=4) == 2_000 + 4_000 + 3_000
    assert gpu_fit.trainer_resident_bytes(n, zero_stage=2, world=4) == 2_000 + 1_000 + 3_000
    assert gpu_fit.trainer_resident_bytes(n, zero_stage=3, world=4) == 500 + 1_000 + 3_000


def test_one_gpu_for_trainer_and_engine_fits_or_says_what_to_do():
    # the quickstart's size (~0.1e9 parameters) on a 24 GB card: 1.8e9 + 0.5 x 24e9 fits
    gpu_fit.check_shared_gpu(
        trainer_bytes=gpu_fit.trainer_resident_bytes(100_000_000, 0, 1),
        memory_fraction=0.5,
        device_bytes=24 * 10**9,
    )
    # Qwen3-14B's trainer alone (18 B/param = 266 GB) cannot share one H100
    with pytest.raises(UserError) as err:
        gpu_fit.check_shared_gpu(
            trainer_bytes=gpu_fit.trainer_resident_bytes(QWEN3_14B_PARAMS, 0, 1),
            memory_fraction=0.5,
            device_bytes=H100_BYTES,
        )
    assert "\n" not in str(err.value)
    assert "trainer's weights, gradients and optimizer (247.6 GiB)" in str(err.value)
    assert "give the engines their own GPU" in str(err.value)


def test_model_numel_reads_the_safetensors_headers(tiny_model_dir):
    from rstar2cli.engines.base import read_safetensors_folder

    tensors = read_safetensors_folder(tiny_model_dir)
    assert gpu_fit.model_numel(tiny_model_dir) == sum(t.numel() for t in tensors.values())


def test_device_memory_is_unknown_without_nvml_gpus():
    assert gpu_fit.device_memory_bytes("0") is None  # no NVIDIA driver on this machine
