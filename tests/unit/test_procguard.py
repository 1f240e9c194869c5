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


THREADED = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    from rstar2cli import procguard
    child = subprocess.Popen(["sleep", "300"])
    procguard.guard_descendants()
    for _ in range(64):  # as an engine-running command has: each one's exit re-sends the signal
        threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
    print(child.pid, flush=True)
    time.sleep(300)
    """
)


def test_a_multi_threaded_parent_killed_again_and_again_never_leaves_its_child():
    # NOTE: a dying process's threads exit one by one and each exit re-sends the guardian its
    # parent-death signal, microseconds apart; a guardian that acted on the signal itself died of
    # the second one now and then (a few runs in a hundred), leaving the child alive
    for _ in range(10):
        parent = subprocess.Popen(
            [sys.executable, "-c", THREADED],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            child = int(parent.stdout.readline())
            parent.kill()
            parent.wait()
            deadline = time.monotonic() + 10
            while _alive(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(child)
        finally:
            if _alive(child):
                os.kill(child, signal.SIGKILL)


STRAY = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from rstar2cli import procguard
    child = subprocess.Popen(["sleep", "300"])
    procguard.guard_descendants()
    if os.fork() == 0:  # a forked child holds the guardian's pipe open after the parent dies
        time.sleep(300)
    print(child.pid, procguard._guardian.pid, flush=True)
    time.sleep(300)
    """
)


def test_stray_signals_never_make_the_guardian_act_and_an_open_pipe_never_stops_it():
    parent = subprocess.Popen(
        [sys.executable, "-c", STRAY], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        child, guardian = (int(p) for p in parent.stdout.readline().split())
        deadline = time.monotonic() + 10
        while not _catches(guardian, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.02)  # it is set up (before that, SIGTERM's default would end it)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):  # the parent lives on
            os.kill(guardian, sig)
        time.sleep(1.5 * procguard.WATCH_PERIOD_S)
        assert _alive(child) and _alive(guardian)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the forked child, and the parent if still there


def _catches(pid: int, sig: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    return bool(caught >> (sig - 1) & 1)


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
