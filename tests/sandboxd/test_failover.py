"""Two daemons, one killed in the middle of a 5,000-job burst through the client: all answered
(batch and streaming requests)."""

from __future__ import annotations

import asyncio

import pytest

from sandboxd.client import SandboxClient, SandboxUnreachable
from sandboxd.spawn import spawn_daemon
from sandboxd.wire import Job


@pytest.mark.parametrize("stream", [False, True], ids=["batch", "stream"])
def test_kill_one_daemon_mid_burst_loses_nothing(stream):
    """stream: with `on_result` the client uses /v1/stream; a stream cut by the kill keeps what
    came back, and every job is told exactly once, with its final result."""
    first = spawn_daemon(workers=1, timeout_s=5.0)
    second = spawn_daemon(workers=1, timeout_s=5.0)
    jobs = [Job(code=f"print({i} + 1)") for i in range(5000)]
    told: dict[int, list] = {}
    on_result = (lambda i, r: told.setdefault(i, []).append(r)) if stream else None

    async def burst():
        num_in_flight_at_kill = 0
        async with SandboxClient(
            [first.url, second.url], timeout_s=120.0, max_attempts=4, batch_size=50
        ) as client:
            await client.check()
            task = asyncio.create_task(client.run_batch(jobs, on_result))
            while first.process.poll() is None:
                await asyncio.sleep(0.5)
                if client.endpoints[0].num_in_flight:
                    await asyncio.sleep(1.0)
                    num_in_flight_at_kill = client.endpoints[0].num_in_flight
                    first.kill()  # SIGKILL: its in-flight requests break mid-way
            return await task, num_in_flight_at_kill

    try:
        results, num_in_flight_at_kill = asyncio.run(burst())
    finally:
        first.kill()
        second.stop()
    assert num_in_flight_at_kill > 0  # the killed daemon really held jobs when it died
    assert len(results) == 5000
    assert [r.status for r in results] == ["ok"] * 5000
    assert [r.stdout for r in results] == [f"{i + 1}\n" for i in range(5000)]
    if stream:
        assert sorted(told) == list(range(5000))
        assert all(len(told[i]) == 1 and told[i][0] == results[i] for i in told)


def test_check_names_urls_when_nothing_answers():
    async def check():
        async with SandboxClient(["http://127.0.0.1:9"], timeout_s=2.0) as client:
            await client.check()

    with pytest.raises(SandboxUnreachable, match="127.0.0.1:9"):
        asyncio.run(check())


def test_unreachable_endpoint_becomes_sandbox_error():
    async def run():
        async with SandboxClient(["http://127.0.0.1:9"], timeout_s=2.0, max_attempts=2) as client:
            return await client.run(Job(code="print(1)"))

    result = asyncio.run(run())
    assert result.status == "sandbox_error" and "127.0.0.1:9" in result.stderr
