"""sft-coldstart with LoRA adapters (train.lora), real DeepSpeed on CPU: a run killed after its
first checkpoint and rerun ends with the weights of an uninterrupted run; its checkpoints hold
the adapter alone; final/ is the merged model and final_adapter/ the adapter.

NOTE: the kill is the state it leaves, made from a copy of the uninterrupted run (its first
checkpoint, nothing after it): two runs instead of three. tests/integration/test_sft_resume.py
kills a whole-weight run with SIGKILL (the same checkpoint writes), and tests/gpu/smoke.py's
train_lora stage resumes the RL trainer from a LoRA checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

NUM_STEPS = 4


def _recipe(tmp_path: Path) -> Path:
    from rstar2cli.data.synthetic import make_synthetic

    train, _ = make_synthetic("arith", 16, seed=5)
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train))
    recipe = {
        "model": "tiny",
        "data": {"sources": [{"path": str(data), "format": "arith"}], "max_seq_len": 1024},
        "train": {
            "max_steps": NUM_STEPS,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "lr": 1.0e-2,
            "seed": 0,
            "lora": {"enabled": True, "rank": 4, "alpha": 8},
        },
        "checkpoint": {"every_steps": 2, "keep_last": 2},
        "log": {"every_steps": 1, "tensorboard": False},
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _cmd(recipe: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "rstar2cli.cli", "sft-coldstart", "--recipe", str(recipe)] + [
        "--out",
        str(out),
    ]


def _env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _killed_after_first_checkpoint(straight: Path, out: Path) -> None:
    """What a run killed after its first checkpoint leaves: that checkpoint as `latest`, no later
    one, no final/, metrics up to it."""
    shutil.copytree(straight, out, ignore=shutil.ignore_patterns("final*"))
    ckpts = out / "checkpoints"
    first, *later = sorted(ckpts.glob("step*"), key=lambda p: int(p.name[4:]))
    for p in later:
        shutil.rmtree(p)
    (ckpts / "latest").write_text(first.name)
    done = int(first.name[4:])
    rows = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text(
        "".join(r + "\n" for r in rows if json.loads(r)["step"] <= done)
    )


def test_killed_lora_run_resumes_to_the_same_weights(tmp_path):
    import torch

    recipe = _recipe(tmp_path)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = subprocess.run(_cmd(recipe, straight), capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    _killed_after_first_checkpoint(straight, resumed)
    r = subprocess.run(_cmd(recipe, resumed), capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from step 2" in r.stdout

    a, b = _weights(straight / "final"), _weights(resumed / "final")
    init = _weights(straight / "init_model")
    assert a.keys() == init.keys()  # merged: the names of the model without adapters
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    assert any(not torch.equal(a[k], init[k]) for k in a), "training did not change the weights"
    # the frozen base is not in a checkpoint: its module state holds the adapter factors alone
    (states,) = (straight / "checkpoints" / f"step{NUM_STEPS}").glob("*model_states.pt")
    keys = list(torch.load(states, weights_only=False)["module"])
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys)
    assert (resumed / "final_adapter" / "adapter_model.safetensors").exists()
