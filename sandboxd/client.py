"""Async client for one or more sandboxd daemons: batching, least-in-flight balancing, retries.

What it does: `run_batch(jobs)` splits jobs into chunks and sends each chunk to the endpoint with
the fewest jobs in flight (skipping endpoints that failed recently): POST /v1/batch, or, with
`on_result`, POST /v1/stream, where each result comes back (and `on_result` hears of it) as its
job finishes. It retries on another endpoint only infrastructure failures: connection errors,
HTTP 503, per-call timeouts, and results with status `sandbox_error`; a stream cut part way
keeps what came back and sends only the rest again. Whatever still fails after `max_attempts` becomes a
`JobResult(status="sandbox_error")`; results come back in the order the jobs were given.

Every request carries `Authorization: Bearer <token>` when a token is given (`token_file`, else
$RSTAR2_SANDBOX_TOKEN; sandboxd.auth). A daemon answering 401 is a setup error, not an outage:
`SandboxUnauthorized` (one line, naming the URL, never the token) is raised at once, without retry.

What it does not: retry a snippet's own failures (error, timeout, memory, output_limit are
answers, not infrastructure faults), or start daemons (sandboxd.spawn.spawn_daemon does).

Tested in tests/sandboxd/test_failover.py (two daemons, one killed mid-burst; unreachable URLs) and
test_auth.py (no, wrong and right tokens against a real daemon).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from sandboxd.auth import SandboxUnauthorized, load_token
from sandboxd.wire import Job, JobResult, ProtocolError, result_from_wire, sandbox_error

_COOLDOWN_S = 2.0


__all__ = ["SandboxClient", "SandboxUnauthorized", "SandboxUnreachable"]


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
        token_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """`token_file`: the file holding the daemons' token; None: $RSTAR2_SANDBOX_TOKEN, if
        set (a bad file or variable raises sandboxd.auth.TokenError)."""
        if not urls:
            raise ValueError("SandboxClient needs at least one URL")
        token = load_token(token_file)
        # NOTE: kept only inside the session's default headers, never in an attribute of ours
        self._headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self.endpoints = [_Endpoint(u.rstrip("/")) for u in urls]
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.batch_size = batch_size
        self._limit = asyncio.Semaphore(max_requests_per_endpoint * len(urls))
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, force_close=False)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def check(self) -> list[str]:
        """The URLs that did not answer /healthz (asked all at once); raises SandboxUnreachable
        (naming the URLs) when none did, and SandboxUnauthorized when one that did refuses the
        token (asked through the authenticated GET /v1/ping)."""
        timeout = aiohttp.ClientTimeout(total=min(self.timeout_s, 10.0))

        async def healthy(endpoint: _Endpoint) -> bool:
            try:
                async with self._http().get(endpoint.url + "/healthz", timeout=timeout) as resp:
                    if resp.status != 200:
                        return False
                async with self._http().get(endpoint.url + "/v1/ping", timeout=timeout) as resp:
                    if resp.status == 401:
                        raise SandboxUnauthorized.at(endpoint.url, sent_token=bool(self._headers))
                    return True
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return False

        answers = await asyncio.gather(*(healthy(e) for e in self.endpoints))
        if not any(answers):
            raise SandboxUnreachable(
                "no sandbox answered /healthz at " + ", ".join(e.url for e in self.endpoints)
            )
        return [e.url for e, ok in zip(self.endpoints, answers, strict=True) if not ok]

    async def run(self, job: Job) -> JobResult:
        return (await self.run_batch([job]))[0]

    async def run_batch(
        self, jobs: list[Job], on_result: Callable[[int, JobResult], None] | None = None
    ) -> list[JobResult]:
        """Results in the order of `jobs`. `on_result(i, result)`, when given, is called once per
        job with its final result as soon as that job is answered (the daemon streams each result
        back as it finishes), so a short job need not wait for the slowest of its batch. Without
        it the whole batch is answered at once, which costs the daemon less per job."""
        chunks = range(0, len(jobs), self.batch_size)
        parts = await asyncio.gather(
            *(self._run_chunk(jobs[i : i + self.batch_size], i, on_result) for i in chunks)
        )
        return [r for part in parts for r in part]

    def _pick(self, avoid: _Endpoint | None) -> _Endpoint:
        now = time.monotonic()
        healthy = [e for e in self.endpoints if e.failed_until <= now and e is not avoid]
        pool = healthy or [e for e in self.endpoints if e is not avoid] or self.endpoints
        fewest = min(e.num_in_flight for e in pool)
        return random.choice([e for e in pool if e.num_in_flight == fewest])

    async def _run_chunk(
        self,
        jobs: list[Job],
        offset: int,
        on_result: Callable[[int, JobResult], None] | None,
    ) -> list[JobResult]:
        results: list[JobResult | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        last: _Endpoint | None = None
        reason = "not attempted"
        for attempt in range(self.max_attempts):
            if attempt:
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
            endpoint = self._pick(last)
            last = endpoint
            sent = list(pending)

            def take(pos: int, result: JobResult, sent: list[int] = sent) -> None:
                i = sent[pos]
                results[i] = result
                if result.status != "sandbox_error" and on_result is not None:
                    on_result(offset + i, result)

            try:
                await self._post(endpoint, [jobs[i] for i in sent], take, on_result is not None)
            except _Retryable as exc:
                reason = str(exc)
                endpoint.failed_until = time.monotonic() + _COOLDOWN_S
            # what came back before a failure is kept; infrastructure errors are sent again
            pending = []
            for i in sent:
                got = results[i]
                if got is None or got.status == "sandbox_error":
                    pending.append(i)
                    reason = got.stderr if got is not None else reason
            if not pending:
                break
        for i in pending:  # never answered, or answered sandbox_error every time (kept)
            final = results[i] or sandbox_error(
                f"sandbox unavailable after {self.max_attempts} attempts: {reason}"
            )
            results[i] = final
            if on_result is not None:
                on_result(offset + i, final)
        return [r for r in results if r is not None]

    async def _post(
        self,
        endpoint: _Endpoint,
        jobs: list[Job],
        take: Callable[[int, JobResult], None],
        stream: bool,
    ) -> None:
        """Send `jobs` and hand each result to `take(position, result)`: with `stream`, through
        /v1/stream as each line arrives; else through /v1/batch (one answer, cheaper per job).
        Raises _Retryable when the endpoint fails, including part way through a stream."""
        body = {
            "jobs": [{"code": j.code, "stdin": j.stdin, "timeout_s": j.timeout_s} for j in jobs]
        }
        seen: set[int] = set()

        def accept(pos: Any, wire: Any) -> None:
            if not isinstance(pos, int) or not 0 <= pos < len(jobs) or pos in seen:
                raise _Retryable(f"{endpoint.url} answered a bad index {pos!r}")
            seen.add(pos)
            take(pos, result_from_wire(wire))

        endpoint.num_in_flight += len(jobs)
        try:
            async with self._limit:
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                path = "/v1/stream" if stream else "/v1/batch"
                async with self._http().post(
                    endpoint.url + path, json=body, timeout=timeout
                ) as resp:
                    if resp.status == 401:
                        raise SandboxUnauthorized.at(endpoint.url, sent_token=bool(self._headers))
                    if resp.status >= 500:
                        raise _Retryable(f"{endpoint.url} answered {resp.status}")
                    if resp.status != 200:
                        raise ProtocolError(
                            f"{endpoint.url} rejected the request: {await resp.text()}"
                        )
                    if stream:
                        async for line in resp.content:
                            if line.strip():
                                item = json.loads(line)
                                accept(item["index"], item["result"])
                    else:
                        for pos, wire in enumerate((await resp.json())["results"]):
                            accept(pos, wire)
            if len(seen) != len(jobs):
                raise _Retryable(f"{endpoint.url} answered {len(seen)} of {len(jobs)} jobs")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError, ValueError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            raise _Retryable(f"{endpoint.url}: {type(exc).__name__}: {exc}") from exc
        finally:
            endpoint.num_in_flight -= len(jobs)
