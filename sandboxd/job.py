"""One job in one slot: fork a sandboxed child, feed and drain it, kill its tree, reap, wipe.

What it does: `run_job` is the per-job logic shared by a slot's two runners (see
`sandboxd.zygote`): the zygote (math stack preloaded) and the light runner (standard library
only). Both call it with the same request and get the same result dict back. The caller passes
`kill_tree`, because only it knows the safe way to kill every process of the job where it runs:
`tree_killer` gives the zygote's; the light runner asks its zygote. Limits are the kernel's:
rlimits, uid and seccomp are in place before the snippet's first line runs. RLIMIT_AS bounds
each process; `MemoryWatch` bounds the job's processes together (polled every
`MEMORY_CHECK_S`). After the job, `wipe` empties the slot's tmpfs and `_make_scratch` makes
the next job's scratch dir without following anything the last job left.

What it does not: no framing, no routing between runners, no namespaces or mounts
(sandboxd.zygote, sandboxd.isolation).

Tested through a real daemon in tests/sandboxd/ (both runners, hostile snippets included;
test_no_namespaces.py on a host that refuses namespaces).
"""

from __future__ import annotations

import os
import re
import select
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandboxd import isolation, runner
from sandboxd.isolation import JobLimits

EXIT_SETUP_FAILED = 121
_MEMORY_RE = re.compile(r"^[\w.]*MemoryError\b")
_REAP_BOUND_S = 2.0
JOB_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass
class SlotInfo:
    """What a runner needs to know about its slot to run jobs there (plain data: sent to L)."""

    index: int
    uid: int  # the slot's job uid (used in the root modes only)
    mode: str  # Layers.mode
    pid_namespace: bool
    scratch: str  # the job's cwd, HOME and TMPDIR
    private_tmp: bool  # scratch lies on the slot's private tmpfs, which is wiped whole per job
    protected: list[str]  # interpreter dirs bound back inside that tmpfs: never wiped
    memory_mb: int
    max_procs: int
    disk_mb: int
    max_output_bytes: int
    base_vm: int = 0  # the calling runner's own VmSize: jobs may add memory_mb on top of it


def vm_size_bytes() -> int:
    return _status_kb("VmSize") * 1024


def prepare_runner(slot: SlotInfo) -> None:
    """Give the calling runner the jobs' environment and SIGXFSZ disposition once, for all jobs.

    NOTE: the runner never reads its environment again; L is exec'd with its own.
    """
    os.environ.clear()
    os.environ.update(JOB_ENV, HOME=slot.scratch, TMPDIR=slot.scratch)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes raise OSError instead
    runner.prepare_streams()


def uid_killing(slot: SlotInfo) -> bool:
    """Whether jobs of this slot are killed by uid (see `isolation.signal_uid`)."""
    return slot.mode == "root" and slot.pid_namespace


def tree_killer(slot: SlotInfo) -> Callable[[int], None]:
    """The zygote's way to kill a job's whole tree, setsid'd grandchildren included."""
    if uid_killing(slot):
        return lambda pid: _kill_by_uid(pid, slot.uid)
    if os.getpid() == 1:
        return _kill_as_init
    return _kill_descendants


def _kill_by_uid(pid: int, uid: int) -> None:
    # NOTE: the job process itself first: until its setresuid it still runs as root.
    kill_quietly(pid)
    isolation.signal_uid(uid, signal.SIGKILL)


def _kill_as_init(pid: int) -> None:
    # NOTE: kill(-1) is only safe from PID 1 of the slot's own namespace: it reaches every process
    # in it but never the caller (and nothing outside). Used when jobs share the zygote's uid.
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


# NOTE: how long `_kill_descendants` goes on finding processes of a killed job still alive
_KILL_BOUND_S = 2.0


def _kill_descendants(pid: int) -> None:
    """Kill every process below the calling zygote (a child subreaper outside a PID namespace,
    so the job's orphans, setsid'd or not, are there too): job process `pid` first, then passes
    over the tree until one finds nothing alive (what a process forked while a pass went by is
    found by the next one; a killed process forks no more).

    NOTE: without a PID namespace the pids read from /proc are the host's, and one may be
    reused by an unrelated process between reading it and signalling it. Each is signalled
    through a pidfd opened first, and only once /proc shows its parent to be the caller or the
    process it was found under, that one still alive (so its pid was not reused either)."""
    kill_quietly(pid)  # NOTE: our child: its pid is ours until we reap it
    end = time.monotonic() + _KILL_BOUND_S
    while _kill_pass() and time.monotonic() < end:
        time.sleep(0.001)


def _kill_pass() -> int:
    """SIGKILL every live process below the caller it can be sure of; -> how many it signalled."""
    me, signalled = os.getpid(), 0
    todo: list[tuple[int, int | None]] = [(me, None)]  # (pid, its pidfd; None for the caller)
    held: list[int] = []
    try:
        while todo:
            parent, parent_fd = todo.pop()
            for child in _children_of(parent):
                try:
                    fd = os.pidfd_open(child)
                except OSError:
                    continue  # gone already
                held.append(fd)
                up = _parent_of(child)
                ours = up == me or (up == parent and parent_fd is not None and _alive(parent_fd))
                if not ours or not _alive(fd):
                    continue  # not ours for certain, or dead (a zombie's children are ours)
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    signalled += 1
                except ProcessLookupError:
                    pass
                todo.append((child, fd))
    finally:
        for fd in held:
            os.close(fd)
    return signalled


def descendants(skip: int | None = None) -> set[int]:
    """The pids below the calling runner (its slot's PID 1 or a child subreaper: a job's
    orphans are among them), leaving out `skip` and what lies below it."""
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for child in _children_of(todo.pop()):
            if child != skip and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _children_of(pid: int) -> list[int]:
    """The children of every thread of process `pid`; [] once it is gone."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pidfd: int) -> bool:
    """Whether the process behind `pidfd` has not exited (a pidfd turns readable when it does)."""
    return not select.select([pidfd], [], [], 0)[0]


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_job(
    request: dict[str, Any],
    slot: SlotInfo,
    kill_tree: Callable[[int], None],
    spare_pid: int | None = None,
    install_sigint: bool = True,
) -> dict[str, Any]:
    """Run one request; `spare_pid` is a child of the caller that is not part of any job.

    `install_sigint`: give the job Python's SIGINT handler (KeyboardInterrupt), for a runner that
    has none itself. NOTE: the zygote must have none (see `isolation.signal_uid`).
    """
    timeout_s = float(request["timeout_s"])
    limits = JobLimits(
        cpu_s=int(timeout_s) + 1,
        address_space_bytes=slot.base_vm + slot.memory_mb * 2**20,
        max_procs=slot.max_procs,
        max_file_bytes=slot.disk_mb * 2**20,
    )
    _make_scratch(slot)
    watch = _memory_watch(slot, spare_pid)
    compiled = runner.precompile(request["code"])
    pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, ready
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child_main(
                code=request["code"],
                compiled=compiled,
                slot=slot,
                pipes=pipes,
                limits=limits,
                install_sigint=install_sigint,
            )
        finally:
            os._exit(EXIT_SETUP_FAILED)  # NOTE: a job process never returns into a runner's loop
    for i, (r, w) in enumerate(pipes):
        os.close(r if i == 0 else w)
    try:
        outcome = _pump(
            pid=pid,
            pipes=pipes,
            stdin=request.get("stdin", "").encode("utf-8", "replace"),
            timeout_s=timeout_s,
            max_output_bytes=slot.max_output_bytes,
            start=start,
            kill_tree=kill_tree,
            spare_pid=spare_pid,
            watch=watch,
        )
    finally:
        wipe(slot)
    return _classify(outcome, limits)


def _make_scratch(slot: SlotInfo) -> None:
    """Create the job's scratch dir afresh. Nothing the last job left at that path is followed:
    a symlink there (to /var/tmp, say) would otherwise have the runner, as root, chown its
    target to the job's uid."""
    try:
        st = os.lstat(slot.scratch)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(slot.scratch)
    if st is None or not stat.S_ISDIR(st.st_mode):
        os.mkdir(slot.scratch, 0o700)
    if slot.mode.startswith("root"):
        os.chown(slot.scratch, slot.uid, slot.uid, follow_symlinks=False)


def wipe(slot: SlotInfo) -> None:
    """Remove everything the job wrote: the whole private tmpfs, or else its scratch dir."""
    if not slot.private_tmp:
        _remove(slot.scratch)
        return
    keep = set(slot.protected)
    for top in isolation.TMPFS_DIRS:
        clear_dir(top, keep)


def _remove(path: str) -> None:
    """Remove `path`: a directory with all it holds, or a file or symlink (never followed)."""
    try:
        is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
        if is_dir:
            clear_dir(path, set())
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def clear_dir(top: str, keep: set[str]) -> None:
    """Empty the directory `top`, leaving its entries whose paths are in `keep` (and what cannot
    be removed).

    A job may leave anything behind, so this walks without recursion (directories nested
    thousands deep overflow a recursive walk, and its path strings pass PATH_MAX), holds one
    directory fd at a time (climbing back by "..", so depth costs no fds), never follows a
    symlink, and never enters another mount (a bind mount of the interpreter, say).
    Directories a job made unreadable are opened up first. Runs once the job's processes are
    dead, so nothing changes under it."""
    try:
        fd = os.open(top, _DIR_FLAGS)
    except OSError:
        return
    dev = os.fstat(fd).st_dev
    # from `top` down to the directory `fd` is: (entered name, names stuck in its parent)
    path: list[tuple[str, set[str]]] = []
    # entries of the current directory left in place (at `top`: from the start, the kept ones)
    stuck = {os.path.basename(k) for k in keep if os.path.dirname(k) == top.rstrip("/")}
    while True:
        child = _next_subdir(fd, dev, stuck)
        if child is not None:
            try:
                inner = _open_dir(child, fd)
            except OSError:
                stuck.add(child)
                continue
            os.close(fd)
            fd = inner
            path.append((child, stuck))
            stuck = set()
            continue
        if not path:  # back at `top`, emptied as far as it goes
            os.close(fd)
            return
        name, stuck = path.pop()
        parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
        os.close(fd)
        fd = parent
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            stuck.add(name)


def _next_subdir(fd: int, dev: int, stuck: set[str]) -> str | None:
    """Unlink the files and symlinks of directory `fd` not in `stuck`; return one subdirectory
    to enter next (None: none left). Other mounts and what fails to unlink go into `stuck`."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.name in stuck:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(entry.name, dir_fd=fd)
                    continue
            except OSError:
                stuck.add(entry.name)
                continue
            if st.st_dev != dev:
                stuck.add(entry.name)
                continue
            return entry.name
    return None


def _open_dir(name: str, dir_fd: int) -> int:
    """Open subdirectory `name` of `dir_fd`, making it readable first if a job locked it."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _child_main(
    code: str,
    compiled: runner.Compiled | None,
    slot: SlotInfo,
    pipes: list[tuple[int, int]],
    limits: JobLimits,
    install_sigint: bool,
) -> None:
    """In the forked job process: wire fds, sandbox itself, signal readiness, run. Never returns."""
    try:
        os.setsid()
        for target, fd in enumerate([pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]):
            os.dup2(fd, target)
        os.closerange(4, 1 << 16)
        os.chdir(slot.scratch)
        if install_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        isolation.enter_job_sandbox(limits, slot.mode, slot.uid)
        os.write(3, b"1")
        os.close(3)
    except BaseException as exc:  # noqa: BLE001 - anything here is the sandbox's fault
        os.write(2, f"sandboxd: job setup failed: {exc!r}\n".encode())
        os._exit(EXIT_SETUP_FAILED)
    os._exit(runner.run(code, compiled))


# NOTE: how often a running job's memory is summed over its processes (`MemoryWatch`)
MEMORY_CHECK_S = 0.1


@dataclass
class MemoryWatch:
    """The memory of a job's processes together, against its limit.

    RLIMIT_AS bounds each process, but a job may run up to `max_procs` of them: 64 x 1 GB.
    Every process of a job lies below its runner, however it forked or setsid'd: the runner is
    its slot's PID 1 or a child subreaper, so orphans come to it. Their private memory (what a
    fork from the warm runner has written, from /proc/PID/smaps_rollup) is summed over the
    runner's tree less its spare runner `spare_pid` (and what that runs), and the job killed
    once it passes memory_mb plus the runner's own resident size (a forked child may write to at
    most that much of what it shares with its runner).
    """

    spare_pid: int | None
    limit_bytes: int

    def used_bytes(self) -> int:
        return sum(_private_bytes(str(pid)) for pid in descendants(skip=self.spare_pid))


def _memory_watch(slot: SlotInfo, spare_pid: int | None) -> MemoryWatch:
    """The watch for a job of this runner's."""
    return MemoryWatch(spare_pid, slot.memory_mb * 2**20 + _status_kb("VmRSS") * 1024)


def _private_bytes(pid: str) -> int:
    """Memory process `pid` alone holds (private resident + swapped); its whole resident size
    if that cannot be read; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            kb = sum(
                int(line.split()[1])
                for line in f
                if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Swap:"))
            )
        return kb * 1024
    except PermissionError:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0
    except (OSError, ValueError):
        return 0


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _pump(
    pid: int,
    pipes: list[tuple[int, int]],
    stdin: bytes,
    timeout_s: float,
    max_output_bytes: int,
    start: float,
    kill_tree: Callable[[int], None],
    spare_pid: int | None,
    watch: MemoryWatch | None = None,
) -> dict[str, Any]:
    """Feed stdin, drain outputs with a cap, wait for exit or deadline (and, with `watch`, for
    the job's processes together to stay within their memory); kill the tree, reap."""
    stdin_w, out_r, err_r, ready_r = pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]
    os.set_blocking(stdin_w, False)
    # NOTE: the ready pipe is read once the job is over, so that it wakes us one time less.
    bufs = {out_r: bytearray(), err_r: bytearray()}
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    for fd in bufs:
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    if stdin:
        poller.register(stdin_w, select.POLLOUT)
    else:
        os.close(stdin_w)
    open_fds = set(bufs) | {pidfd} | ({stdin_w} if stdin else set())
    deadline = start + timeout_s
    timed_out = over_limit = over_memory = exited = False
    sent = 0
    next_check = start + MEMORY_CHECK_S
    while not exited:
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0:
            timed_out = True
            break
        if watch is not None:
            if now >= next_check:
                next_check = now + MEMORY_CHECK_S
                if watch.used_bytes() > watch.limit_bytes:
                    over_memory = True
                    break
            remaining = min(remaining, next_check - now)
        for fd, _ev in poller.poll(remaining * 1000):
            if fd == pidfd:
                exited = True
            elif fd == stdin_w:
                try:
                    sent += os.write(stdin_w, stdin[sent : sent + 65536])
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    sent = len(stdin)  # the snippet closed its stdin; the rest is dropped
                if sent >= len(stdin):
                    poller.unregister(stdin_w)
                    os.close(stdin_w)
                    open_fds.discard(stdin_w)
            else:
                _read_into(fd, bufs, poller, open_fds)
                if len(bufs[out_r]) + len(bufs[err_r]) > max_output_bytes:
                    over_limit = True
                    exited = True
    status_word, cpu_s = _kill_and_reap(pid, kill_tree, spare_pid)
    duration_s = time.monotonic() - start
    _drain(bufs, poller, open_fds, pidfd)
    for fd in open_fds:
        os.close(fd)
    return {
        "status_word": status_word,
        "rusage_cpu_s": cpu_s,
        "duration_s": duration_s,
        "stdout": bytes(bufs[out_r]),
        "stderr": bytes(bufs[err_r]),
        "ready": _was_ready(ready_r),
        "timed_out": timed_out,
        "over_limit": over_limit,
        "over_memory": over_memory,
        "max_output_bytes": max_output_bytes,
    }


def _read_into(
    fd: int, bufs: dict[int, bytearray], poller: select.poll, open_fds: set[int]
) -> bool:
    """Read what `fd` holds (closing it at EOF); False if it had nothing ready yet."""
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return False
    if data:
        bufs[fd] += data
    else:
        poller.unregister(fd)
        os.close(fd)
        open_fds.discard(fd)
    return True


def _drain(bufs: dict[int, bytearray], poller: select.poll, open_fds: set[int], pidfd: int) -> None:
    """After the tree is dead, collect what is still buffered in the pipes (bounded)."""
    poller.unregister(pidfd)
    for fd in list(bufs):
        if fd in open_fds:
            os.set_blocking(fd, False)
    end = time.monotonic() + 1.0
    while time.monotonic() < end and any(fd in open_fds for fd in bufs):
        for fd in [f for f in bufs if f in open_fds]:
            if len(bufs[fd]) > (1 << 26):
                poller.unregister(fd)
                os.close(fd)
                open_fds.discard(fd)
                continue
            if not _read_into(fd, bufs, poller, open_fds):
                time.sleep(0.001)  # NOTE: only while a pipe is still open but empty


def _was_ready(ready_r: int) -> bool:
    """Whether the job process got as far as running the snippet (it writes "1" just before)."""
    os.set_blocking(ready_r, False)
    try:
        return os.read(ready_r, 1) == b"1"
    except BlockingIOError:
        return False
    finally:
        os.close(ready_r)


def _kill_and_reap(
    pid: int, kill_tree: Callable[[int], None], spare_pid: int | None
) -> tuple[int, float]:
    """Kill the job's tree, reap the job process and its orphans; -> (wait status, CPU seconds)."""
    kill_tree(pid)
    try:
        _, status, rusage = os.wait4(pid, 0)
        got = status, rusage.ru_utime + rusage.ru_stime
    except ChildProcessError:
        got = 0, 0.0
    reap_orphans(spare_pid)
    return got


def reap_orphans(spare_pid: int | None) -> None:
    """Reap children until none but `spare_pid` is left (bounded in time).

    NOTE: the caller is the slot's PID 1 or a child subreaper, so every process of a killed job
    is or becomes its child: an orphan is reparented to it before its own parent is reaped. No
    child left (but the spare) therefore means the job's whole tree is gone.
    """
    end = time.monotonic() + _REAP_BOUND_S
    while time.monotonic() < end:
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if reaped == 0:
            if spare_pid is not None and _children() <= {spare_pid}:
                return
            time.sleep(0.001)


def tree_gone(pid: int) -> bool:
    """Whether job process `pid` (our child) has exited and left no other process behind.

    NOTE: the caller must be a child subreaper or its slot's PID 1 (see `reap_orphans`). A job's
    process that outlives its parent is then reparented to us before that parent turns zombie, so
    with the job process a zombie, any process of the job still alive has an ancestor in our
    children list; the list holding nothing but the zombie means nothing is left to kill.
    """
    try:
        exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return exited is not None and _children() == {pid}


def _children() -> set[int]:
    return set(_children_of(os.getpid()))


def _decode(data: bytes, limit: int) -> str:
    return data[:limit].decode("utf-8", errors="replace")


def _classify(o: dict[str, Any], limits: JobLimits) -> dict[str, Any]:
    status_word = o["status_word"]
    if os.WIFSIGNALED(status_word):
        exit_code: int | None = -os.WTERMSIG(status_word)
    else:
        exit_code = os.WEXITSTATUS(status_word)
    stderr = _decode(o["stderr"], o["max_output_bytes"])
    last_line = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    cpu_killed = (
        exit_code in (-signal.SIGXCPU, -signal.SIGKILL) and o["rusage_cpu_s"] >= limits.cpu_s - 0.05
    )
    if o["over_limit"]:
        status = "output_limit"
    elif o["over_memory"]:
        status = "memory"
    elif o["timed_out"] or cpu_killed:
        status = "timeout"
    elif not o["ready"]:
        status, stderr = "sandbox_error", "job process failed before running the snippet: " + stderr
    elif exit_code == 0:
        status = "ok"
    elif _MEMORY_RE.match(last_line):
        status = "memory"
    else:
        status = "error"
    if status in ("timeout", "output_limit", "memory") and exit_code == -signal.SIGKILL:
        exit_code = None  # killed by us, not a code the snippet chose
    return {
        "status": status,
        "stdout": _decode(o["stdout"], o["max_output_bytes"]),
        "stderr": stderr,
        "exit_code": exit_code,
        "duration_s": round(o["duration_s"], 6),
    }
