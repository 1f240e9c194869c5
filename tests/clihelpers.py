"""Shared by the integration tests that run `rstar2` as a user would: a subprocess, offline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def run_rows(
    argv: list[str], out: Path, *, timeout: float, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run a script that writes one JSON line per stage to `out` (the GPU scripts): the finished
    process and the rows it wrote."""
    proc = subprocess.run(
        [sys.executable, *argv, "--out", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, [json.loads(line) for line in out.read_text().splitlines()]


def write_problems(path, num: int = 3) -> list[dict]:
    """The first `num` synthetic arith training problems, written to `path` as jsonl."""
    from rstar2cli.data.synthetic import make_synthetic

    train, _ = make_synthetic("arith", 20, seed=0)
    path.write_text("".join(json.dumps(r) + "\n" for r in train[:num]))
    return train[:num]


def rows_written(out: Path) -> int:
    """Rows on disk while a command still appends to `out`: only lines with their newline count
    (the last one may be half written, even mid-character)."""
    return out.read_bytes().count(b"\n") if out.exists() else 0


def kill_9_alone(proc: subprocess.Popen, wait_s: float = 30.0) -> tuple[list[str], list[str]]:
    """`kill -9` of the command alone (not its group), as a user or a scheduler does it.

    Returns the command lines of the processes below it then, and of those still alive `wait_s`
    later: none, if rstar2cli.procguard did its work.
    """
    from rstar2cli.procguard import descendants

    below = descendants(proc.pid)
    names = [cmdline(p) for p in below]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return names, [cmdline(p) for p in wait_dead(below, wait_s)]


def wait_dead(pids: list[int], wait_s: float) -> list[int]:
    """Those of `pids` still alive after up to `wait_s` of waiting for them to die."""
    deadline = time.monotonic() + wait_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def end_group(proc: subprocess.Popen) -> None:
    """Kill what is left of a command started with start_new_session=True (a failed test's)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:300].replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead


def signal_set(pid: int, field: str) -> set[int]:
    """The signals in `field` ("SigBlk", "SigIgn", ...) of /proc/PID/status; empty once gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    mask = int(next(ln for ln in status.splitlines() if ln.startswith(field + ":")).split()[1], 16)
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}
