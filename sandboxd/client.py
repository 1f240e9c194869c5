"""Async client for one or more sandboxd daemons: batching, least-in-flight balancing, retries.

What it does: `run_batch(jobs)` splits jobs into chunks, sends each chunk to the endpoint with the
fewest jobs in flight (skipping endpoints that failed recently), and retries on another endpoint
only infrastructure failures: connection errors, HTTP 503, per-call timeouts, and results with
status `sandbox_error`. Whatever still fails after `max_attempts` becomes a
`JobResult(status="sandbox_error")`; results come back in the order the jobs were given.

What it does not: retry a snippet's own failures (error, timeout, memory, output_limit are
answers, not infrastructure faults), or start daemons (sandboxd.server.spawn_daemon does).

Tested in tests/sandboxd/test_failover.py (two daemons, one killed mid-burst; unreachable URLs).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import aiohttp

from sandboxd.protocol import Job, JobResult, ProtocolError, result_from_wire, sandbox_error

_COOLDOWN_S = 2.0


class SandboxUnreachable(RuntimeError):
    """No endpoint answered /healthz."""


@dataclass
class _Endpoint:
    url: str
    num_in_flight: int = 0
    failed_until: float = 0.0


class _Retryable(Exception):
    pass


class SandboxClient:
    """Client over `urls` (e.g. ["http://10.0.0.5:8080"]). Use `async with` or call `close()`."""

    def __init__(
        self,
        urls: list[str],
        timeout_s: float = 60.0,
        max_attempts: int = 3,
        batch_size: int = 64,
        max_requests_per_endpoint: int = 8,
    ) -> None:
        if not urls:
            raise ValueError("SandboxClient needs at least one URL")
        self.endpoints = [_Endpoint(u.rstrip("/")) for u in urls]
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.batch_size = batch_size
        self._limit = asyncio.Semaphore(max_requests_per_endpoint * len(urls))
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, force_close=False)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def check(self) -> None:
        """Raise SandboxUnreachable (naming the URLs) unless at least one endpoint is healthy."""
        for endpoint in self.endpoints:
            try:
                timeout = aiohttp.ClientTimeout(total=min(self.timeout_s, 10.0))
                async with self._http().get(endpoint.url + "/healthz", timeout=timeout) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                continue
        raise SandboxUnreachable(
            "no sandbox answered /healthz at " + ", ".join(e.url for e in self.endpoints)
        )

    async def run(self, job: Job) -> JobResult:
        return (await self.run_batch([job]))[0]

    async def run_batch(self, jobs: list[Job]) -> list[JobResult]:
        chunks = [jobs[i : i + self.batch_size] for i in range(0, len(jobs), self.batch_size)]
        parts = await asyncio.gather(*(self._run_chunk(chunk) for chunk in chunks))
        return [r for part in parts for r in part]

    def _pick(self, avoid: _Endpoint | None) -> _Endpoint:
        now = time.monotonic()
        healthy = [e for e in self.endpoints if e.failed_until <= now and e is not avoid]
        pool = healthy or [e for e in self.endpoints if e is not avoid] or self.endpoints
        fewest = min(e.num_in_flight for e in pool)
        return random.choice([e for e in pool if e.num_in_flight == fewest])

    async def _run_chunk(self, jobs: list[Job]) -> list[JobResult]:
        results: list[JobResult | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        last: _Endpoint | None = None
        reason = "not attempted"
        for attempt in range(self.max_attempts):
            if attempt:
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
            endpoint = self._pick(last)
            last = endpoint
            try:
                got = await self._post(endpoint, [jobs[i] for i in pending])
            except _Retryable as exc:
                reason = str(exc)
                endpoint.failed_until = time.monotonic() + _COOLDOWN_S
                continue
            still = []
            for i, result in zip(pending, got, strict=True):
                if result.status == "sandbox_error":
                    still.append(i)
                    reason = result.stderr
                results[i] = result
            pending = still
            if not pending:
                break
        for i in pending:
            previous = results[i]
            if previous is None or previous.status != "sandbox_error":
                results[i] = sandbox_error(
                    f"sandbox unavailable after {self.max_attempts} attempts: {reason}"
                )
        return [r for r in results if r is not None]

    async def _post(self, endpoint: _Endpoint, jobs: list[Job]) -> list[JobResult]:
        body = {
            "jobs": [{"code": j.code, "stdin": j.stdin, "timeout_s": j.timeout_s} for j in jobs]
        }
        endpoint.num_in_flight += len(jobs)
        try:
            async with self._limit:
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                async with self._http().post(
                    endpoint.url + "/v1/batch", json=body, timeout=timeout
                ) as resp:
                    if resp.status == 503 or resp.status >= 500:
                        raise _Retryable(f"{endpoint.url} answered {resp.status}")
                    if resp.status != 200:
                        raise ProtocolError(
                            f"{endpoint.url} rejected the request: {await resp.text()}"
                        )
                    payload = await resp.json()
            results = [result_from_wire(r) for r in payload["results"]]
            if len(results) != len(jobs):
                raise _Retryable(
                    f"{endpoint.url} answered {len(results)} results for {len(jobs)} jobs"
                )
            return results
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError, ValueError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            raise _Retryable(f"{endpoint.url}: {type(exc).__name__}: {exc}") from exc
        finally:
            endpoint.num_in_flight -= len(jobs)
