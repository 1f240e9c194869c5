"""The asyncio side of the pool: N worker slots fed from one bounded queue, and `LocalSandbox`.

What it does: starts the fork server (`sandboxd.zygote`) as a clean subprocess, asks it for one
zygote per slot, and runs one asyncio worker per slot that takes jobs from the queue, sends each
to its zygote and awaits the answer. A zygote that dies or hangs mid-job yields `sandbox_error`
for that job only and is respawned. `submit` raises `QueueFull` instead of waiting when the queue
bound would be exceeded (the server answers 503). Counters for /metrics live here.
The queue is fair between submissions (`_FairQueue`): the slots take one job from each pending
batch in turn, so a client's batch of 50,000 jobs does not hold up another's single job for
hours. A job whose future was cancelled before it started (its client left) is dropped unrun.

What it does not: no HTTP (sandboxd.server), no isolation code (sandboxd.isolation / zygote).

Tested in tests/sandboxd/test_local_pool.py (LocalSandbox, respawn after a zygote is killed) and
through the daemon everywhere else in tests/sandboxd/.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.isolation import MAX_SLOTS
from sandboxd.wire import STATUSES, Job, JobResult, result_from_wire, sandbox_error
from sandboxd.zygote import DEFAULT_PRELOAD

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_HEADER_SIZE = 4
_SPAWN_TIMEOUT_S = 60.0
# worker slots when nobody says (daemon, `rstar2 serve-sandbox`, spawn_daemon, in-process pools);
# a sandbox node serves about one per core, so its operator passes --workers
DEFAULT_WORKERS = 2


class QueueFull(Exception):
    """The bounded queue cannot take these jobs now; retry later or elsewhere."""


@dataclass
class PoolConfig:
    num_workers: int = DEFAULT_WORKERS
    timeout_s: float = 10.0  # default and maximum wall-clock time per job
    memory_mb: int = 1024  # address space a job may add on top of the warm interpreter
    max_output_bytes: int = 1_000_000  # stdout + stderr; beyond it the job ends as output_limit
    max_procs: int = 64  # processes + threads per slot
    disk_mb: int = 64  # size of the slot's private tmpfs, and the largest file a job may write
    max_queue: int = 100_000
    # stdout + stderr of all the jobs of one submission together (what the daemon holds to
    # answer it); the jobs that finish past it come back cut, as output_limit
    max_request_output_bytes: int = 256 * 2**20
    preload: tuple[str, ...] = DEFAULT_PRELOAD


def unimportable(names: tuple[str, ...]) -> list[str]:
    """The modules of `names` this interpreter cannot find (a zygote could not preload them)."""
    import importlib.util

    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a missing parent package, or an empty/relative name
            found = False
        if not found:
            missing.append(name)
    return missing


@dataclass
class PoolStats:
    num_queued: int = 0
    num_in_flight: int = 0
    num_rejected: int = 0
    num_respawns: int = 0
    num_abandoned: int = 0  # queued jobs dropped unrun: their client left
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    latency_sum_s: float = 0.0

    def observe(self, status: str, latency_s: float) -> None:
        self.totals[status] = self.totals.get(status, 0) + 1
        self.latency_sum_s += latency_s
        for i, bound in enumerate(LATENCY_BUCKETS_S):
            if latency_s <= bound:
                self.bucket_counts[i] += 1
                return
        self.bucket_counts[-1] += 1


class _OutputBudget:
    """What is left of one submission's `max_request_output_bytes`."""

    def __init__(self, num_bytes: int) -> None:
        self.left = num_bytes

    def charge(self, result: JobResult) -> JobResult:
        """`result` as it is while it fits; past the budget, its output cut to what is left and
        its status output_limit (unless it already failed otherwise)."""
        out = result.stdout.encode("utf-8", "surrogatepass")
        err = result.stderr.encode("utf-8", "surrogatepass")
        if len(out) + len(err) <= self.left:
            self.left -= len(out) + len(err)
            return result
        out, err = out[: self.left], err[: max(0, self.left - len(out))]
        self.left = 0
        status = "output_limit" if result.status in ("ok", "error") else result.status
        return JobResult(
            status=status,
            stdout=out.decode("utf-8", "ignore"),
            stderr=err.decode("utf-8", "ignore"),
            exit_code=result.exit_code,
            duration_s=result.duration_s,
        )


# a queued job: the job, its future, when it was queued, its submission's output budget
_Item = tuple[Job, "asyncio.Future[JobResult]", float, _OutputBudget]


class _FairQueue:
    """Batches of queued jobs, served round-robin: one job from each batch in turn."""

    def __init__(self) -> None:
        self._batches: OrderedDict[int, deque[_Item]] = OrderedDict()
        self._next_id = 0
        self._ready = asyncio.Event()
        self._closed = False

    def put_batch(self, items: list[_Item]) -> None:
        if items:
            self._batches[self._next_id] = deque(items)
            self._next_id += 1
            self._ready.set()

    def pop(self) -> _Item | None:
        """The next job in turn (its batch goes to the back of the line), or None."""
        if not self._batches:
            return None
        key, batch = next(iter(self._batches.items()))
        item = batch.popleft()
        if batch:
            self._batches.move_to_end(key)
        else:
            del self._batches[key]
        return item

    async def get(self) -> _Item | None:
        """Wait for the next job; None once closed."""
        while not self._closed:
            item = self.pop()
            if item is not None:
                return item
            self._ready.clear()
            await self._ready.wait()
        return None

    def close(self) -> list[_Item]:
        """Wake every waiting worker with None; return the jobs still queued."""
        self._closed = True
        self._ready.set()
        left = [item for batch in self._batches.values() for item in batch]
        self._batches.clear()
        return left


class _Slot:
    """Daemon-side handle of one zygote: its slot process pid and the stream to it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.pid: int | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.hello: dict[str, Any] = {}

    @property
    def alive(self) -> bool:
        return self.writer is not None and not self.writer.is_closing()

    async def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.reader is not None and self.writer is not None
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
        self.writer.write(len(data).to_bytes(_HEADER_SIZE, "big") + data)
        await self.writer.drain()
        return await self.read()

    async def read(self) -> dict[str, Any]:
        assert self.reader is not None
        head = await self.reader.readexactly(_HEADER_SIZE)
        body = await self.reader.readexactly(int.from_bytes(head, "big"))
        return json.loads(body)

    def kill(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer = self.reader = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)  # the zygote follows via its parent-death signal
            except ProcessLookupError:
                pass
            self.pid = None


class Pool:
    """N zygote slots behind one bounded queue. `await start()` before use; `await close()` after."""

    def __init__(self, config: PoolConfig) -> None:
        if not 1 <= config.num_workers <= MAX_SLOTS:
            raise ValueError(f"num_workers must be between 1 and {MAX_SLOTS}")
        self.config = config
        self.stats = PoolStats()
        self.slots = [_Slot(i) for i in range(config.num_workers)]
        self._queue = _FairQueue()
        self._server: subprocess.Popen[bytes] | None = None
        self._server_sock: socket.socket | None = None
        self._spawn_lock = asyncio.Lock()
        self._workers: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._start_forkserver()
        await asyncio.gather(*(self._spawn(slot) for slot in self.slots))
        self._workers = [asyncio.create_task(self._work(slot)) for slot in self.slots]

    def _start_forkserver(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        daemon_side = ("max_queue", "max_request_output_bytes")
        config = {k: v for k, v in self.config.__dict__.items() if k not in daemon_side}
        config["preload"] = list(self.config.preload)
        env = dict(_clean_env())
        root = str(Path(__file__).resolve().parent.parent)
        code = (
            f"import sys; sys.path.insert(0, {root!r}); from sandboxd.zygote import forkserver_main; "
            "forkserver_main(int(sys.argv[1]), sys.argv[2])"
        )
        self._server = subprocess.Popen(
            [sys.executable, "-I", "-c", code, str(child.fileno()), json.dumps(config)],
            pass_fds=[child.fileno()],
            env=env,
            close_fds=True,
            stdin=subprocess.DEVNULL,
            cwd="/",
            # NOTE: its own session: a terminal's Ctrl-C (SIGINT to the foreground group) reaches
            # only the daemon, which then stops the slots itself
            start_new_session=True,
        )
        child.close()
        parent.setblocking(False)
        self._server_sock = parent

    async def _spawn(self, slot: _Slot) -> None:
        slot.kill()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        loop = asyncio.get_running_loop()
        async with self._spawn_lock:
            if self._server is None or self._server.poll() is not None:
                self._start_forkserver()
            assert self._server_sock is not None
            socket.send_fds(self._server_sock, [str(slot.index).encode()], [theirs.fileno()])
            theirs.close()
            reply = await asyncio.wait_for(loop.sock_recv(self._server_sock, 64), _SPAWN_TIMEOUT_S)
        slot.pid = int(reply)
        slot.reader, slot.writer = await asyncio.open_unix_connection(sock=ours, limit=2**26)
        slot.hello = await asyncio.wait_for(slot.read(), _SPAWN_TIMEOUT_S)

    async def close(self) -> None:
        left = self._queue.close()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        for _job, fut, _queued_at, _budget in left:
            if not fut.done():
                fut.set_result(sandbox_error("sandbox is shutting down"))
        for slot in self.slots:
            slot.kill()
        if self._server_sock is not None:
            self._server_sock.close()
        if self._server is not None:
            self._server.kill()
            self._server.wait()
            self._server = None

    # ------------------------------------------------------------ jobs

    @property
    def layers(self) -> dict[str, Any]:
        for slot in self.slots:
            if slot.hello:
                return slot.hello["layers"]
        return {}

    @property
    def num_alive(self) -> int:
        return sum(slot.alive for slot in self.slots)

    def submit(self, jobs: list[Job]) -> list[asyncio.Future[JobResult]]:
        """Queue jobs (all or none); raises QueueFull when the bound would be exceeded."""
        if self.stats.num_queued + len(jobs) > self.config.max_queue:
            self.stats.num_rejected += len(jobs)
            raise QueueFull(
                f"queue full ({self.stats.num_queued} queued, bound {self.config.max_queue})"
            )
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[JobResult]] = [loop.create_future() for _ in jobs]
        now = time.monotonic()
        budget = _OutputBudget(self.config.max_request_output_bytes)
        self._queue.put_batch(
            [(job, fut, now, budget) for job, fut in zip(jobs, futures, strict=True)]
        )
        self.stats.num_queued += len(jobs)
        return futures

    async def run_batch(self, jobs: list[Job]) -> list[JobResult]:
        return list(await asyncio.gather(*self.submit(jobs)))

    @property
    def idle(self) -> bool:
        return self.stats.num_queued == 0 and self.stats.num_in_flight == 0

    async def _work(self, slot: _Slot) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            job, fut, queued_at, budget = item
            self.stats.num_queued -= 1
            if fut.done():  # cancelled: its client is gone
                self.stats.num_abandoned += 1
                continue
            self.stats.num_in_flight += 1
            try:
                result = await self._execute(slot, job)
            finally:
                self.stats.num_in_flight -= 1
            if not fut.done():  # else its client left while it ran
                result = budget.charge(result)
                fut.set_result(result)
            self.stats.observe(result.status, time.monotonic() - queued_at)

    def _effective_timeout(self, job: Job) -> float:
        limit = self.config.timeout_s
        return min(job.timeout_s, limit) if job.timeout_s else limit

    async def _execute(self, slot: _Slot, job: Job) -> JobResult:
        timeout_s = self._effective_timeout(job)
        try:
            if not slot.alive:
                await self._respawn(slot)
            payload = {"code": job.code, "stdin": job.stdin, "timeout_s": timeout_s}
            # NOTE: the zygote enforces the timeout itself; this guard only catches a wedged zygote.
            reply = await asyncio.wait_for(slot.request(payload), timeout_s + 10.0)
            return result_from_wire(reply)
        except (
            OSError,
            EOFError,
            asyncio.IncompleteReadError,
            asyncio.TimeoutError,
            ValueError,
        ) as exc:
            slot.kill()
            try:
                await self._respawn(slot)
            except (OSError, asyncio.TimeoutError, ValueError, EOFError):
                pass  # retried before the next job
            return sandbox_error(
                f"worker slot {slot.index} failed mid-job ({type(exc).__name__}); respawned"
            )

    async def _respawn(self, slot: _Slot) -> None:
        self.stats.num_respawns += 1
        await self._spawn(slot)


def _clean_env() -> dict[str, str]:
    """The fork server's whole environment: nothing of the daemon's own is passed on."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HOME": "/tmp",
    }


class LocalSandbox:
    """An in-process pool with the client's surface (`run`, `run_batch`, `close`).

    For rollouts when no sandbox URL is given. Starts lazily on first use; its fork server is a
    fresh interpreter, so it is safe to use from a process that has threads or torch loaded.
    """

    def __init__(
        self,
        num_workers: int = DEFAULT_WORKERS,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        max_output_bytes: int = 1_000_000,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
    ) -> None:
        self.config = PoolConfig(
            num_workers=num_workers,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_output_bytes=max_output_bytes,
            max_queue=10**9,
            preload=preload,
        )
        self._pool: Pool | None = None
        self._lock: asyncio.Lock | None = None

    async def _ready(self) -> Pool:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._pool is None:
                pool = Pool(self.config)
                await pool.start()
                self._pool = pool
        return self._pool

    async def run(self, job: Job) -> JobResult:
        return (await self.run_batch([job]))[0]

    async def run_batch(
        self, jobs: list[Job], on_result: Callable[[int, JobResult], None] | None = None
    ) -> list[JobResult]:
        """Results in the order of `jobs`; `on_result(i, result)`, when given, hears of each job
        as soon as it finishes (as `SandboxClient.run_batch`)."""
        if not jobs:
            return []
        pool = await self._ready()
        futures = pool.submit(jobs)
        if on_result is not None:
            for i, fut in enumerate(futures):

                def tell(f: asyncio.Future[JobResult], i: int = i) -> None:
                    if not f.cancelled() and f.exception() is None:
                        on_result(i, f.result())

                fut.add_done_callback(tell)
        return list(await asyncio.gather(*futures))

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
