"""The process side of the pool: fork server, per-slot zygote Z and its light runner L.

Process tree (each arrow is a fork; the only exec is of our own interpreter, never of user code):
  daemon --exec--> fork server (clean environment, math stack imported once)
     --> slot process S (unshares the slot's namespaces) --> zygote Z (PID 1 of the slot)
        --> one job child per job whose code names a module only Z has loaded (numpy, sympy)
        --exec--> light runner L (as root only; standard-library preload, child subreaper)
           --> one job child per other job
Forking a process with the math stack mapped costs several times more CPU than forking a bare
interpreter, and most snippets never touch that stack. So Z reads each request (4-byte length +
JSON) and routes it: code that mentions, as a word, a module that only Z has loaded runs in Z;
any other code goes to L. A light job that imports numpy by a trick still works, only slower.
Both runners run a job the same way (`sandboxd.job`): feed stdin, drain outputs with a cap,
enforce the wall-clock timeout, kill the job's whole process tree, reap, wipe the slot's private
tmpfs, answer one status. A slot runs one job at a time, so Z and L never run jobs together.

Killing the tree. As root, jobs run as the slot's own uid; Z kills them all with kill(-1) sent as
that uid (`isolation.signal_uid`), which spares Z and L (root). That is safe in Z only: nothing
inside a namespace can signal its init, while L could be signalled during the switch, so L asks
Z to do it, unless the job process has exited and left nothing behind (`job.tree_gone`).
Without root, jobs share Z's uid: L is not started and Z runs every job, killing with kill(-1)
as PID 1 of the slot. Without a PID namespace (a host that refuses namespaces) there is no PID 1
of ours either: L is not started, Z becomes a child subreaper (a job's orphans come to it) and
kills by walking its own tree (`job._kill_descendants`). If L fails to start, Z runs every job;
if L dies, its job in flight answers `sandbox_error`, Z kills and reaps what is left, and starts
a new L for the next light job.

What it does not: no asyncio, no HTTP (see `sandboxd.pool` / `sandboxd.server`). The fork server
is started with a scrubbed environment and only its socket as an open fd, so nothing the daemon
holds (environment, sockets, memory) is reachable from a snippet; L is exec'd with that same
environment, Z's seccomp filter, and no open fd but its socket to Z.

Tested through a real daemon in tests/sandboxd/ (hostile snippets through both runners).
"""

from __future__ import annotations

import gc
import json
import os
import re
import select
import signal
import site
import socket
import struct
import sys
from dataclasses import asdict
from typing import Any

from sandboxd import isolation, job
from sandboxd.isolation import Layers
from sandboxd.job import SlotInfo

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
_HEADER = struct.Struct("!I")
_LIGHT_START_S = 30.0  # a fresh interpreter importing the standard-library preload, on a busy host
_LIGHT_GUARD_S = 5.0  # on top of a job's timeout: L answers well before unless it is wedged
_KILL, _KILLED = b"kill", b"killed"  # L -> Z and back mid-job; never valid JSON, so never a result


# ---------------------------------------------------------------- framing (blocking side)


def send_msg(sock: socket.socket, obj: dict[str, Any]) -> None:
    send_frame(sock, _encode(obj))


def send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes | None:
    head = _recv_exact(sock, _HEADER.size)
    return None if head is None else _recv_exact(sock, _HEADER.unpack(head)[0])


def recv_msg(sock: socket.socket) -> dict[str, Any] | None:
    body = recv_frame(sock)
    return None if body is None else json.loads(body)


# ---------------------------------------------------------------- fork server


def forkserver_main(sock_fd: int, config_json: str) -> None:
    """Entry point of the fork server subprocess; forks one slot process per request."""
    isolation.set_parent_death_signal()
    config = json.loads(config_json)
    config["env"] = dict(os.environ)  # NOTE: as pool.py scrubbed it, before any import runs
    preloaded = _preload(config["preload"])
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


def _preload(names: list[str]) -> list[str]:
    loaded = []
    for name in names:
        try:
            __import__(name)
            loaded.append(name)
        except Exception:  # noqa: BLE001 - a missing optional module is reported, not fatal
            pass
    return loaded


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
    """What jobs must still see under hidden directories: the interpreter and its import path.
    The pool puts the directory holding the sandboxd package on that path; of it only the
    package is kept (it may be a whole source tree), unless it is a site-packages dir."""
    package = os.path.dirname(os.path.realpath(__file__))
    holder = os.path.dirname(package)
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths.update(os.path.realpath(p) for p in sys.path if p)
    if holder not in {os.path.realpath(p) for p in site.getsitepackages()}:
        paths.discard(holder)
    paths.add(package)
    return sorted(p for p in paths if os.path.isdir(p))


def _zygote_main(index: int, conn_fd: int, config: dict[str, Any], layers: Layers) -> None:
    conn = socket.socket(fileno=conn_fd)
    try:
        isolation.setup_slot_filesystem(layers, config["disk_mb"], _keep_paths())
    except OSError as exc:
        layers.warnings.append(f"filesystem isolation failed: {exc}")
    if not layers.pid_namespace:
        # NOTE: then no PID 1 of ours catches a job's orphans; as a subreaper we do
        isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
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
    isolation.prctl(isolation.PR_SET_NO_NEW_PRIVS, 1)  # NOTE: inherited by L and every job
    _install_seccomp(layers)
    slot = _slot_info(index, config, layers)
    light = None
    if _wants_light(slot, config["preloaded"]):
        light = _Light(slot, config)
        if light.start():
            layers.active.append(f"light runner for jobs without {'/'.join(light.heavy_names)}")
        else:
            light = None
    job.prepare_runner(slot)
    slot.base_vm = job.vm_size_bytes()
    gc.collect()
    gc.freeze()  # NOTE: job children then never walk (and copy-on-write) the preloaded objects
    send_msg(conn, {"hello": True, "layers": asdict(layers), "preloaded": config["preloaded"]})
    kill_tree = job.tree_killer(slot)
    while True:
        frame = recv_frame(conn)
        if frame is None:
            return
        try:
            request = json.loads(frame)
            answer = None
            if light is not None and light.takes(request["code"]):
                answer = light.run(frame, float(request["timeout_s"]))
            if answer is None:
                spare_pid = light.pid if light is not None else None
                answer = _encode(job.run_job(request, slot, kill_tree, spare_pid))
        except Exception as exc:  # noqa: BLE001 - reported as an infrastructure failure
            answer = _encode(_error(f"zygote: {exc!r}"))
        send_frame(conn, answer)


def _slot_info(index: int, config: dict[str, Any], layers: Layers) -> SlotInfo:
    private_tmp = layers.pid_namespace and any(a.startswith("private tmpfs") for a in layers.active)
    return SlotInfo(
        index=index,
        uid=int(config["uid_base"]) + index,
        mode=layers.mode,
        pid_namespace=layers.pid_namespace,
        scratch="/tmp/job" if private_tmp else f"/tmp/sandboxd-slot{index}-{os.getpid()}",
        private_tmp=private_tmp,
        protected=list(layers.protected),
        memory_mb=int(config["memory_mb"]),
        max_procs=int(config["max_procs"]),
        disk_mb=int(config["disk_mb"]),
        max_output_bytes=int(config["max_output_bytes"]),
    )


def _install_seccomp(layers: Layers) -> None:
    """Install the filter in the zygote itself: every job (and L, and its jobs) inherits it.

    NOTE: the zygote needs none of the denied calls once its slot is set up.
    """
    if not isolation.seccomp_supported():
        layers.warnings.append("seccomp filter needs x86_64; not installed")
        return
    try:
        isolation.install_seccomp()
        layers.active.append("seccomp")
    except OSError as exc:
        layers.warnings.append(f"seccomp filter refused ({exc})")


def _encode(result: dict[str, Any]) -> bytes:
    return json.dumps(result, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _error(message: str) -> dict[str, Any]:
    return {
        "status": "sandbox_error",
        "stdout": "",
        "stderr": message,
        "exit_code": None,
        "duration_s": 0.0,
    }


# ---------------------------------------------------------------- light runner L


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _wants_light(slot: SlotInfo, preloaded: list[str]) -> bool:
    """L pays off only when Z holds more than the standard library, and needs kill-by-uid."""
    return job.uid_killing(slot) and not all(_is_stdlib(m) for m in preloaded)


class _Light:
    """Z's handle on its light runner: start it, decide what it takes, forward, survive its death."""

    def __init__(self, slot: SlotInfo, config: dict[str, Any]) -> None:
        self.slot = slot
        self.env: dict[str, str] = config["env"]
        self.preload = [m for m in config["preloaded"] if _is_stdlib(m)]
        self.heavy_names: list[str] = []
        self.pid: int | None = None
        # NOTE: a heavy job's reaping may reap a dead L, and its pid be reused; a pidfd cannot be.
        self._pidfd: int | None = None
        self._sock: socket.socket | None = None
        self._heavy_re: re.Pattern[str] | None = None
        self._broken = False  # a restart failed: Z runs every job itself from then on

    def takes(self, code: str) -> bool:
        return self._heavy_re is not None and not self._heavy_re.search(code)

    def start(self) -> bool:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            _exec_light(theirs.fileno(), self.env)
        theirs.close()
        self.pid, self._pidfd, self._sock = pid, os.pidfd_open(pid), ours
        ours.settimeout(_LIGHT_START_S)
        try:
            send_msg(ours, {"slot": asdict(self.slot), "preload": self.preload})
            hello = recv_msg(ours)
        except (OSError, ValueError):
            hello = None
        if hello is None:
            self.stop()
            return False
        if self._heavy_re is None:
            only_ours = {m.split(".")[0] for m in sys.modules} - set(hello["modules"])
            # NOTE: importable names only (extension internals such as cython_runtime have no
            # file); leaving one out only sends its jobs to L, which then imports it itself.
            self.heavy_names = sorted(
                n
                for n in only_ours - sys.stdlib_module_names
                if n.isidentifier()
                and not n.startswith("_")
                and hasattr(sys.modules[n], "__file__")
            )
            if not self.heavy_names:
                self.stop()
                return False
            self._heavy_re = re.compile(r"\b(?:" + "|".join(self.heavy_names) + r")\b")
        return True

    def stop(self) -> None:
        if self.pid is not None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(self._pidfd)
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass  # already reaped by a heavy job's reaping
        if self._sock is not None:
            self._sock.close()
        self.pid = self._pidfd = self._sock = None

    def _ready(self) -> bool:
        """Whether L is up, restarting it if it died between jobs."""
        if self._sock is not None and self._pidfd is not None:
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)  # NOTE: an idle L never writes: EOF = dead
            poller.register(self._pidfd, select.POLLIN)
            if not poller.poll(0):
                return True
        self.stop()
        if self._broken:
            return False
        self._broken = not self.start()
        return not self._broken

    def run(self, frame: bytes, timeout_s: float) -> bytes | None:
        """Forward one request frame to L, return its answer frame; None if L is down for good.

        NOTE: frames are relayed as they are: Z decodes requests only to route them.
        """
        if not self._ready():
            return None
        sock = self._sock
        assert sock is not None
        sock.settimeout(timeout_s + _LIGHT_GUARD_S)
        try:
            send_frame(sock, frame)
            while True:
                answer = recv_frame(sock)
                if answer is None:
                    raise EOFError("light runner exited")
                if answer != _KILL:
                    return answer
                isolation.signal_uid(self.slot.uid, signal.SIGKILL)
                send_frame(sock, _KILLED)
        except (OSError, EOFError) as exc:
            self.stop()
            isolation.signal_uid(self.slot.uid, signal.SIGKILL)  # its job's orphans are now ours
            job.reap_orphans(None)
            job.wipe(self.slot)
            message = f"light runner failed mid-job ({type(exc).__name__}); restarted next job"
            return _encode(_error(message))


def _exec_light(sock_fd: int, env: dict[str, str]) -> None:
    """In Z's child: become L, a fresh interpreter holding only its socket to Z. Never returns."""
    try:
        isolation.set_parent_death_signal()
        os.dup2(sock_fd, 3)
        os.set_inheritable(3, True)
        os.closerange(4, 1 << 16)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = (
            f"import sys; sys.path.insert(0, {root!r}); from sandboxd.zygote import light_main; "
            "light_main(3)"
        )
        os.execve(sys.executable, [sys.executable, "-I", "-c", code], env)
    finally:
        os._exit(job.EXIT_SETUP_FAILED)


def light_main(sock_fd: int) -> None:
    """Entry point of L, exec'd by Z inside the slot (same namespaces, filesystem, seccomp)."""
    isolation.prctl(isolation.PR_SET_DUMPABLE, 0)  # NOTE: the exec made us dumpable again
    isolation.set_parent_death_signal()
    isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)  # NOTE: our jobs' orphans come to us
    sock = socket.socket(fileno=sock_fd)
    setup = recv_msg(sock)
    if setup is None:
        return
    _preload(setup["preload"])
    slot = SlotInfo(**setup["slot"])
    job.prepare_runner(slot)
    gc.collect()
    gc.freeze()
    slot.base_vm = job.vm_size_bytes()
    send_msg(sock, {"modules": sorted({m.split(".")[0] for m in sys.modules})})

    def kill_tree(pid: int) -> None:
        job.kill_quietly(pid)  # NOTE: the job process may still be root, in its set-up
        if job.tree_gone(pid):
            return  # NOTE: the usual end of a job; spares the round trip to Z
        send_frame(sock, _KILL)  # Z kills everything running as the slot's uid
        if recv_frame(sock) != _KILLED:
            os._exit(0)  # Z is gone, and the slot's namespace with it

    while True:
        request = recv_msg(sock)
        if request is None:
            return
        try:
            # NOTE: L keeps the SIGINT handler every interpreter starts with; its jobs inherit it.
            result = job.run_job(request, slot, kill_tree, install_sigint=False)
        except Exception as exc:  # noqa: BLE001 - reported as an infrastructure failure
            result = _error(f"light runner: {exc!r}")
        send_msg(sock, result)
