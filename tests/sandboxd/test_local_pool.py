"""LocalSandbox (in-process pool) and slot respawn after a zygote dies mid-job."""

from __future__ import annotations

import asyncio
import os
import signal

from sandboxd.pool import LocalSandbox, Pool, PoolConfig
from sandboxd.wire import Job


def test_local_sandbox_runs_batches_in_order():
    async def go():
        async with LocalSandbox(num_workers=2, timeout_s=2.0, preload=("math",)) as sandbox:
            results = await sandbox.run_batch([Job(code=f"print({i} ** 2)") for i in range(10)])
            single = await sandbox.run(Job(code="import math\nmath.factorial(5)"))
            return results, single

    results, single = asyncio.run(go())
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(10)]
    assert single.status == "ok" and single.stdout == "120\n"


def test_zygote_killed_mid_job_gives_sandbox_error_then_respawns():
    async def go():
        pool = Pool(PoolConfig(num_workers=1, timeout_s=5.0, preload=()))
        await pool.start()
        try:
            slow = pool.submit([Job(code="import time\ntime.sleep(3)")])[0]
            await asyncio.sleep(0.5)
            os.kill(pool.slots[0].pid, signal.SIGKILL)  # the slot process; its zygote follows
            broken = await slow
            after = await pool.run_batch([Job(code="print('alive')")])
            return broken, after[0], pool.stats.num_respawns
        finally:
            await pool.close()

    broken, after, num_respawns = asyncio.run(go())
    assert broken.status == "sandbox_error" and "respawned" in broken.stderr
    assert after.status == "ok" and after.stdout == "alive\n"
    assert num_respawns >= 1
