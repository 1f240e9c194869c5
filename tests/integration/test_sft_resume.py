"""sft-coldstart with real DeepSpeed on CPU: a run killed with SIGKILL and rerun ends bit-identical
to an uninterrupted run (weights and loss curve), and its output folder is a loadable HF model.

With LoRA adapters (train.lora): a run killed after its first checkpoint and rerun ends with the
weights of an uninterrupted run; its checkpoints hold the adapter alone; final/ is the merged
model and final_adapter/ the adapter. NOTE: that kill is the state it leaves, made from a copy of
the uninterrupted run (its first checkpoint, nothing after it): two runs instead of three; the
whole-weight test above kills for real, through the same checkpoint writes. tests/gpu/smoke.py's
train_lora stage resumes the RL trainer from a LoRA checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

NUM_STEPS = 6


def _recipe(tmp_path: Path, num_problems: int = 40, **train: object) -> Path:
    """The SFT recipe of these tests; `train` overrides its train section."""
    from rstar2cli.data.synthetic import make_synthetic

    train_rows, _ = make_synthetic("arith", num_problems, seed=5)
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    recipe: dict = {
        "model": "tiny",
        "data": {
            "sources": [{"path": str(data), "format": "arith"}],
            "max_seq_len": 1024,
            "error_fraction": 0.3,
        },
        "train": {
            "max_steps": NUM_STEPS,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "lr": 1.0e-3,
            "warmup_ratio": 0.2,
            "packing": True,
            "seed": 0,
        },
        "checkpoint": {"every_steps": 2, "keep_last": 2},
        "log": {"every_steps": 1, "tensorboard": True},
    }
    recipe["train"].update(train)
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _cmd(recipe: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rstar2cli.cli",
        "sft-coldstart",
        "--recipe",
        str(recipe),
        "--out",
        str(out),
        *extra,
    ]


def _env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=_env())


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _losses(out: Path) -> list[tuple[int, float]]:
    return [
        (r["step"], r["loss"])
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    ]


def _kill_after_first_checkpoint(cmd: list[str], out: Path) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 500
    try:
        while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert latest.exists(), "no checkpoint appeared"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "final").exists(), "the run finished before it could be killed"


def test_killed_run_resumes_to_the_same_weights(tmp_path):
    import torch

    recipe = _recipe(tmp_path)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"

    r = _run(_cmd(recipe, straight))
    assert r.returncode == 0, r.stderr[-3000:]

    _kill_after_first_checkpoint(_cmd(recipe, resumed), resumed)
    done_before = int((resumed / "checkpoints" / "latest").read_text().strip().removeprefix("step"))
    assert 2 <= done_before < NUM_STEPS
    r = _run(_cmd(recipe, resumed))
    assert r.returncode == 0, r.stderr[-3000:]

    a, b = _weights(straight / "final"), _weights(resumed / "final")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), (
        "resumed weights differ from the uninterrupted run"
    )
    init = _weights(straight / "init_model")
    assert any(not torch.equal(a[k], init[k]) for k in a), "training did not change the weights"
    # the loss curve of the resumed run is the uninterrupted one, each step once
    assert _losses(resumed) == _losses(straight)
    assert [s for s, _ in _losses(straight)] == list(range(1, NUM_STEPS + 1))
    assert sorted(p.name for p in (resumed / "checkpoints").glob("step*")) == ["step4", "step6"]

    # the output folder is a HF model with its tokenizer and chat template
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(straight / "final")
    assert tok.chat_template and tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    AutoModelForCausalLM.from_pretrained(straight / "final")

    # rerunning a finished run does nothing; a different recipe for the same folder is refused
    again = _run(_cmd(recipe, straight))
    # rich wraps long lines at the terminal width: compare with whitespace normalised
    assert again.returncode == 0 and "already finished" in " ".join(again.stderr.split())
    changed = _run(_cmd(recipe, straight, "--set", "train.lr=2.0e-3"))
    assert changed.returncode == 2 and "different recipe" in changed.stderr


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

    lora = {"enabled": True, "rank": 4, "alpha": 8}
    recipe = _recipe(tmp_path, num_problems=16, max_steps=4, lr=1.0e-2, lora=lora)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = _run(_cmd(recipe, straight))
    assert r.returncode == 0, r.stderr[-3000:]
    _killed_after_first_checkpoint(straight, resumed)
    r = _run(_cmd(recipe, resumed))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from step 2" in r.stdout

    a, b = _weights(straight / "final"), _weights(resumed / "final")
    init = _weights(straight / "init_model")
    assert a.keys() == init.keys()  # merged: the names of the model without adapters
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    assert any(not torch.equal(a[k], init[k]) for k in a), "training did not change the weights"
    # the frozen base is not in a checkpoint: its module state holds the adapter factors alone
    (states,) = (straight / "checkpoints" / "step4").glob("*model_states.pt")
    keys = list(torch.load(states, weights_only=False)["module"])
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys)
    assert (resumed / "final_adapter" / "adapter_model.safetensors").exists()
