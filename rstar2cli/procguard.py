"""Processes this command starts die with it, even when it is killed with SIGKILL.

vLLM starts an engine-core process (and its workers) per engine, and a local Ray instance starts
its own daemons; none of them notices when the command that started them is killed with
`kill -9`, so they would live on under PID 1 holding gigabytes. `guard_descendants()` hands every
process below this one to a guardian: a small separate interpreter (this file as a script) that
asks the kernel for a signal when this process dies (prctl PR_SET_PDEATHSIG) and then kills every
process it was given, with their own descendants. The signal only wakes the guardian: the kernel
sends it whenever the *thread* that is the guardian's parent exits, so several times while a
multi-threaded process dies and even while the process lives on if the thread that started the
guardian ends. The guardian decides by asking whether its parent has changed (getppid), on each
signal and every `WATCH_PERIOD_S`.

Processes are named by (pid, start time), so a pid the system reuses later is never killed. Call
`guard_descendants()` after starting engines or Ray: it registers whatever is new. The guardian
also looks at the whole tree below the command every `WATCH_PERIOD_S` and kills what it saw last
too, so a process started later (a sandbox pool on the first tool call, a helper an engine forks)
is covered without registering it. On a normal exit the guardian finds those processes already
gone (engines are shut down first) and does nothing.

A terminal's Ctrl-C goes to every process of the foreground job, engine cores and their workers
included; each of vLLM's sets its own SIGINT handler and stops on its own, mid-step, logging a
traceback while the command shuts them down in order. `start_deaf_to_sigint(start)` runs `start`
in a thread that blocks SIGINT; the processes it spawns inherit the blocked signal (the mask
survives fork and exec, and a Python handler does not unblock it), so only the command sees
Ctrl-C. They still stop on SIGTERM, which is how they are shut down, except vLLM's workers
(`leave_sigterm_to_the_engine_core`): a SIGTERM to the whole job (`kill -TERM -PGID`, Slurm's
`scancel`) also reaches them, and a worker that died on it mid-step, or while starting, made its
engine core log a traceback. Their engine core handles it, ends its step and stops them in order.

What it does not do: anything on a remote node (Ray kills a dead driver's actors itself), or
handle SIGINT/SIGTERM beyond ending the wait for a start (the commands do). Linux only (/proc,
prctl); elsewhere it does nothing. Tested in tests/unit/test_procguard.py,
tests/integration/test_interrupts.py and test_rl_stage.py (Ctrl-C or SIGTERM while the engine
starts).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_guardian: subprocess.Popen[bytes] | None = None
_guarded: set[tuple[int, int]] = set()
WATCH_PERIOD_S = 1.0  # how often the guardian looks at the tree below the command


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the name (field 3 on), or None if it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # NOTE: the name may hold spaces, brackets and bytes of any encoding; bytes, never text
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields if len(fields) > 19 and fields[1].isdigit() and fields[19].isdigit() else None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat_fields(name)) is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below `pid`, parents before children (from `children`, one look at /proc
    taken by `_children_map`, or a new look)."""
    children = _children_map() if children is None else children
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _tree(root: int, skip: int | None) -> set[tuple[int, int]]:
    """(pid, start time) of every process below `root` but `skip` (the guardian)."""
    return {(p, t) for p in descendants(root) if p != skip and (t := _start_time(p)) is not None}


def guard_descendants() -> None:
    """Register every process now below this one with the guardian, which is started on first
    use (even with nothing below yet: its look at the tree covers what starts later)."""
    global _guardian
    if not sys.platform.startswith("linux"):
        return
    me = os.getpid()
    if _guardian is None or _guardian.poll() is not None:
        _guarded.clear()  # NOTE: a new guardian (the last one died) knows nothing yet
        # NOTE: this very file as a script, isolated (-I -S): the guardian needs the standard
        # library only and starts in ~20 ms
        _guardian = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(me)],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C is not its business
        )
    new = _tree(me, skip=_guardian.pid) - _guarded
    if not new:
        return
    assert _guardian.stdin is not None
    _guardian.stdin.write("".join(f"{p} {t}\n" for p, t in new).encode())
    _guardian.stdin.flush()
    _guarded.update(new)


VLLM_WORKER_PREFIX = "VllmWorker-"  # vLLM's name for its workers' processes (multiproc executor)


def leave_sigterm_to_the_engine_core() -> None:
    """In a vLLM worker's process, ignore SIGTERM; anywhere else, do nothing.

    Called on import of this package (a spawned process imports the parent's main module first,
    so a worker ignores it from a few hundred milliseconds after its start on) and of the worker
    extension (vllm_sync_worker: after vLLM's worker has set its own handler).
    NOTE: a signal sent to the whole job reaches the engine core and its workers at once. vLLM's
    worker raises SystemExit on it wherever it is, and its engine core, still waiting for the
    step or for the worker to start, fails with a traceback. The engine core's own handler ends
    the step first and then shuts its workers down through their parent-death pipe, waiting 5 s
    before it kills them (its SIGTERM in between is ignored too), so the worker need not act on
    the signal itself; if the engine core is killed outright, the same pipe ends the worker."""
    if spawned_as(VLLM_WORKER_PREFIX) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def spawned_as(*prefixes: str) -> bool:
    """Whether multiprocessing started this process under a name beginning with one of
    `prefixes` (vLLM names its engine core and workers)."""
    # NOTE: a spawned process has multiprocessing loaded before its main module; one that has
    # not was not spawned, and `rstar2 --help` is spared the import
    multiprocessing = sys.modules.get("multiprocessing")
    return multiprocessing is not None and multiprocessing.current_process().name.startswith(
        prefixes
    )


def ray_init(**kwargs: Any) -> None:
    """`ray.init(**kwargs)` with the command's signal handling kept: SIGINT and SIGTERM stay the
    command's to handle, and a local instance it starts leaves both to the command.

    NOTE: three things in Ray took a SIGTERM away from the command: `ray.init` replaces the
    SIGTERM handler with one that calls sys.exit(15) (no line, no exit 130); the driver's core
    worker installs Abseil's failure signal handler, which on SIGTERM prints a native stack and
    aborts (exit -6, actors left running); and a SIGTERM sent to the whole job (`kill -TERM
    -PGID`) killed the local instance's GCS and raylet, after which the command waited 60 s for
    them and exited 1. So the handlers the command set are put back, the failure handler is off
    in this process only (Ray's constant, read when the core worker starts; its actors keep
    theirs), and the local instance's processes start with SIGINT and SIGTERM blocked: they
    inherit the mask of the thread that starts them (the calling one, whose mask is restored
    after; not a helper thread, which Ray's processes would die with: Ray ties them to their
    starting thread with PR_SET_PDEATHSIG), so only the command stops them, in order
    (`ray.shutdown`, which kills what a SIGTERM does not stop)."""
    import ray
    import ray._private.ray_constants as ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    stops = (signal.SIGINT, signal.SIGTERM)
    handlers = {sig: signal.getsignal(sig) for sig in stops}
    in_main = threading.current_thread() is threading.main_thread()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(stops))
    try:
        ray.init(**kwargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in handlers.items():
            if in_main and handler is not None:
                signal.signal(sig, handler)


def start_deaf_to_sigint(start: Callable[[], T]) -> T:
    """`start()`, run in a helper thread that blocks SIGINT, so every process it spawns starts with
    SIGINT blocked (see the module's docstring). The calling thread waits for it. A SIGINT or
    SIGTERM meanwhile runs the handler the command set (a stop request is recorded) and then, in
    the main thread, ends the wait with KeyboardInterrupt: a start can take minutes (a large model
    on a GPU) and cannot be cancelled, so it is abandoned, its helper left to a daemon thread, and
    what it started dies with the command (`guard_descendants`). A signal the command ignores
    stays ignored."""
    from multiprocessing import resource_tracker  # NOTE: here: the guardian never needs it

    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            outcome.append((True, start()))
        except BaseException as exc:  # handed to the waiting thread as it is
            outcome.append((False, exc))

    guard_descendants()  # NOTE: the guardian's looks at the tree cover what `start` spawns
    # NOTE: multiprocessing starts its resource tracker on first use with SIGINT and SIGTERM
    # blocked, then *unblocks* both in the starting thread: inside the helper, that would undo
    # its block before the engine's own processes start. Started here first, it is never
    # started there.
    resource_tracker.ensure_running()
    helper = threading.Thread(target=run, name="start-deaf-to-sigint", daemon=True)
    helper.start()
    with _stop_signals_end_the_wait():
        helper.join()
    ok, value = outcome[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


@contextlib.contextmanager
def _stop_signals_end_the_wait() -> Iterator[None]:
    """Within: SIGINT and SIGTERM run the handler the command set, then raise KeyboardInterrupt
    (main thread only; a signal ignored, or left to the system, is left as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum: int, frame: Any) -> None:
        handler = previous[signal.Signals(signum)]
        if callable(handler):
            handler(signum, frame)  # NOTE: the command's own: it may record the stop, or raise
        raise KeyboardInterrupt

    for sig, handler in previous.items():
        if callable(handler):
            signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if callable(handler):
                signal.signal(sig, handler)


# ---------------------------------------------------------------------------------------------
# The guardian process


def _kill_trees(pairs: set[tuple[int, int]]) -> None:
    """Kill each (pid, start time) still alive, with what is below it; one look at /proc for all."""
    children = _children_map()
    for pid, start in pairs:
        if _start_time(pid) != start:
            continue  # gone, or the pid now names another process
        for p in [pid, *descendants(pid, children)]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _serve(parent: int) -> None:
    """Read (pid, start time) lines and look at the tree below `parent` until it dies, then kill
    what the lines name and what the last two looks found."""
    import ctypes
    import select

    # NOTE: no signal handler raises or decides anything: a signal (the parent-death SIGTERM, or
    # a stray one) only wakes the select through the wakeup pipe, and whether the parent is gone
    # is asked of the kernel (getppid) every time round. When it dies the kernel closes the
    # pipe's end, reparents us and signals us in whatever order; each of them wakes the wait.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: None)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    stdin, me = sys.stdin.fileno(), os.getpid()
    guarded: set[tuple[int, int]] = set()
    looks: tuple[set[tuple[int, int]], ...] = (set(), set())  # the tree below parent, last two
    pending = b""  # a line not yet whole
    watched = [stdin, wake_r]
    while os.getppid() == parent:  # already false if it died before the prctl took effect
        ready, _, _ = select.select(watched, [], [], WATCH_PERIOD_S)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if stdin in ready:
            chunk = os.read(stdin, 65536)
            if not chunk:
                watched.remove(stdin)  # the parent is exiting: its death follows
            *lines, pending = (pending + chunk).split(b"\n")
            guarded |= _parse(lines)
        tree = _tree(parent, skip=me)
        if os.getppid() == parent:  # NOTE: a look taken while it died may miss some (reparented)
            looks = (looks[1], tree)
    if stdin in watched:  # what the parent wrote just before it died
        guarded |= _parse(_read_available(stdin, pending).splitlines())
    _kill_trees(guarded | looks[0] | looks[1])


def _parse(lines: list[bytes]) -> set[tuple[int, int]]:
    pairs = (ln.split() for ln in lines if ln.strip())
    return {(int(a), int(b)) for a, b in pairs}


def _read_available(fd: int, data: bytes) -> bytes:
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
