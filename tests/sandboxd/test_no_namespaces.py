"""A daemon on a host that refuses namespaces (a container without CAP_SYS_ADMIN, say) still kills
a job's whole tree and bounds its memory across processes.

The daemon runs as root under a seccomp filter that answers unshare() and namespace flags on
clone() with EPERM, installed by a `sitecustomize` before sandboxd starts: the kernel refuses
the namespaces as such a host does, and the slots run in mode "root-nons" (jobs under their
slot's own uid, rlimits and seccomp, no PID namespace). Without a PID namespace the zygote is a
child subreaper: a job's orphans come to it, and it walks its own tree to kill them and to sum
their memory (sandboxd.job). It runs every job: there is no light runner without a PID
namespace. Root only: without it the jobs would run as the test's own uid.
"""

from __future__ import annotations

import json
import os
import platform
import time
import urllib.request
import uuid
from dataclasses import dataclass

import pytest
from sbhelpers import run_jobs

from sandboxd import isolation

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or platform.machine() != "x86_64",
    reason="needs root (jobs then run as their slot's uid) and x86_64 (the seccomp filter)",
)

# Installs the filter in the daemon's interpreter before it runs; its processes inherit it.
SITECUSTOMIZE = """
import ctypes
from sandboxd import isolation as iso

LD_W_ABS, JEQ_K, JSET_K, RET_K = 0x20, 0x15, 0x45, 0x06
SYS_UNSHARE = 272
refuse = iso.SECCOMP_RET_ERRNO | iso.EPERM
program = b"".join([
    iso._insn(LD_W_ABS, 0, 0, 0),  # syscall nr
    iso._insn(JEQ_K, 0, 1, SYS_UNSHARE),
    iso._insn(RET_K, 0, 0, refuse),
    iso._insn(JEQ_K, 0, 1, iso.SYS_CLONE3),  # ENOSYS: glibc falls back to clone
    iso._insn(RET_K, 0, 0, iso.SECCOMP_RET_ERRNO | iso.ENOSYS),
    iso._insn(JEQ_K, 0, 3, iso.SYS_CLONE),
    iso._insn(LD_W_ABS, 0, 0, 16),  # clone flags
    iso._insn(JSET_K, 0, 1, iso.NAMESPACE_FLAGS),
    iso._insn(RET_K, 0, 0, refuse),
    iso._insn(RET_K, 0, 0, iso.SECCOMP_RET_ALLOW),
])
buf = ctypes.create_string_buffer(program, len(program))
fprog = iso._SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
iso.prctl(iso.PR_SET_NO_NEW_PRIVS, 1)
ret = iso._libc.prctl(
    iso.PR_SET_SECCOMP, ctypes.c_ulong(iso.SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0
)
assert ret == 0, "could not install the test's seccomp filter"
"""


@dataclass(frozen=True)
class NoNsDaemon:
    url: str
    slot_uids: range  # its jobs' uids


@pytest.fixture(scope="module")
def nons(tmp_path_factory):
    from sandboxd.spawn import spawn_daemon

    site = tmp_path_factory.mktemp("refuse-namespaces")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=str(site))
    handle = spawn_daemon(workers=2, timeout_s=5.0, memory_mb=256, env=env)
    try:
        with urllib.request.urlopen(handle.url + "/healthz", timeout=10) as resp:
            layers = json.loads(resp.read())["isolation"]
        # NOTE: the bombs below are safe only as a non-root uid of the slot's own
        assert layers["mode"] == "root-nons" and not layers["pid_namespace"], layers
        probe = run_jobs(handle.url, [{"code": "import os\nprint(os.getuid())\n"}])[0]
        uid = int(probe["stdout"])
        assert probe["status"] == "ok" and uid >= isolation.SLOT_UID_BASE, probe
        # this daemon's slot uids (isolation.slot_uid): other daemons may run jobs beside it
        first = uid - (uid - isolation.SLOT_UID_BASE) % isolation.MAX_SLOTS
        yield NoNsDaemon(handle.url, range(first, first + isolation.MAX_SLOTS))
    finally:
        handle.stop()


def _job_processes(uids: range) -> list[int]:
    """Processes on the host running as one of a daemon's slot uids (only its jobs do), wherever
    they are in the process tree."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/status") as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(uid_line.split()[1]) in uids:
            found.append(int(name))
    return found


def _serves_and_left_nothing(handle: NoNsDaemon) -> None:
    ok = run_jobs(handle.url, [{"code": "print(6*7)"}])[0]
    assert ok["status"] == "ok" and ok["stdout"] == "42\n", ok
    assert _job_processes(handle.slot_uids) == []


def test_memory_is_summed_across_a_jobs_processes(nons):
    # each process stays under its own address-space limit; six together pass the job's 256 MB
    code = (
        "import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n"
        "        b = bytearray(200 * 2**20)\n        time.sleep(3)\n        os._exit(0)\n"
        "for _ in range(6):\n    os.wait()\nprint('survived')\n"
    )
    res = run_jobs(nons.url, [{"code": code}])[0]
    assert res["status"] == "memory" and res["stdout"] == "", res
    _serves_and_left_nothing(nons)


def test_a_setsid_double_fork_dies_with_its_job(nons):
    marker = f"/tmp/late-{uuid.uuid4().hex}"
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        time.sleep(1.0)\n        open({marker!r}, 'w').write('late')\n"
        "        os._exit(0)\n    os._exit(0)\nos.wait()\nprint('parent done')\n"
    )
    try:
        res = run_jobs(nons.url, [{"code": code}])[0]
        assert res["status"] == "ok" and res["stdout"] == "parent done\n", res
        assert _job_processes(nons.slot_uids) == []
        time.sleep(1.5)  # past the time the grandchild would have written
        assert not os.path.exists(marker)
    finally:
        if os.path.exists(marker):
            os.unlink(marker)
    _serves_and_left_nothing(nons)


def test_a_fork_bomb_is_killed_whole(nons):
    code = (
        "import os, time\nt0 = time.time()\nwhile time.time() < t0 + 30:\n    try:\n"
        "        os.fork()\n    except OSError:\n        pass\n"
    )
    res = run_jobs(nons.url, [{"code": code, "timeout_s": 1.0}])[0]
    assert res["status"] == "timeout", res
    _serves_and_left_nothing(nons)


def test_the_network_stays_out_of_reach(nons):
    code = (
        "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "    print('opened')\nexcept OSError as e:\n    print(type(e).__name__)\n"
    )
    res = run_jobs(nons.url, [{"code": code}])[0]
    assert res["stdout"] == "PermissionError\n", res
