"""tests/gpu/smoke.py in its CPU mode (fp32, gloo, the tiny model): every stage runs and passes
here, so the script a lent GPU runs is not dead on arrival. Real DeepSpeed, hence this tier."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[1] / "gpu" / "smoke.py"


@pytest.mark.timeout(900)
def test_smoke_script_runs_every_stage_on_the_cpu(tmp_path):
    out = tmp_path / "smoke.jsonl"
    proc = subprocess.run(
        [sys.executable, str(SMOKE), "--device", "cpu", "--out", str(out), "--timeout-scale", "5"],
        capture_output=True,
        text=True,
        timeout=880,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["stage"] for r in rows] == list(runpy.run_path(str(SMOKE))["STAGES"])
    assert [r for r in rows if not r["ok"]] == [], proc.stderr[-2000:]
    assert proc.returncode == 0
    train = {r["zero_stage"]: r for r in rows if r["stage"].startswith("train_zero")}
    assert train[0]["optimizer"] == "AdamW" and train[2]["grad_accum_dtype"] == "float32"
    assert all(r["weights_moved"].split("/")[0] != "0" for r in train.values())
    lora = next(r for r in rows if r["stage"] == "train_lora")  # ZeRO-3, fp32: exact resume
    assert lora["base_moved"] == 0 and lora["resume_max_abs_diff"] == 0.0
    assert rows[-1]["float32_max_abs_logprob_diff"] < 1e-3  # engine vs trainer, same tokens
    assert next(r for r in rows if r["stage"] == "buckets")["num_buckets"] > 1


def test_a_failing_stage_still_reports_one_line(tmp_path):
    """A stage that dies (here: the model folder is missing) writes its line; the run goes on."""
    out = tmp_path / "smoke.jsonl"
    cmd = [sys.executable, str(SMOKE), "--stage", "hf_engine", "--device", "cpu"]
    cmd += ["--model", str(tmp_path / "missing"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert proc.returncode == 1 and row["stage"] == "hf_engine" and row["ok"] is False
    assert row["error"]
