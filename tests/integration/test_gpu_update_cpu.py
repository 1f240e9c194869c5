"""benchmarks/gpu_update.py in its CPU mode: the tiny shape's update through `PolicyTrainer`
(DeepSpeed ZeRO-2, fp32, gradient checkpointing, chunked log-probs), its FLOP count against one
worked out by hand, the profile table, and a shape skipped for the time limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_tiny_update_on_the_cpu_then_a_shape_past_the_time_limit(tmp_path):
    out = tmp_path / "update.jsonl"
    cmd = [sys.executable, "-m", "benchmarks.gpu_update", "--device", "cpu"]
    cmd += ["--shapes", "tiny", "qwen3-0.6b", "--time-limit-s", "1", "--profile"]
    proc = subprocess.run(
        [*cmd, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=280
    )
    tiny, big = [json.loads(line) for line in out.read_text().splitlines()]
    assert tiny["ok"], (tiny, proc.stderr[-2000:])
    assert proc.returncode == 0
    # Qwen3 tiny: embedding 1024 x 128 = 131,072; per layer q 128x128, k and v 128x64 each,
    # o 128x128 (49,152), gate/up/down 3 x 128 x 256 (98,304), four norms 128+128+32+32 (320);
    # 2 layers and a final norm of 128: 131,072 + 2 x 147,776 + 128 = 426,752
    assert tiny["params"] == 426_752
    # 4 trajectories of 32 + 224 tokens (1,024 tokens), 4 x (224 - 16) = 832 scored:
    # matrices 6 x 2 x 147,456 x 1,024 = 1,811,939,328; output layer 6 x 1,024 x 128 x 832 =
    # 654,311,424; attention 12 x 2 x (4 x 32) x 256 x 1,024 = 805,306,368
    assert tiny["model_flop"] == 1_811_939_328 + 654_311_424 + 805_306_368
    assert tiny["micro_batches"] == 1 and tiny["tokens_per_s"] > 0
    assert tiny["rated_tflop_per_s"] is None and tiny["mfu_rated"] is None
    assert 0 < tiny["mfu_matmul"] and tiny["grad_norm"] > 0
    table = Path(tiny["profile"]).read_text()
    assert "Self CPU" in table and "aten::" in table
    assert big == {"shape": "qwen3-0.6b", "device": "cpu", "skipped": True} | {
        "estimate_s": big["estimate_s"]
    }
    assert big["estimate_s"] > 1
