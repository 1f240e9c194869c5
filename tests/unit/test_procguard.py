"""procguard: what a command started dies with it, even under SIGKILL; nothing else is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from clihelpers import alive, end_group, signal_set, wait_dead

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


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    """A parent running `script` (with `args`), in a process group of its own with what it
    starts."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _kill_and_wait(parent: subprocess.Popen[str], pids: list[int]) -> list[int]:
    """SIGKILL the parent (none of its cleanup code runs); those of `pids` alive 10 s later."""
    parent.kill()
    parent.wait()
    return wait_dead(pids, 10.0)


def test_children_and_grandchildren_die_when_the_parent_is_killed():
    parent = _start(PARENT)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        sleepers = [p for p in pids if open(f"/proc/{p}/comm").read().strip() == "sleep"]
        assert len(sleepers) == 2 and all(alive(p) for p in pids)
        assert _kill_and_wait(parent, sleepers) == []
    finally:
        end_group(parent)


LATE = textwrap.dedent(
    """
    import subprocess, sys, time
    from rstar2cli import procguard
    procguard.guard_descendants()  # nothing below yet
    late = subprocess.Popen(["sleep", "301"])  # never registered
    time.sleep(3 * procguard.WATCH_PERIOD_S)  # the guardian has looked at the tree since
    print(late.pid, flush=True)
    time.sleep(300)
    """
)


def test_a_process_started_after_registering_dies_too():
    parent = _start(LATE)
    try:
        late = int(parent.stdout.readline())
        assert alive(late)
        assert _kill_and_wait(parent, [late]) == []
    finally:
        end_group(parent)


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
        parent = _start(THREADED)
        try:
            child = int(parent.stdout.readline())
            assert _kill_and_wait(parent, [child]) == []
        finally:
            end_group(parent)


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
    parent = _start(STRAY)
    try:
        child, guardian = (int(p) for p in parent.stdout.readline().split())
        deadline = time.monotonic() + 10
        while not _catches(guardian, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.02)  # it is set up (before that, SIGTERM's default would end it)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):  # the parent lives on
            os.kill(guardian, sig)
        time.sleep(1.5 * procguard.WATCH_PERIOD_S)
        assert alive(child) and alive(guardian)
        assert _kill_and_wait(parent, [child]) == []
    finally:
        end_group(parent)  # the forked child too


NORMAL = textwrap.dedent(
    """
    import subprocess, sys
    from rstar2cli import procguard
    child = subprocess.Popen(["sleep", "300"])
    procguard.guard_descendants()
    print(procguard._guardian.pid, flush=True)
    child.kill()
    child.wait()
    """
)


def test_after_a_normal_exit_the_guardian_leaves_too():
    parent = _start(NORMAL)
    try:
        guardian = int(parent.stdout.readline())
        assert parent.wait(timeout=30) == 0
        assert wait_dead([guardian], 10.0) == []
    finally:
        end_group(parent)


def _catches(pid: int, sig: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    return bool(caught >> (sig - 1) & 1)


def test_a_reused_pid_is_never_killed():
    other = subprocess.Popen(["sleep", "30"])
    try:
        start = procguard._start_time(other.pid)
        assert start is not None
        procguard._kill_trees({(other.pid, start + 1)})  # the same pid, another start time
        time.sleep(0.2)
        assert other.poll() is None
        procguard._kill_trees({(other.pid, start)})
        assert other.wait(timeout=5) == -signal.SIGKILL
    finally:
        if other.poll() is None:
            other.kill()


DEAF = textwrap.dedent(
    """
    import multiprocessing, signal, subprocess, sys, time
    from rstar2cli import procguard
    signal.signal(signal.SIGINT, lambda *_: print("parent got SIGINT", flush=True))
    def start():  # as vLLM starts its engine core: the process's first use of multiprocessing
        proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(300,))
        proc.start()
        return proc
    if __name__ == "__main__":
        deaf = procguard.start_deaf_to_sigint(start)
        plain = subprocess.Popen(["sleep", "300"])
        try:
            procguard.start_deaf_to_sigint(lambda: 1 / 0)
        except ZeroDivisionError:
            print("raised", flush=True)
        blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        print(deaf.pid, plain.pid, blocked, flush=True)
        time.sleep(300)
    """
)


def test_processes_started_deaf_to_sigint_outlive_a_ctrl_c_that_the_command_still_gets():
    parent = _start(DEAF)
    try:
        assert parent.stdout.readline().strip() == "raised"  # start's error reaches the caller
        deaf, plain, blocked = parent.stdout.readline().split()
        assert blocked == "False"  # only the helper thread blocked it
        os.killpg(parent.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
        assert parent.stdout.readline().strip() == "parent got SIGINT"
        assert wait_dead([int(plain)], 10.0) == []  # sleep dies of SIGINT by default
        time.sleep(0.5)
        assert alive(int(deaf))
        assert signal.SIGINT in signal_set(int(deaf), "SigBlk")
        assert _kill_and_wait(parent, [int(deaf)]) == []  # and it still dies with the command
    finally:
        end_group(parent)


WAIT = textwrap.dedent(
    """
    import signal, sys, time
    from rstar2cli import procguard
    if sys.argv[1] == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, lambda *_: print("recorded", flush=True))
    print("waiting", flush=True)
    try:
        print(procguard.start_deaf_to_sigint(lambda: time.sleep(3) or "finished"), flush=True)
    except KeyboardInterrupt:
        print("abandoned", flush=True)
    """
)


def test_a_stop_signal_ends_the_wait_for_a_start_unless_the_command_ignores_it():
    """A start cannot be cancelled and may take minutes: SIGINT runs the command's handler and
    then abandons the wait; a command that ignores SIGINT waits the start out."""
    for mode, expected in (("handled", ["recorded", "abandoned"]), ("ignored", ["finished"])):
        proc = _start(WAIT, mode)
        try:
            assert proc.stdout.readline().strip() == "waiting"
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=20)
        finally:
            end_group(proc)
        assert out.split() == expected, (mode, out)


# Like the `rstar2` script: the CLI imported at top level, so a spawned child imports it first.
SPAWNER = textwrap.dedent(
    """
    import multiprocessing, signal, sys

    from rstar2cli.cli import main  # noqa: F401

    def report(queue):
        queue.put(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        for name in sys.argv[1:]:
            child = ctx.Process(target=report, args=(queue,), name=name)
            child.start()
            print(name, queue.get(timeout=60), flush=True)
            child.join()
    """
)


def test_only_a_vllm_worker_process_ignores_sigterm_from_its_start(tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    names = ["VllmWorker-0", "EngineCore", "SpawnProcess-3"]
    out = subprocess.run(
        [sys.executable, str(script), *names], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "VllmWorker-0 True",
        "EngineCore False",
        "SpawnProcess-3 False",
    ]
