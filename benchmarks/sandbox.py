"""Benchmark: sandboxd (warm zygote, fork per job, full isolation) vs a fresh `python3` per call.

The baseline is the code-judge model: write the snippet to a file and start a new interpreter per
call, with the same rlimits (CPU, address space, file size, open files) and the same number of
concurrent workers. Both run in this one process's run, on this machine, side by side.

Prints, per snippet (trivial print, sympy factor/solve, numpy array op): calls/s at peak for each
executor and their ratio; p50/p99 latency of single-job requests sent open-loop at half the
daemon's peak rate (and the baseline's per-call latency); how long calls sent together (as a
rollout's tool calls of one tick are) wait for their answers, whole batch vs streamed; then a
burst of --burst jobs (default 45,000) through the client, counting answers by status. Not a
test: it asserts nothing.

    python -m benchmarks.sandbox [--workers 2] [--burst 45000] [--scale 1.0] [--rounds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from collections import Counter

from sandboxd.client import SandboxClient
from sandboxd.spawn import spawn_daemon
from sandboxd.wire import Job, JobResult

SNIPPETS = {
    "trivial": "print(2**100)",
    "sympy": "import sympy as sp\nx = sp.symbols('x')\nprint(sp.factor(x**4 - 1), sp.solve(x**2 - 5*x + 6, x))",
    "numpy": "import numpy as np\na = np.arange(10000, dtype=np.float64).reshape(100, 100)\nprint(float((a @ a.T).trace()))",
}
# calls per measurement (daemon, baseline); the baseline is slow, so it gets fewer
NUM_CALLS = {"trivial": (1000, 100), "sympy": (300, 16), "numpy": (500, 40)}
TIMEOUT_S, MEMORY_MB = 10.0, 1024


def _baseline_limits() -> None:
    cpu = int(TIMEOUT_S) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_MB * 2**20 * 2, MEMORY_MB * 2**20 * 2))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


async def _baseline_call(code: str, workdir: str) -> tuple[float, bool]:
    start = time.perf_counter()
    with tempfile.NamedTemporaryFile("w", suffix=".py", dir=workdir, delete=False) as f:
        f.write(code)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        f.name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_baseline_limits,
        cwd=workdir,
        env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"},
    )
    try:
        await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
    os.unlink(f.name)
    return time.perf_counter() - start, proc.returncode == 0


async def baseline(code: str, num_calls: int, num_workers: int) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    num_ok = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num_calls):
        queue.put_nowait(i)

    async def worker(workdir: str) -> None:
        nonlocal num_ok
        while not queue.empty():
            queue.get_nowait()
            latency, ok = await _baseline_call(code, workdir)
            latencies.append(latency)
            num_ok += ok

    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        await asyncio.gather(*(worker(workdir) for _ in range(num_workers)))
        elapsed = time.perf_counter() - start
    return num_calls / elapsed, latencies, num_ok


async def daemon_peak(client: SandboxClient, code: str, num_calls: int) -> tuple[float, int]:
    start = time.perf_counter()
    results = await client.run_batch([Job(code=code)] * num_calls)
    return num_calls / (time.perf_counter() - start), sum(r.status == "ok" for r in results)


async def daemon_latency(
    client: SandboxClient, code: str, rate: float, num_calls: int
) -> list[float]:
    """Single-job requests sent open-loop at `rate` per second; returns their latencies."""
    latencies: list[float] = []

    async def one() -> None:
        start = time.perf_counter()
        await client.run(Job(code=code))
        latencies.append(time.perf_counter() - start)

    tasks = []
    start = time.perf_counter()
    for i in range(num_calls):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    return latencies


async def calls_together(client: SandboxClient, rounds: int) -> tuple[float, float, float]:
    """Tool calls made in one event-loop tick share a batch request. Each round sends 4 jobs
    that sleep a mixed time (lognormal, median 150 ms, at most 1.5 s), once answered as a whole
    (/v1/batch) and once streamed (/v1/stream, each job answered when it finishes), alternating
    which goes first. Returns the mean time until a call is answered (batch, stream) and the mean
    sleep, in seconds."""
    import random

    rng = random.Random(0)
    waits: dict[str, list[float]] = {"batch": [], "stream": []}
    sleeps: list[float] = []
    for r in range(rounds):
        naps = [min(1.5, rng.lognormvariate(-1.9, 1.0)) for _ in range(4)]
        sleeps += naps
        jobs = [Job(code=f"import time\ntime.sleep({n:.3f})") for n in naps]
        for mode in ("batch", "stream") if r % 2 == 0 else ("stream", "batch"):
            start = time.perf_counter()
            if mode == "batch":
                await client.run_batch(jobs)
                waits[mode] += [time.perf_counter() - start] * len(jobs)
            else:
                answered: list[float] = []

                def on_result(_i: int, _r: JobResult, out: list[float] = answered) -> None:
                    out.append(time.perf_counter())

                await client.run_batch(jobs, on_result=on_result)
                waits[mode] += [t - start for t in answered]
    mean = {m: sum(w) / len(w) for m, w in waits.items()}
    return mean["batch"], mean["stream"], sum(sleeps) / len(sleeps)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def run(args: argparse.Namespace) -> None:
    handle = spawn_daemon(workers=args.workers, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB)
    rows = []
    try:
        async with SandboxClient([handle.url], timeout_s=600.0, batch_size=64) as client:
            await client.run_batch([Job(code=c) for c in SNIPPETS.values()] * 4)  # warm-up
            for name, code in SNIPPETS.items():
                n_daemon, n_base = (max(4, int(n * args.scale)) for n in NUM_CALLS[name])
                peak, ok_d = await daemon_peak(client, code, n_daemon)
                lat = await daemon_latency(
                    client, code, peak / 2, min(n_daemon, int(peak * 5) + 20)
                )
                base_rate, base_lat, ok_b = await baseline(code, n_base, args.workers)
                rows.append(
                    (
                        name,
                        peak,
                        base_rate,
                        _pct(lat, 0.5),
                        _pct(lat, 0.99),
                        _pct(base_lat, 0.5),
                        _pct(base_lat, 0.99),
                        ok_d == n_daemon and ok_b == n_base,
                    )
                )
            together = await calls_together(client, args.rounds)
            start = time.perf_counter()
            burst = await client.run_batch([Job(code=f"print({i} * 2)") for i in range(args.burst)])
            burst_s = time.perf_counter() - start
    finally:
        handle.stop()
    correct = sum(r.status == "ok" and r.stdout == f"{i * 2}\n" for i, r in enumerate(burst))
    _print(
        rows=rows,
        args=args,
        num_answered=len(burst),
        num_correct=correct,
        statuses=Counter(r.status for r in burst),
        burst_s=burst_s,
        startup_line=handle.startup_line,
        together=together,
    )


def _print(
    rows, args, num_answered, num_correct, statuses, burst_s, startup_line, together
) -> None:
    print(
        f"sandboxd vs fresh python3 per call; {args.workers} workers each; {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(startup_line)
    head = f"{'snippet':<8} {'ours/s':>8} {'base/s':>8} {'ratio':>7} {'p50 ms':>8} {'p99 ms':>8} {'base p50':>9} {'base p99':>9}  all ok"
    print(head)
    print("-" * len(head))
    for name, peak, base_rate, p50, p99, bp50, bp99, ok in rows:
        print(
            f"{name:<8} {peak:8.0f} {base_rate:8.1f} {peak / base_rate:6.1f}x {p50:8.1f} {p99:8.1f} "
            f"{bp50:9.1f} {bp99:9.1f}  {'yes' if ok else 'NO'}"
        )
    print(
        "(ours p50/p99: single-job requests at half our peak rate; base: per call at its own peak)"
    )
    batch_s, stream_s, sleep_s = together
    print(
        f"calls together: {args.rounds} rounds of 4 jobs sleeping {sleep_s * 1e3:.0f} ms on "
        f"average; mean time until a call is answered: whole batch {batch_s * 1e3:.0f} ms, "
        f"streamed {stream_s * 1e3:.0f} ms ({batch_s / stream_s:.2f}x)"
    )
    print(
        f"burst: {args.burst} jobs, {num_answered} answered, {num_correct} correct, "
        f"{dict(statuses)}, {burst_s:.1f} s, {args.burst / burst_s:.0f} jobs/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--burst", type=int, default=45_000)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of calls")
    parser.add_argument(
        "--rounds", type=int, default=12, help="rounds of the calls-together comparison"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
