"""benchmarks/lora_update.py on the tiny model: what it counts as trainer state is right.

Whole weights: a gradient and AdamW's two float32 moments for every weight. LoRA: the frozen base
plus the adapters, with gradients and moments for the adapters alone. Both arms train the same
fixed batch, autograd holds activations for both, and the table is printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_trainer_state_counts_gradients_and_moments_of_trainable_weights_only(
    tiny_model_dir, tmp_path
):
    report = tmp_path / "lora_update.json"
    cmd = [sys.executable, "-m", "benchmarks.lora_update", "--model", str(tiny_model_dir)]
    cmd += ["--ranks", "4", "--repeats", "1", "--threads", "1", "--json", str(report)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    arms = json.loads(report.read_text())["arms"]
    whole, lora = arms["whole"], arms["lora4"]
    assert whole["grads_gib"] == whole["weights_gib"]
    assert whole["optimizer_gib"] == pytest.approx(2 * whole["weights_gib"], rel=0.01)
    assert 0 < lora["trainable"] < whole["trainable"] / 4
    assert lora["grads_gib"] == pytest.approx(lora["trainable"] * 4 / 2**30)
    assert lora["optimizer_gib"] == pytest.approx(2 * lora["grads_gib"], rel=0.01)
    assert lora["weights_gib"] > whole["weights_gib"]  # the base and the adapters
    assert lora["state_gib"] < whole["state_gib"] / 2
    assert whole["tokens"] == lora["tokens"] > 0  # the same batch
    assert all(
        0 < a["loaded_gib"] <= min(a["peak_gib"], a["glibc_peak_gib"]) for a in (whole, lora)
    )
    # frozen norms and output layer keep no inputs for weight gradients; adapters add rank-wide ones
    assert 0 < lora["saved_gib"] < 1.1 * whole["saved_gib"]
    table = done.stdout.splitlines()
    assert any(line.startswith("whole") for line in table)
    assert any(line.startswith("lora4") for line in table)
