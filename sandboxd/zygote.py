"""The process side of the pool: fork server, per-slot zygote, and the job child.

Process tree (each arrow is a fork, none is an exec of user-controlled code):
  daemon --exec--> fork server (clean environment, math stack imported once)
     --> slot process S (unshares the slot's namespaces) --> zygote Z (PID 1 of the slot)
        --> one job child per job (sandboxed, runs the snippet, exits)
Z receives jobs on a stream socket (4-byte length + JSON), feeds stdin, drains stdout/stderr
continuously with a cap, enforces the wall-clock timeout, kills the job's whole process tree
(`kill(-1)` from PID 1 of the slot's own PID namespace, never elsewhere), reaps zombies, wipes the
slot's private tmpfs, and answers with one status.

What it does not: no asyncio, no HTTP (see `sandboxd.pool` / `sandboxd.server`). The fork server
is started with a scrubbed environment and only its socket as an open fd, so nothing the daemon
holds (environment, sockets, memory) is reachable from a snippet.

Tested through a real daemon in tests/sandboxd/.
"""

from __future__ import annotations

import gc
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import sys
import time
from dataclasses import asdict
from typing import Any

from sandboxd import isolation, runner
from sandboxd.isolation import JobLimits, Layers

DEFAULT_PRELOAD = (
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "functools",
    "collections",
    "statistics",
    "random",
    "re",
    "json",
    "heapq",
    "bisect",
    "string",
    "numpy",
    "numpy.random",
    "sympy",
)
# Run once in the fork server so the lazy imports and caches these touch are warm in every child.
WARMUP = {
    "sympy": (
        "import sympy as sp\nx, y = sp.symbols('x y')\nsp.factor(x**4 - 1); sp.solve(x**2 - 5*x + 6, x)\n"
        "sp.simplify(sp.sin(x)**2 + sp.cos(x)**2); sp.expand((x + y)**3); sp.integrate(x**2, x)\n"
        "sp.Rational(1, 3) + sp.sqrt(8); sp.isprime(97); sp.factorint(360); sp.nsimplify(0.5)\n"
        "sp.Matrix([[1, 2], [3, 4]]).det(); sp.binomial(10, 3); sp.N(sp.pi, 20); sp.latex(x**2)\n"
        "sp.limit(sp.sin(x) / x, x, 0); sp.diff(sp.exp(x) * x, x); sp.series(sp.exp(x), x, 0, 3)\n"
    ),
    "numpy": "import numpy as np\na = np.arange(16.0).reshape(4, 4)\n(a @ a.T).trace(); np.linalg.det(a + np.eye(4)); np.linalg.solve(a + np.eye(4), np.ones(4))\n",
}
EXIT_SETUP_FAILED = 121
_MEMORY_RE = re.compile(r"^[\w.]*MemoryError\b")
_HEADER = struct.Struct("!I")
JOB_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


# ---------------------------------------------------------------- framing (blocking side)


def send_msg(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket) -> dict[str, Any] | None:
    head = _recv_exact(sock, _HEADER.size)
    if head is None:
        return None
    body = _recv_exact(sock, _HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)


# ---------------------------------------------------------------- fork server


def forkserver_main(sock_fd: int, config_json: str) -> None:
    """Entry point of the fork server subprocess; forks one slot process per request."""
    isolation.set_parent_death_signal()
    config = json.loads(config_json)
    preloaded = []
    for name in config["preload"]:
        try:
            __import__(name)
            preloaded.append(name)
        except Exception:  # noqa: BLE001 - a missing optional module is reported, not fatal
            pass
    for name, code in WARMUP.items():
        if name in preloaded:
            try:
                exec(compile(code, f"<warmup {name}>", "exec"), {})
            except Exception:  # noqa: BLE001 - warm-up is an optimisation only
                pass
    config["preloaded"] = preloaded
    config["uid_base"] = isolation.slot_uid(os.getpid(), 0)
    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # slot processes are reaped by the kernel
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 64, 1)
        if not msg:
            return
        pid = os.fork()
        if pid == 0:
            sock.close()
            try:
                _slot_main(int(msg), fds[0], config)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        sock.send(str(pid).encode())


def _slot_main(index: int, conn_fd: int, config: dict[str, Any]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    isolation.set_parent_death_signal()
    layers = Layers()
    isolation.enter_slot_namespaces(layers)
    pid = os.fork()
    if pid == 0:
        isolation.set_parent_death_signal()
        _zygote_main(index, conn_fd, config, layers)
        os._exit(0)
    os.close(conn_fd)
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except ChildProcessError:
            return
        except InterruptedError:
            continue


# ---------------------------------------------------------------- zygote (PID 1 of the slot)


def _keep_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths.update(p for p in sys.path if p)
    return sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _zygote_main(index: int, conn_fd: int, config: dict[str, Any], layers: Layers) -> None:
    conn = socket.socket(fileno=conn_fd)
    try:
        isolation.setup_slot_filesystem(layers, config["disk_mb"], _keep_paths())
    except OSError as exc:
        layers.warnings.append(f"filesystem isolation failed: {exc}")
    if layers.mode.startswith("root"):
        layers.active.append(f"per-slot uid {config['uid_base'] + index}")
    elif layers.mode == "userns":
        layers.active.append("user namespace (uid mapped, capabilities dropped)")
    else:
        layers.warnings.append("jobs run as the daemon's own uid")
    layers.active.append("rlimits (cpu, as, nproc, fsize, nofile, core)")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    isolation.prctl(isolation.PR_SET_DUMPABLE, 0)  # jobs may not read or trace the zygote
    _install_seccomp(layers)
    base_vm = _vm_size_bytes()
    gc.collect()
    gc.freeze()  # NOTE: job children then never walk (and copy-on-write) the preloaded objects
    send_msg(conn, {"hello": True, "layers": asdict(layers), "preloaded": config["preloaded"]})
    while True:
        request = recv_msg(conn)
        if request is None:
            return
        try:
            result = _run_job(request, index, config, layers, base_vm)
        except Exception as exc:  # noqa: BLE001 - reported as an infrastructure failure
            result = {
                "status": "sandbox_error",
                "stdout": "",
                "stderr": f"zygote: {exc!r}",
                "exit_code": None,
                "duration_s": 0.0,
            }
        send_msg(conn, result)


def _install_seccomp(layers: Layers) -> None:
    """Install the filter in the zygote itself: every job inherits it at fork, for free.

    NOTE: the zygote needs none of the denied calls once its slot is set up.
    """
    if not isolation.seccomp_supported():
        layers.warnings.append("seccomp filter needs x86_64; not installed")
        return
    try:
        isolation.prctl(isolation.PR_SET_NO_NEW_PRIVS, 1)
        isolation.install_seccomp()
        layers.active.append("seccomp")
    except OSError as exc:
        layers.warnings.append(f"seccomp filter refused ({exc})")


def _scratch_dir(index: int, uid: int, layers: Layers) -> str:
    if os.getpid() == 1 and "private tmpfs" in " ".join(layers.active):
        path = "/tmp/job"
    else:
        path = f"/tmp/sandboxd-slot{index}-{os.getpid()}"
    os.makedirs(path, mode=0o700, exist_ok=True)
    if layers.mode.startswith("root"):
        os.chown(path, uid, uid)
    return path


def _wipe(scratch: str, layers: Layers) -> None:
    if scratch.startswith("/tmp/job"):
        for top in isolation.TMPFS_DIRS:  # the whole private tmpfs goes, not just the scratch dir
            try:
                names = os.listdir(top)
            except OSError:
                continue
            for name in names:
                path = os.path.join(top, name)
                if path in layers.protected:
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
    else:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_job(
    request: dict[str, Any], index: int, config: dict[str, Any], layers: Layers, base_vm: int
) -> dict[str, Any]:
    timeout_s = float(request["timeout_s"])
    limits = JobLimits(
        cpu_s=int(timeout_s) + 1,
        address_space_bytes=base_vm + int(config["memory_mb"]) * 2**20,
        max_procs=int(config["max_procs"]),
        max_file_bytes=int(config["disk_mb"]) * 2**20,
    )
    uid = int(config["uid_base"]) + index
    scratch = _scratch_dir(index, uid, layers)
    pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, ready
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child_main(request["code"], scratch, pipes, limits, layers.mode, uid)
        finally:
            os._exit(EXIT_SETUP_FAILED)  # NOTE: a job process never returns into the zygote's loop
    for i, (r, w) in enumerate(pipes):
        os.close(r if i == 0 else w)
    try:
        outcome = _pump(
            pid,
            pipes,
            request.get("stdin", "").encode("utf-8", "replace"),
            timeout_s,
            int(config["max_output_bytes"]),
            start,
        )
    finally:
        _wipe(scratch, layers)
    return _classify(outcome, limits)


def _child_main(
    code: str, scratch: str, pipes: list[tuple[int, int]], limits: JobLimits, mode: str, uid: int
) -> None:
    """In the forked job process: wire fds, sandbox itself, signal readiness, run. Never returns."""
    try:
        os.setsid()
        for target, fd in enumerate([pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]):
            os.dup2(fd, target)
        os.closerange(4, 1 << 16)
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(JOB_ENV, HOME=scratch, TMPDIR=scratch)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes raise OSError instead
        signal.signal(signal.SIGINT, signal.default_int_handler)
        isolation.enter_job_sandbox(limits, mode, uid)
        os.write(3, b"1")
        os.close(3)
    except BaseException as exc:  # noqa: BLE001 - anything here is the sandbox's fault
        os.write(2, f"sandboxd: job setup failed: {exc!r}\n".encode())
        os._exit(EXIT_SETUP_FAILED)
    os._exit(runner.run(code))


def _pump(
    pid: int,
    pipes: list[tuple[int, int]],
    stdin: bytes,
    timeout_s: float,
    max_output_bytes: int,
    start: float,
) -> dict[str, Any]:
    """Feed stdin, drain outputs with a cap, wait for exit or deadline; kill the job's tree."""
    stdin_w, out_r, err_r, ready_r = pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]
    os.set_blocking(stdin_w, False)
    bufs = {out_r: bytearray(), err_r: bytearray(), ready_r: bytearray()}
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
    timed_out = over_limit = exited = False
    sent = 0
    while not exited:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
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
                if not _read_into(fd, bufs, poller, open_fds):
                    continue
                if len(bufs[out_r]) + len(bufs[err_r]) > max_output_bytes:
                    over_limit = True
                    exited = True
    _kill_tree(pid)
    _, status, rusage = _wait4(pid)
    duration_s = time.monotonic() - start
    _drain(bufs, poller, open_fds, pidfd)
    for fd in open_fds:
        os.close(fd)
    return {
        "status_word": status,
        "rusage_cpu_s": rusage.ru_utime + rusage.ru_stime if rusage else 0.0,
        "stdout": bytes(bufs[out_r]),
        "stderr": bytes(bufs[err_r]),
        "ready": bytes(bufs[ready_r]) == b"1",
        "timed_out": timed_out,
        "over_limit": over_limit,
        "duration_s": duration_s,
        "max_output_bytes": max_output_bytes,
    }


def _read_into(
    fd: int, bufs: dict[int, bytearray], poller: select.poll, open_fds: set[int]
) -> bool:
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return False
    if not data:
        poller.unregister(fd)
        os.close(fd)
        open_fds.discard(fd)
        return False
    bufs[fd] += data
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
                time.sleep(0.001)


def _kill_tree(pid: int) -> None:
    """Kill every process of the job. NOTE: kill(-1) only as PID 1 of the slot's own namespace."""
    if os.getpid() == 1:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait4(pid: int) -> tuple[int, int, Any]:
    """Reap the job process, then every orphan reparented to us (zombies), within a bound."""
    got: tuple[int, int, Any]
    try:
        got = os.wait4(pid, 0)
    except ChildProcessError:
        got = (pid, 0, None)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if reaped == 0:
            time.sleep(0.001)
    return got


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
    if status in ("timeout", "output_limit") and exit_code == -signal.SIGKILL:
        exit_code = None  # killed by us, not a code the snippet chose
    return {
        "status": status,
        "stdout": _decode(o["stdout"], o["max_output_bytes"]),
        "stderr": stderr,
        "exit_code": exit_code,
        "duration_s": round(o["duration_s"], 6),
    }
