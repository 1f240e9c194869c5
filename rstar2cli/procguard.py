"""Processes this command starts die with it, even when it is killed with SIGKILL.

vLLM starts an engine-core process (and its workers) per engine, and a local Ray instance starts
its own daemons; none of them notices when the command that started them is killed with
`kill -9`, so they would live on under PID 1 holding gigabytes. `guard_descendants()` hands every
process below this one to a guardian: a small separate interpreter (`python -m
rstar2cli.procguard`) that asks the kernel for a signal when this process dies (prctl
PR_SET_PDEATHSIG) and then kills every process it was given, with their own descendants.

Processes are named by (pid, start time), so a pid the system reuses later is never killed. Call
`guard_descendants()` after starting engines or Ray: it registers whatever is new. The guardian
also looks at the whole tree below the command every `WATCH_PERIOD_S` and kills what it saw last
too, so a process started later (a sandbox pool on the first tool call, a helper an engine forks)
is covered without registering it. On a normal exit the guardian finds those processes already
gone (engines are shut down first) and does nothing.

What it does not do: anything on a remote node (Ray kills a dead driver's actors itself), or
handle SIGINT/SIGTERM (the commands do). Linux only (/proc, prctl); elsewhere it does nothing.
Tested in tests/unit/test_procguard.py and tests/integration/test_interrupts.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_guardian: subprocess.Popen[bytes] | None = None
_guarded: set[tuple[int, int]] = set()
WATCH_PERIOD_S = 1.0  # how often the guardian looks at the tree below the command


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and brackets
    return int(fields[19])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before children."""
    children, out, todo = _children_map(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _tree(root: int, skip: int | None) -> set[tuple[int, int]]:
    """(pid, start time) of every process below `root` but `skip` (the guardian)."""
    return {(p, t) for p in descendants(root) if p != skip and (t := _start_time(p)) is not None}


def guard_descendants() -> None:
    """Register every process now below this one with the guardian (started on first use)."""
    global _guardian
    if not sys.platform.startswith("linux"):
        return
    me = os.getpid()
    new = _tree(me, skip=_guardian.pid if _guardian is not None else None) - _guarded
    if not new:
        return
    if _guardian is None or _guardian.poll() is not None:
        # NOTE: this very file as a script, isolated (-I -S): the guardian needs the standard
        # library only and starts in ~20 ms
        _guardian = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(me)],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C is not its business
        )
    assert _guardian.stdin is not None
    _guardian.stdin.write("".join(f"{p} {t}\n" for p, t in new).encode())
    _guardian.stdin.flush()
    _guarded.update(new)


# ---------------------------------------------------------------------------------------------
# The guardian process


def _kill_tree(pid: int, start: int) -> None:
    if _start_time(pid) != start:
        return  # gone, or the pid now names another process
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _ParentDied(Exception):
    pass


def _serve(parent: int) -> None:
    """Read (pid, start time) lines and look at the tree below `parent` until it dies, then kill
    what the lines name and what the last look found."""
    import ctypes

    def on_parent_death(*_: object) -> None:
        raise _ParentDied  # NOTE: raising breaks the blocked wait; a flag would not

    guarded: set[tuple[int, int]] = set()
    seen: set[tuple[int, int]] = set()  # the tree below the parent at the last look
    pending = [b""]  # a line not yet whole
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_parent_death)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the prctl took effect
            raise _ParentDied
        while _read_lines(pending, guarded):
            seen = _tree(parent, skip=os.getpid())
        # the pipe closed: the parent is exiting (or was killed); wait for its death to be sure
        deadline = time.monotonic() + 10.0
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.getppid() == parent:
            return  # it lives on without us: nothing to do
        raise _ParentDied
    except _ParentDied:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        guarded |= _unread_lines(pending[0])  # what the parent wrote just before it died
        for pid, start in guarded | seen:
            _kill_tree(pid, start)


def _read_lines(pending: list[bytes], into: set[tuple[int, int]]) -> bool:
    """Wait up to WATCH_PERIOD_S for lines on stdin and add them to `into`; False: it closed."""
    import select

    fd = sys.stdin.fileno()
    ready, _, _ = select.select([fd], [], [], WATCH_PERIOD_S)
    if not ready:
        return True
    chunk = os.read(fd, 65536)
    if not chunk:
        return False
    *lines, pending[0] = (pending[0] + chunk).split(b"\n")
    into |= _parse(lines)
    return True


def _parse(lines: list[bytes]) -> set[tuple[int, int]]:
    pairs = (ln.split() for ln in lines if ln.strip())
    return {(int(a), int(b)) for a, b in pairs}


def _unread_lines(pending: bytes) -> set[tuple[int, int]]:
    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)
    data = pending
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return _parse(data.splitlines())


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
