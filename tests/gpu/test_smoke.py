"""The GPU smoke script on this machine's first GPU: every stage must pass (bf16 trainer steps
under ZeRO 0/2/3 with gradient checkpointing and fp32 accumulation, chunked log-probs, weight
buckets and the SFT sums on NCCL, the transformers engine and its agreement with the trainer)."""

from __future__ import annotations

import runpy
from pathlib import Path

from clihelpers import run_rows

SMOKE = Path(__file__).with_name("smoke.py")
STAGES = runpy.run_path(str(SMOKE))["STAGES"]  # the script's own list (stdlib imports only)


def test_every_smoke_stage_passes_on_the_gpu(tmp_path):
    out = tmp_path / "smoke.jsonl"
    proc, rows = run_rows([str(SMOKE), "--device", "cuda"], out, timeout=480)
    failed = [r for r in rows if not r["ok"]]
    assert not failed, failed
    assert [r["stage"] for r in rows] == list(STAGES), proc.stderr[-2000:]
    assert proc.returncode == 0
    train = {r["zero_stage"]: r for r in rows if r["stage"].startswith("train_zero")}
    assert train[2]["grad_accum_dtype"] == train[3]["grad_accum_dtype"] == "float32"
    assert all(r["precision"] == "bf16" for r in train.values())
