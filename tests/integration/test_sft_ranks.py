"""sft-coldstart on 2 CPU ranks, launched the way the README documents
(`torchrun --nproc_per_node 2 --no-python rstar2 sft-coldstart ...`), under ZeRO-0,
ZeRO-2 and ZeRO-3 (the last with gradient checkpointing and the partitioned model build).

Each run does 2 optimizer steps with a checkpoint, then writes final/ from weights both ranks
gather together. ZeRO-2's and ZeRO-3's final weights equal ZeRO-0's within TOLERANCE per tensor:
|w - w_zero0| (L2) <= TOLERANCE x |w_zero0 - w_init| (L2). fp32, only the order of the gradient
reductions differs; the bound is per tensor, not per element, because Adam's first steps divide
each gradient element by its own magnitude, so an element whose gradient cancels to ~1e-8 moves
by an amount reduction-order noise decides (see tests/integration/test_trainer_ranks.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

TOLERANCE = 1.0e-3
BIN = Path(sys.executable).parent


def _recipe(tmp_path: Path, zero_stage: int) -> Path:
    from rstar2cli.data.synthetic import make_synthetic

    train, _ = make_synthetic("arith", 16, seed=5)
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train))
    recipe = {
        "model": "tiny",
        "data": {"sources": [{"path": str(data), "format": "arith"}], "max_seq_len": 1024},
        "train": {
            "max_steps": 2,
            "global_batch_size": 4,
            "micro_batch_size": 1,
            "lr": 1.0e-3,
            "warmup_ratio": 0.0,
            "zero_stage": zero_stage,
            "gradient_checkpointing": zero_stage == 3,
            "precision": "fp32",
            "seed": 0,
        },
        "checkpoint": {"every_steps": 1, "keep_last": 1},
        "log": {"every_steps": 1, "tensorboard": False},
    }
    path = tmp_path / f"sft_zero{zero_stage}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(recipe: Path, out: Path) -> None:
    cmd = [
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        "--no-python",
        str(BIN / "rstar2"),
        "sft-coldstart",
        "--recipe",
        str(recipe),
        "--out",
        str(out),
    ]
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_two_ranks_zero2_and_zero3_match_zero0(tmp_path):
    runs = {}
    for stage in (0, 2, 3):
        out = tmp_path / f"zero{stage}"
        _launch(_recipe(tmp_path, stage), out)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        assert (out / "checkpoints" / "step2").is_dir()
        runs[stage] = _weights(out / "final")
    init = _weights(tmp_path / "zero0" / "init_model")
    base = runs[0]
    moved = {k: float((base[k] - init[k]).norm()) for k in init}
    assert min(moved.values()) > 0.0, "a tensor did not move"
    for stage in (2, 3):
        assert runs[stage].keys() == base.keys()
        worst = max(float((runs[stage][k] - base[k]).norm()) / moved[k] for k in init)
        assert worst <= TOLERANCE, f"ZeRO-{stage} differs from ZeRO-0 by {worst} of the update"
