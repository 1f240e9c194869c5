"""The agent's ToolBatcher over both tool runners: the in-process pool and a real daemon."""

from __future__ import annotations

import asyncio

import pytest

from rstar2cli.agent.tools import ToolBatcher
from sandboxd.pool import LocalSandbox


@pytest.mark.parametrize("runner", ["in-process", "daemon"])
def test_tool_batcher_answers_a_short_call_before_a_long_one_of_its_tick(runner):
    """Two calls made in one tick share a batch request, yet the short one is answered while the
    long one still runs (a batch answered as a whole would hold it ~3 s): with the in-process pool,
    and through the client and a real daemon on loopback (/v1/stream)."""
    from sandboxd.client import SandboxClient
    from sandboxd.spawn import spawn_daemon
    from sandboxd.wire import Job

    async def go(sandbox):
        async with sandbox:
            batcher = ToolBatcher(sandbox)
            await batcher.run(Job("print(0)"))  # start the pool outside the calls compared
            done = []

            async def call(name, code):
                result = await batcher.run(Job(code))
                done.append((name, result.stdout.strip(), batcher.num_in_flight))

            await asyncio.gather(
                call("long", "import time\ntime.sleep(3.0)\nprint('long')"),
                call("short", "print('short')"),
            )
            return done

    if runner == "in-process":
        done = asyncio.run(go(LocalSandbox(num_workers=2, timeout_s=5.0)))
    else:
        daemon = spawn_daemon(workers=2, timeout_s=5.0)
        try:
            done = asyncio.run(go(SandboxClient([daemon.url], timeout_s=30.0)))
        finally:
            daemon.stop()
    # the short call came back first, with the long one still in flight
    assert done == [("short", "short", 1), ("long", "long", 0)]
