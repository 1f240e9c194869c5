"""Running an agent's tool calls: the `ToolRunner` surface, its two runners, and the batcher.

Tools run through a `ToolRunner` (`run_batch(jobs)`): `sandboxd.client.SandboxClient` for URLs or
`sandboxd.pool.LocalSandbox` in-process (`make_tool_runner`). `ToolBatcher` sends every call the
moment it is parsed, coalescing calls parsed in the same event-loop tick into one batch request
whose results come back one by one as each job finishes.

What it does not do: parse tool calls or format their results (protocol.py and the trajectory in
loop.py do), run code itself (sandboxd does). Tested in tests/unit/test_agent_loop.py and
tests/sandboxd/test_tool_batcher.py (both runners, a real daemon).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from rstar2cli.errors import UserError
from sandboxd.auth import SandboxUnauthorized
from sandboxd.wire import Job, JobResult

# Seconds one tool call may run (the paper does not say; the sandbox kills it after this).
TOOL_TIMEOUT_S = 10.0


class ToolRunner(Protocol):
    async def run_batch(
        self, jobs: list[Job], on_result: Callable[[int, JobResult], None] | None = None
    ) -> list[JobResult]: ...

    async def close(self) -> None: ...


class ToolBatcher:
    """Send tool calls as they come: calls made in the same event-loop tick share one batch
    request, and each call is answered as soon as its own job finishes (the runner's
    `on_result`), so a short call never waits for a long one of its batch."""

    def __init__(self, runner: ToolRunner):
        self.runner = runner
        self.num_in_flight = 0
        self.latencies_s: list[float] = []  # wall time per call, as the trajectory saw it
        self._pending: list[tuple[Job, asyncio.Future[JobResult]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, job: Job) -> JobResult:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[JobResult] = loop.create_future()
        self._pending.append((job, fut))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        self.num_in_flight += 1
        start = time.monotonic()
        try:
            return await fut
        finally:
            self.num_in_flight -= 1
            self.latencies_s.append(time.monotonic() - start)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[Job, asyncio.Future[JobResult]]]) -> None:
        def answer(i: int, result: JobResult) -> None:
            if not batch[i][1].done():
                batch[i][1].set_result(result)

        try:
            results = await self.runner.run_batch([job for job, _ in batch], on_result=answer)
        except SandboxUnauthorized as exc:  # a setup error: no call can succeed, none is a tool's
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(UserError(str(exc)))
            return
        except Exception as exc:  # the runner's own failure: every call in it is an infra error
            results = [
                JobResult(
                    status="sandbox_error",
                    stdout="",
                    stderr=f"sandbox failure: {exc}",
                    exit_code=None,
                    duration_s=0.0,
                )
            ] * len(batch)
        for (_, fut), result in zip(batch, results, strict=False):
            if not fut.done():
                fut.set_result(result)


def make_tool_runner(
    urls: list[str] | None,
    timeout_s: float = TOOL_TIMEOUT_S,
    num_workers: int | None = None,
    memory_mb: int = 1024,
    token_file: str | Path | None = None,
) -> ToolRunner:
    """A client for sandbox daemons at `urls` (their token in `token_file`, else
    $RSTAR2_SANDBOX_TOKEN), or an in-process sandbox pool when there are none (`num_workers`
    slots; None: sandboxd's default)."""
    if urls:
        from sandboxd.client import SandboxClient

        return SandboxClient(list(urls), timeout_s=max(60.0, 4 * timeout_s), token_file=token_file)
    from sandboxd.pool import DEFAULT_WORKERS, LocalSandbox

    return LocalSandbox(
        num_workers=DEFAULT_WORKERS if num_workers is None else num_workers,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
    )
