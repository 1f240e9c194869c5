"""Shared by the integration tests that run `rstar2` as a user would: a subprocess, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

RSTAR2 = [sys.executable, "-m", "rstar2cli.cli"]
# NOTE: what every trajectory record holds (the rollout core's record), whichever command wrote it
TRAJECTORY_KEYS = frozenset(
    {
        "id",
        "sample",
        "question",
        "answer",
        "prompt_ids",
        "response_ids",
        "loss_mask",
        "text",
        "tool_calls",
        "num_turns",
        "num_answer_tags",
        "finish_reason",
        "extracted",
    }
)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run_cli(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    """`rstar2 ARGS...` in a subprocess with the Hugging Face hub offline; output captured."""
    return subprocess.run(
        [*RSTAR2, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **OFFLINE},
    )


def write_problems(path, num: int = 3) -> list[dict]:
    """The first `num` synthetic arith training problems, written to `path` as jsonl."""
    from rstar2cli.data.synthetic import make_synthetic

    train, _ = make_synthetic("arith", 20, seed=0)
    path.write_text("".join(json.dumps(r) + "\n" for r in train[:num]))
    return train[:num]
