"""The user's chain on this machine's first GPU (tests/gpu/e2e.py, both sizes): every command
passes in bf16 with the transformers engine on the trainer's GPU, rl-stage resumes after a
SIGKILL and pushes its weights after every update, and every stage reports its peak GPU memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from clihelpers import run_rows

E2E = Path(__file__).with_name("e2e.py")


@pytest.mark.timeout(960)
def test_every_e2e_stage_passes_on_the_gpu(tmp_path):
    out = tmp_path / "e2e.jsonl"
    proc, rows = run_rows([str(E2E), "--device", "cuda"], out, timeout=900)
    assert [r for r in rows if not r["ok"]] == [], out.with_suffix(".log").read_text()[-3000:]
    assert proc.returncode == 0 and rows[-1]["stage"] == "summary"
    assert {r["size"] for r in rows if "size" in r} == {"tiny", "100m"}
    for row in rows:
        if row["stage"] in ("sft-coldstart", "rl-stage", "eval-sft", "eval-rl", "rl-stage-lora"):
            assert row["device"] == "cuda:0" and row["peak_gpu_memory_gib"] > 0, row
        if row["stage"] == "rl-stage":
            steps = row["metrics"]["steps"]
            assert [s["step"] for s in steps] == [1, 2, 3]
            assert all(s["weight_sync"] == "disk" for s in steps)
