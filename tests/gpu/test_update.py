"""One RL update of a Qwen3-0.6B shape on this machine's first GPU (benchmarks/gpu_update.py):
bf16 through `PolicyTrainer`, its tokens/s, MFU against the rated peak (on an H100/H200 SXM) and
against a matrix product measured beside it, and its peak memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from clihelpers import run_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(960)
def test_qwen3_0_6b_update_reports_its_mfu(tmp_path):
    out = tmp_path / "update.jsonl"
    argv = ["-m", "benchmarks.gpu_update", "--shape", "qwen3-0.6b"]
    proc, (row,) = run_rows(argv, out, timeout=900, cwd=REPO)
    assert row["ok"], (row, proc.stderr[-2000:])
    assert row["batch"]["num_trajectories"] == 64 and row["micro_batches"] == 32
    assert row["tokens_per_s"] > 0 and 0 < row["mfu_matmul"] < 1
    assert row["matmul_tflop_per_s"] > 100 and row["peak_memory_gib"] > 0
    if row["rated_tflop_per_s"] is not None:
        assert 0 < row["mfu_rated"] < 1
