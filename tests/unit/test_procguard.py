"""procguard: what a command started dies with it, even under SIGKILL; nothing else is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from rstar2cli import procguard

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from rstar2cli import procguard
    child = subprocess.Popen(["sleep", "300"])
    tree = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])  # a grandchild too
    time.sleep(0.3)
    procguard.guard_descendants()
    print(" ".join(map(str, procguard.descendants(procguard.os.getpid()))), flush=True)
    time.sleep(300)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_children_and_grandchildren_die_when_the_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        sleepers = [p for p in pids if open(f"/proc/{p}/comm").read().strip() == "sleep"]
        assert len(sleepers) == 2 and all(_alive(p) for p in pids)
        parent.kill()  # SIGKILL: no cleanup code of the parent runs
        parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in sleepers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in sleepers)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)


LATE = textwrap.dedent(
    """
    import subprocess, sys, time
    from rstar2cli import procguard
    early = subprocess.Popen(["sleep", "300"])
    time.sleep(0.3)
    procguard.guard_descendants()
    late = subprocess.Popen(["sleep", "301"])  # never registered
    time.sleep(3 * procguard.WATCH_PERIOD_S)  # the guardian has looked at the tree since
    print(early.pid, late.pid, flush=True)
    time.sleep(300)
    """
)


def test_a_process_started_after_registering_dies_too():
    parent = subprocess.Popen(
        [sys.executable, "-c", LATE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        early, late = (int(p) for p in parent.stdout.readline().split())
        assert _alive(early) and _alive(late)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while (_alive(early) or _alive(late)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(early) and not _alive(late)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)


def test_a_reused_pid_is_never_killed():
    other = subprocess.Popen(["sleep", "30"])
    try:
        start = procguard._start_time(other.pid)
        assert start is not None
        procguard._kill_tree(other.pid, start + 1)  # the same pid, another process's start time
        time.sleep(0.2)
        assert other.poll() is None
        procguard._kill_tree(other.pid, start)
        assert other.wait(timeout=5) == -signal.SIGKILL
    finally:
        if other.poll() is None:
            other.kill()
