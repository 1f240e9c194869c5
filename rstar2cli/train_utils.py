"""Small helpers shared by the trainers: RNG state capture/restore and checkpoint pruning.

Kept free of torch/deepspeed imports at module level. `rng_state` covers python, numpy and torch
CPU (plus CUDA when present), which is what an exact resume on CPU needs; the model, optimizer and
LR schedule are saved by DeepSpeed itself. Used by the SFT and RL trainers; exercised by
tests/integration/test_sft_resume.py and tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any


def rng_state() -> dict[str, Any]:
    """Every global RNG a training step may draw from."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_tags(ckpt_dir: Path) -> list[Path]:
    """Checkpoint folders named step<N>, oldest first."""
    tags = [p for p in ckpt_dir.glob("step*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(tags, key=lambda p: int(p.name[4:]))


def prune_checkpoints(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step<N> folders."""
    for old in step_tags(ckpt_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def open_run_logs(out: Path, start_step: int, tensorboard: bool) -> tuple[Any, Any]:
    """metrics.jsonl cut back to `start_step` (a resumed run rewrites what came after its
    checkpoint) opened for appending, and a TensorBoard writer purging the same steps (or None)."""
    from rstar2cli.fileio import JsonlAppender, read_jsonl_if_exists, write_jsonl_atomic

    path = out / "metrics.jsonl"
    kept = [r for r in read_jsonl_if_exists(path) if r.get("step", 0) <= start_step]
    write_jsonl_atomic(path, kept)
    writer = None
    if tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tb"), purge_step=start_step + 1)
    return JsonlAppender(path), writer
