"""Kernel isolation layers for sandbox slots and job processes (Linux, x86_64 for seccomp).

What it does. Called from the slot's processes (`sandboxd.zygote`, `sandboxd.job`):
- `enter_slot_namespaces` / `setup_slot_filesystem` run once per worker slot: new mount, network
  (no interfaces up), PID, IPC and UTS namespaces (plus a user namespace mapping the daemon's uid
  to 0 when the daemon is not root); every existing mount remounted read-only; private size-capped
  tmpfs on /tmp, /var/tmp and /dev/shm; home directories and every top-level directory outside
  `SYSTEM_DIRS` hidden behind a tmpfs with only the interpreter's own directories (and the
  sandboxd package) bound back, so a child can still import lazily; a fresh /proc
  that shows only the slot's own processes.
- `install_seccomp` runs once in each zygote after its set-up; every job inherits the filter at
  fork, the light runner across its exec (deny list: ptrace, mount, namespaces, kernel modules,
  bpf, keyring, io_uring, non-AF_UNIX sockets, ...).
- `enter_job_sandbox` runs in each forked job child, after which user code runs: hard rlimits
  (CPU, address space, processes, file size, open files, core), its own uid per slot (as root) or
  all capabilities dropped (inside a user namespace); no_new_privs is inherited from the zygote.
- `signal_uid` kills every process of a slot's job uid at once (as root, from the slot's PID 1).

What it does not. It does not use cgroups (the per-slot process limit plus the slot's PID
namespace, or without one the zygote's tree walk in `sandboxd.job`, contain fork and thread
bombs); it does not build a separate root filesystem.
Layers the host refuses are reported in `Layers.warnings` and the daemon prints them loudly.

Tested in tests/sandboxd/test_hostile.py (hostile snippets through a real daemon) and
tests/sandboxd/test_sandbox_units.py (the BPF program's jumps).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal
import struct
from dataclasses import dataclass, field

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
# statvfs f_flag bits that must be kept on a bind-remount (locked inside a user namespace).
_KEEP_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # noatime, nodiratime, relatime

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER = 2
PR_CAPBSET_DROP = 24

SLOT_UID_BASE = 2_000_000_000  # as root, jobs run as uids far above any account's or subuid range
MAX_SLOTS = 256


def slot_uid(server_pid: int, slot_index: int) -> int:
    """A uid unique to (daemon, slot) on this host: no two slots share a process budget or signals.

    NOTE: keyed by the fork server's pid, which no other live daemon can hold at the same time.
    """
    return SLOT_UID_BASE + (server_pid % 1_000_000) * MAX_SLOTS + slot_index


TMPFS_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

# NOTE: libc through the interpreter's own symbols: ctypes.util would import threading, whose
# at-fork hook then runs in every job child.
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Layers:
    """Which isolation layers are active for a slot; `warnings` lists the ones the host refused."""

    mode: str = "none"  # "root" (per-slot uid) | "userns" (uid mapped) | "none"
    active: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pid_namespace: bool = False
    protected: list[str] = field(default_factory=list)  # bound-back dirs inside the wiped tmpfs


@dataclass
class JobLimits:
    """Hard limits applied to one job process (all enforced by the kernel)."""

    cpu_s: int
    address_space_bytes: int
    max_procs: int = 64
    max_file_bytes: int = 64 * 2**20
    max_open_files: int = 256


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {target}")


# NOTE: its own function object, typed, so plain ints convert in C: every job calls it right after
# fork, where each Python object it touches costs a copy-on-write page fault.
_prctl = _libc["prctl"]
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    if _prctl(option, arg2, arg3, 0, 0) != 0:
        _check(-1, f"prctl {option}")


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    prctl(PR_SET_PDEATHSIG, sig)


# ---------------------------------------------------------------- slot namespaces (once per slot)


def enter_slot_namespaces(layers: Layers) -> None:
    """Unshare the slot's namespaces in the calling process; its next child is PID 1 of the slot."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() == 0:
        try:
            unshare(flags)
            layers.mode = "root"
        except OSError as exc:
            layers.warnings.append(
                f"namespaces refused even as root ({exc}); jobs share the host's network and PIDs"
            )
            layers.mode = "root-nons"
        return
    try:
        unshare(CLONE_NEWUSER | flags)
        _write_file("/proc/self/setgroups", "deny")
        _write_file("/proc/self/uid_map", f"0 {uid} 1")
        _write_file("/proc/self/gid_map", f"0 {gid} 1")
        layers.mode = "userns"
    except OSError as exc:
        layers.mode = "none"
        layers.warnings.append(
            f"user namespaces refused ({exc}): jobs run as the daemon's own uid with NO namespace "
            "isolation (network, PIDs, filesystem); run as root or enable unprivileged user namespaces"
        )


def _write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def setup_slot_filesystem(layers: Layers, disk_mb: int, keep_paths: list[str]) -> None:
    """In the slot's PID 1, build its view of the filesystem (see module docstring)."""
    layers.pid_namespace = os.getpid() == 1
    if layers.mode in ("root", "userns"):
        layers.active += ["netns (no interfaces)", "ipcns", "utsns"]
        _libc.sethostname(b"sandbox", 7)  # best effort; only visible inside the slot
    if layers.pid_namespace:
        layers.active.append("pidns (tree killed per job)")
    else:
        layers.warnings.append(
            "no PID namespace: jobs see the host's processes (a job's tree is still killed and "
            "its memory summed: the zygote is a child subreaper)"
        )
    if layers.mode not in ("root", "userns"):
        layers.warnings.append("no mount namespace: jobs can write wherever the daemon's uid can")
        return
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as exc:
        layers.warnings.append(f"mount namespace unusable ({exc}); filesystem not isolated")
        return
    num_failed = _remount_all_read_only()
    layers.active.append(
        "read-only host filesystem" + (f" ({num_failed} mounts left as is)" if num_failed else "")
    )
    _hide_private_dirs(layers, keep_paths)
    for path in TMPFS_DIRS:
        if os.path.isdir(path):
            kept = _cover(
                path, keep_paths, f"size={disk_mb}m,nr_inodes=16384,mode=1777", read_only=False
            )
            layers.protected += [
                os.path.join(path, os.path.relpath(k, path).split(os.sep)[0]) for k in kept
            ]
    layers.active.append(f"private tmpfs /tmp,/var/tmp,/dev/shm ({disk_mb} MB)")
    if layers.pid_namespace:
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            layers.active.append("private /proc")
        except OSError as exc:
            layers.warnings.append(
                f"could not mount a private /proc ({exc}): host processes are visible"
            )


def _remount_all_read_only() -> int:
    """Bind-remount every mount read-only (except /dev, /proc, /sys); returns how many failed."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    num_failed = 0
    for point in points:
        if point.startswith(("/dev", "/proc", "/sys")):
            continue
        try:
            keep = os.statvfs(point).f_flag & _KEEP_FLAGS
            mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep)
        except OSError:
            num_failed += 1
    return num_failed


# NOTE: the top-level directories a job keeps seeing (read-only): what an interpreter and its
# libraries need. Every other one (/home, /root, /run with its sockets, /opt, /srv, /mnt, a
# project or data tree, ...) is covered (`_hide_private_dirs`).
SYSTEM_DIRS = frozenset(
    {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "tmp"}
    | {"usr", "var"}
)


def _private_dirs() -> list[str]:
    """The directories to hide: the daemon user's home, and every top-level directory outside
    `SYSTEM_DIRS` (never a symlink: covering one would cover its target)."""
    dirs = {"/root"}
    home = os.path.expanduser("~")
    if home not in ("/", "") and os.getuid() != 0:
        dirs.add(home)
    try:
        dirs.update(
            "/" + e.name for e in os.scandir("/") if e.name not in SYSTEM_DIRS and e.is_dir()
        )
    except OSError:
        pass
    return sorted(d for d in dirs if os.path.isdir(d) and not os.path.islink(d))


def _cover(target: str, keep_paths: list[str], options: str, read_only: bool) -> list[str]:
    """Mount an empty tmpfs on `target`, binding back (read-only) the `keep_paths` below it.

    NOTE: the interpreter may live under /root (pyenv) or even under /tmp (a venv); a job dropped
    to a slot uid must still import lazily from there, while the rest stays invisible.
    """
    inside = sorted(
        {p for p in keep_paths if p.startswith(target.rstrip("/") + "/") and os.path.isdir(p)}
    )
    inside = [p for p in inside if not any(p.startswith(q + "/") for q in inside if q != p)]
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in inside]
    try:
        mount(
            source="tmpfs", target=target, fstype="tmpfs", flags=MS_NOSUID | MS_NODEV, data=options
        )
        for path, fd in zip(inside, fds, strict=True):
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            keep = os.statvfs(path).f_flag & _KEEP_FLAGS
            mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep)
        if read_only:
            mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    finally:
        for fd in fds:
            os.close(fd)
    return inside


def _hide_private_dirs(layers: Layers, keep_paths: list[str]) -> None:
    """Cover each of `_private_dirs` with an empty read-only tmpfs (the interpreter's own dirs
    bound back)."""
    for hidden in _private_dirs():
        try:
            kept = _cover(hidden, keep_paths, "size=1m,mode=0755", read_only=True)
            layers.active.append(
                f"{hidden} hidden"
                + (f" (interpreter dirs bound back: {len(kept)})" if kept else "")
            )
        except OSError as exc:
            layers.warnings.append(f"could not hide {hidden} ({exc})")


# ---------------------------------------------------------------- per job (in the forked child)


def enter_job_sandbox(limits: JobLimits, mode: str, uid: int) -> None:
    """Apply rlimits and identity to the calling (job) process. Irreversible."""
    _set_rlimits(limits)
    if mode.startswith("root"):
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    elif mode == "userns":
        drop_capabilities()
    set_parent_death_signal()  # NOTE: must follow setresuid, which clears it
    prctl(PR_SET_DUMPABLE, 0)
    # NOTE: no_new_privs and the seccomp filter are already in place: the zygote set both, and
    # fork and exec keep them.


def _set_rlimits(limits: JobLimits) -> None:
    pairs = {
        resource.RLIMIT_CPU: (limits.cpu_s, limits.cpu_s + 1),
        resource.RLIMIT_AS: (limits.address_space_bytes, limits.address_space_bytes),
        resource.RLIMIT_NPROC: (limits.max_procs, limits.max_procs),
        resource.RLIMIT_FSIZE: (limits.max_file_bytes, limits.max_file_bytes),
        resource.RLIMIT_NOFILE: (limits.max_open_files, limits.max_open_files),
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in pairs.items():
        resource.setrlimit(which, (soft, hard))


def signal_uid(uid: int, sig: int) -> None:
    """Send `sig` to every process running as `uid` (kill(-1) with our real+effective uid = uid).

    NOTE: the kernel lets kill(-1) reach a process only if the sender's real or effective uid
    equals the target's real or saved uid (CAP_KILL is dropped from the effective set while the
    effective uid is not 0), so it reaches exactly `uid`'s processes and is atomic against their
    forks. A real uid of 0 would reach every root process instead. The saved uid stays 0 to
    switch back. Only for a root PID 1 of a slot's own PID namespace with no signal handlers:
    while switched, `uid`'s processes may signal the caller, and the kernel drops every such
    signal sent to a namespace's init. They may also lower its scheduling (nice, policy, CPU
    affinity), so that is put back as it was. Changing the effective uid clears the parent-death
    signal and the dumpable flag; both are re-armed.
    """
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    cpus = os.sched_getaffinity(0)
    os.setresuid(uid, uid, 0)
    try:
        os.kill(-1, sig)
    except ProcessLookupError:
        pass
    finally:
        os.setresuid(0, 0, 0)
        prctl(PR_SET_DUMPABLE, 0)
        set_parent_death_signal()
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        os.sched_setscheduler(0, policy, param)
        os.sched_setaffinity(0, cpus)


def drop_capabilities() -> None:
    """Clear the bounding set and the effective/permitted/inheritable sets (capset, v3)."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break
    header = struct.pack("Ii", 0x20080522, 0)
    data = bytes(24)  # two zeroed __user_cap_data_struct
    hbuf, dbuf = ctypes.create_string_buffer(header), ctypes.create_string_buffer(data)
    _check(_libc.capset(hbuf, dbuf), "capset")


# ---------------------------------------------------------------- seccomp (x86_64)

AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
EPERM, ENOSYS = 1, 38
AF_UNIX = 1

# x86_64 syscall numbers a math snippet never needs and an escape often does.
DENIED_SYSCALLS = {
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "unshare": 272,
    "setns": 308,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "reboot": 169,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "swapon": 167,
    "swapoff": 168,
    "acct": 163,
    "settimeofday": 164,
    "clock_settime": 227,
    "clock_adjtime": 305,
    "adjtimex": 159,
    "quotactl": 179,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "iopl": 172,
    "ioperm": 173,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "fanotify_init": 300,
    "mknod": 133,
    "mknodat": 259,
    "sethostname": 170,
    "setdomainname": 171,
    "move_mount": 429,
    "open_tree": 428,
    "fsopen": 430,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "lookup_dcookie": 212,
    "vhangup": 153,
    "syslog": 103,
}
SYS_CLONE, SYS_CLONE3, SYS_SOCKET = 56, 435, 41


def seccomp_supported() -> bool:
    return platform.machine() == "x86_64"


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_seccomp_program() -> bytes:
    """A classic-BPF seccomp filter: deny-list with EPERM, namespace flags on clone, AF_UNIX only.

    NOTE: clone3 gets ENOSYS so glibc falls back to clone, whose flags we can inspect.
    """
    LD_W_ABS, JEQ_K, JSET_K, RET_K = 0x20, 0x15, 0x45, 0x06
    ret_errno = SECCOMP_RET_ERRNO | EPERM
    denied = sorted(DENIED_SYSCALLS.values())
    prog = [
        _insn(LD_W_ABS, 0, 0, 4),  # arch
        _insn(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _insn(RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        _insn(LD_W_ABS, 0, 0, 0),  # syscall nr
        _insn(0x35, 0, 1, _X32_BIT),  # jge: x32 ABI -> deny
        _insn(RET_K, 0, 0, ret_errno),
        _insn(JEQ_K, 0, 1, SYS_CLONE3),
        _insn(RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
        _insn(JEQ_K, 0, 4, SYS_CLONE),
        _insn(LD_W_ABS, 0, 0, 16),  # clone flags (low 32 bits of args[0])
        _insn(JSET_K, 0, 1, NAMESPACE_FLAGS),
        _insn(RET_K, 0, 0, ret_errno),
        _insn(RET_K, 0, 0, SECCOMP_RET_ALLOW),
        _insn(JEQ_K, 0, 4, SYS_SOCKET),
        _insn(LD_W_ABS, 0, 0, 16),  # socket family
        _insn(JEQ_K, 1, 0, AF_UNIX),
        _insn(RET_K, 0, 0, ret_errno),
        _insn(RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    for i, nr in enumerate(denied):
        # jump to the final "deny" instruction when equal; distance shrinks by one each row
        prog.append(_insn(JEQ_K, len(denied) - i, 0, nr))
    prog.append(_insn(RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog.append(_insn(RET_K, 0, 0, ret_errno))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp() -> None:
    code = build_seccomp_program()
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    ret = _libc.prctl(
        PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0
    )
    _check(ret, "seccomp")
