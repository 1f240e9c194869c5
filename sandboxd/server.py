"""HTTP front of sandboxd (aiohttp) and its entry point (`spawn_daemon` is in sandboxd/spawn.py).

Endpoints (loopback by default):
  POST /v1/batch             native: {"jobs": [{"code","stdin","timeout_s"}]} -> {"results": [...]}
  POST /v1/stream            the same jobs; answers NDJSON, one {"index", "result"} line per job as
                             it finishes (a short job never waits for a long one of its batch)
  POST /run_code, GET /v1/ping   SandboxFusion-compatible (python only)
  POST /run, /run/batch, /run/long-batch   code-judge-compatible (python only)
  GET  /healthz              {"ok", "workers_alive", "isolation"}
  GET  /metrics              Prometheus text
With a token (`--token-file`, or $RSTAR2_SANDBOX_TOKEN) every endpoint but /healthz answers 401
unless the request carries `Authorization: Bearer <token>`; without one the daemon listens only on
loopback, unless `--insecure-no-auth` (sandboxd.auth). A full queue or a draining daemon answers 503 (code-judge results carry reason "queue_timeout").
Malformed requests get 400 with a one-line message. A connection that has not sent a whole request
head within `idle_timeout_s` of opening (or of its last answer) is closed, and a body that has not
arrived within it is answered 408: a client sending its headers or body a byte at a time holds no
connection for long. SIGTERM drains: no new jobs, in-flight and queued jobs are answered, then the
process exits.

What it does not: execute anything itself (sandboxd.pool) or retry (sandboxd.client).
Tested in tests/sandboxd/test_sandbox_api.py, test_wire_compat.py, test_failover.py and test_auth.py
with real daemons.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from aiohttp import web

from sandboxd import wire
from sandboxd.auth import TokenError, auth_summary, check_bind, load_token, token_matches
from sandboxd.pool import (
    DEFAULT_WORKERS,
    LATENCY_BUCKETS_S,
    Pool,
    PoolConfig,
    QueueFull,
    unimportable,
)
from sandboxd.wire import READY_PREFIX, Job, JobResult, ProtocolError

_MAX_BODY_BYTES = 512 * 2**20
IDLE_TIMEOUT_S = 60.0  # default: a request head and then its body must each come within it
_LINGERING_S = 10.0  # aiohttp's own


class _Service:
    def __init__(self, pool: Pool, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.pool = pool
        self.idle_timeout_s = idle_timeout_s
        self.draining = False

    async def _body(self, request: web.Request) -> Any:
        try:
            raw = await asyncio.wait_for(request.read(), self.idle_timeout_s)
        except asyncio.TimeoutError:
            late = web.HTTPRequestTimeout(
                text=_err(f"the request body did not arrive within {self.idle_timeout_s:g} s"),
                content_type="application/json",
            )
            late.force_close()  # NOTE: the rest of the body may still come: not a next request
            raise late from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested deep
            raise web.HTTPBadRequest(
                text=_err("the request body is not valid JSON"), content_type="application/json"
            ) from None

    def _submit(self, jobs: list[Job]) -> list[asyncio.Future[JobResult]]:
        if self.draining:
            raise QueueFull("the daemon is shutting down")
        return self.pool.submit(jobs)

    async def _execute(self, jobs: list[Job]) -> list[JobResult]:
        return await asyncio.gather(*self._submit(jobs))

    async def _native(self, request: web.Request, parse: Any, render: Any) -> web.Response:
        body = await self._body(request)
        try:
            jobs, extra = parse(body)
        except ProtocolError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        try:
            results = await self._execute(jobs)
        except QueueFull as exc:
            return render(None, extra, str(exc))
        return render(results, extra, None)

    async def batch(self, request: web.Request) -> web.Response:
        def render(results: list[JobResult] | None, _extra: Any, busy: str | None) -> web.Response:
            if results is None:
                return web.json_response({"error": busy}, status=503)
            return web.json_response({"results": [r.to_wire() for r in results]})

        return await self._native(request, lambda b: (wire.jobs_from_batch(b), None), render)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        try:
            jobs = wire.jobs_from_batch(body)
        except ProtocolError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        try:
            futures = self._submit(jobs)
        except QueueFull as exc:
            return web.json_response({"error": str(exc)}, status=503)
        finished: asyncio.Queue[tuple[int, asyncio.Future[JobResult]]] = asyncio.Queue()
        for i, fut in enumerate(futures):
            fut.add_done_callback(functools.partial(_put_indexed, finished, i))
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        left = len(futures)
        try:
            await resp.prepare(request)
            while left:  # jobs that finished meanwhile share one write
                chunk = [await finished.get()]
                while not finished.empty():
                    chunk.append(finished.get_nowait())
                left -= len(chunk)
                lines = (json.dumps({"index": i, "result": _wire(f)}) + "\n" for i, f in chunk)
                await resp.write("".join(lines).encode())
            await resp.write_eof()
        except ConnectionResetError:  # the client left: its jobs not started are dropped
            pass
        finally:
            for fut in futures:
                fut.cancel()  # a no-op on the finished ones
        return resp

    async def run_code(self, request: web.Request) -> web.Response:
        def render(results: list[JobResult] | None, _extra: Any, busy: str | None) -> web.Response:
            if results is None:  # SandboxFusion clients retry on non-200
                return web.json_response({"status": "SandboxError", "message": busy}, status=503)
            return web.json_response(wire.result_to_fusion(results[0]))

        return await self._native(request, lambda b: ([wire.job_from_fusion(b)], None), render)

    async def ping(self, _request: web.Request) -> web.Response:
        return web.json_response("pong")

    async def cj_run(self, request: web.Request) -> web.Response:
        def parse(body: Any) -> tuple[list[Job], Any]:
            job, meta = wire.job_from_code_judge(body)
            return [job], meta

        def render(results: list[JobResult] | None, meta: Any, busy: str | None) -> web.Response:
            if results is None:
                busy_result = wire.sandbox_error(busy or "busy")
                return web.json_response(
                    wire.result_to_code_judge(busy_result, meta, "queue_timeout"), status=503
                )
            return web.json_response(wire.result_to_code_judge(results[0], meta))

        return await self._native(request, parse, render)

    async def cj_batch(self, request: web.Request) -> web.Response:
        def parse(body: Any) -> tuple[list[Job], Any]:
            jobs, metas, sub_id = wire.code_judge_batch(body)
            return jobs, (metas, sub_id)

        def render(results: list[JobResult] | None, extra: Any, busy: str | None) -> web.Response:
            metas, sub_id = extra
            if results is None:
                busy_result = wire.sandbox_error(busy or "busy")
                out = [wire.result_to_code_judge(busy_result, m, "queue_timeout") for m in metas]
                return web.json_response({"sub_id": sub_id, "results": out}, status=503)
            out = [wire.result_to_code_judge(r, m) for r, m in zip(results, metas, strict=True)]
            return web.json_response({"sub_id": sub_id, "results": out})

        return await self._native(request, parse, render)

    async def healthz(self, _request: web.Request) -> web.Response:
        alive = self.pool.num_alive
        body = {
            "ok": alive > 0 and not self.draining,
            "workers_alive": alive,
            "workers": len(self.pool.slots),
            "isolation": self.pool.layers,
        }
        return web.json_response(body, status=200 if body["ok"] else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=render_metrics(self.pool), content_type="text/plain")


def _put_indexed(queue: asyncio.Queue, index: int, fut: asyncio.Future[JobResult]) -> None:
    queue.put_nowait((index, fut))


def _wire(fut: asyncio.Future[JobResult]) -> dict[str, Any]:
    if fut.cancelled() or fut.exception() is not None:
        return wire.sandbox_error(f"the job was lost: {fut}").to_wire()
    return fut.result().to_wire()


def _err(message: str) -> str:
    return json.dumps({"error": message})


def render_metrics(pool: Pool) -> str:
    s = pool.stats
    lines = [
        "# TYPE sandboxd_queue_depth gauge",
        f"sandboxd_queue_depth {s.num_queued}",
        "# TYPE sandboxd_in_flight gauge",
        f"sandboxd_in_flight {s.num_in_flight}",
        "# TYPE sandboxd_workers_alive gauge",
        f"sandboxd_workers_alive {pool.num_alive}",
        "# TYPE sandboxd_rejected_total counter",
        f"sandboxd_rejected_total {s.num_rejected}",
        "# TYPE sandboxd_respawns_total counter",
        f"sandboxd_respawns_total {s.num_respawns}",
        "# TYPE sandboxd_abandoned_total counter",
        f"sandboxd_abandoned_total {s.num_abandoned}",
        "# TYPE sandboxd_jobs_total counter",
    ]
    lines += [f'sandboxd_jobs_total{{status="{k}"}} {v}' for k, v in s.totals.items()]
    lines.append("# TYPE sandboxd_job_latency_seconds histogram")
    cumulative = 0
    for bound, count in zip(LATENCY_BUCKETS_S + (float("inf"),), s.bucket_counts, strict=True):
        cumulative += count
        le = "+Inf" if bound == float("inf") else repr(bound)
        lines.append(f'sandboxd_job_latency_seconds_bucket{{le="{le}"}} {cumulative}')
    lines.append(f"sandboxd_job_latency_seconds_sum {s.latency_sum_s:.6f}")
    lines.append(f"sandboxd_job_latency_seconds_count {cumulative}")
    return "\n".join(lines) + "\n"


def _require_token(token: str) -> Any:
    """Middleware: 401 for any request but /healthz without `Authorization: Bearer <token>`."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/healthz" or token_matches(request.headers.get("Authorization"), token):
            return await handler(request)
        return web.json_response(
            {"error": "missing or wrong token: send Authorization: Bearer <token>"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="sandboxd"'},
        )

    return check


def build_app(
    pool: Pool, idle_timeout_s: float = IDLE_TIMEOUT_S, token: str | None = None
) -> tuple[web.Application, _Service]:
    service = _Service(pool, idle_timeout_s)
    middlewares = [] if token is None else [_require_token(token)]
    app = web.Application(client_max_size=_MAX_BODY_BYTES, middlewares=middlewares)
    app.add_routes(
        [
            web.post("/v1/batch", service.batch),
            web.post("/v1/stream", service.stream),
            web.post("/run_code", service.run_code),
            web.get("/v1/ping", service.ping),
            web.post("/run", service.cj_run),
            web.post("/run/batch", service.cj_batch),
            web.post("/run/long-batch", service.cj_batch),
            web.get("/healthz", service.healthz),
            web.get("/metrics", service.metrics),
        ]
    )
    return app, service


def describe_isolation(layers: dict[str, Any]) -> tuple[str, list[str]]:
    return ", ".join(layers.get("active", [])) or "none", list(layers.get("warnings", []))


async def serve(
    config: PoolConfig,
    host: str = "127.0.0.1",
    port: int = 8080,
    drain_s: float = 60.0,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    token: str | None = None,
    insecure_no_auth: bool = False,
) -> None:
    """Run the daemon until SIGTERM/SIGINT; then drain and exit. Without `token` it serves
    loopback only, unless `insecure_no_auth` (raises TokenError before starting anything)."""
    check_bind(host, token, insecure_no_auth)
    pool = Pool(config)
    await pool.start()
    app, service = build_app(pool, idle_timeout_s, token)
    # NOTE: handler_cancellation: a client that disconnects cancels its request's handler, and
    # with it the futures of its jobs still queued, which the pool then drops unrun.
    # keepalive_timeout: aiohttp closes a connection whose request head is not whole by then,
    # counted from its opening or its last answer (its own default is an hour). lingering_time:
    # how long it reads and drops the rest of a body it answered early (408) before closing
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        keepalive_timeout=idle_timeout_s,
        lingering_time=min(_LINGERING_S, idle_timeout_s),
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    try:
        await site.start()
    except OSError:  # the address is taken or not ours: stop the slots before saying so
        await runner.cleanup()
        await pool.close()
        raise
    bound_port = runner.addresses[0][1]
    stop = asyncio.Event()  # set up before the ready line: a signal right after it stops cleanly
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    active, warnings = describe_isolation(pool.layers)
    print(
        f"{READY_PREFIX}http://{host}:{bound_port} ({config.num_workers} workers, timeout {config.timeout_s:g} s, "
        f"memory {config.memory_mb} MB, output {config.max_output_bytes} B); isolation: {active}; "
        f"auth: {auth_summary(token, insecure_no_auth)}",
        flush=True,
    )
    for warning in warnings:
        print(
            f"WARNING: sandboxd isolation layer not active: {warning}", file=sys.stderr, flush=True
        )
    await stop.wait()
    service.draining = True
    end = time.monotonic() + drain_s
    while not pool.idle and time.monotonic() < end:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # let handlers write their responses
    await runner.cleanup()
    await pool.close()


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2, as `rstar2 serve-sandbox` has."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message} (see {self.prog} --help)")


def _fail(message: str) -> NoReturn:
    print(f"sandboxd: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _bounded(kind: type, low: float, high: float | None = None) -> Callable[[str], Any]:
    """An argparse type: `kind(text)` within [low, high], else one line saying the range."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if value < low or (high is not None and value > high):
            span = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"{text} is not {span}")
        return value

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The daemon's options, with the bounds `rstar2 serve-sandbox` gives the same ones."""
    script = os.path.basename(sys.argv[0])
    p = _OneLineParser(
        prog=script if script == "rstar2-sandboxd" else "python -m sandboxd",
        description="Python tool-execution daemon.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    p.add_argument(
        "--port", type=_bounded(int, 0, 65535), default=8080, help="port (0 picks a free one)"
    )
    p.add_argument(
        "--workers",
        type=_bounded(int, 1, 256),
        default=DEFAULT_WORKERS,
        help=f"worker slots (warm zygotes), about one per core (default {DEFAULT_WORKERS})",
    )
    p.add_argument(
        "--timeout-s",
        type=_bounded(float, 0.01),
        default=10.0,
        help="default and maximum wall time per job",
    )
    p.add_argument(
        "--memory-mb",
        type=_bounded(int, 16),
        default=1024,
        help="memory a job may add: per process (address space) and all its processes together",
    )
    p.add_argument("--max-output-bytes", type=_bounded(int, 1), default=1_000_000)
    p.add_argument(
        "--max-procs", type=_bounded(int, 1), default=64, help="processes + threads per slot"
    )
    p.add_argument(
        "--disk-mb", type=_bounded(int, 1), default=64, help="private tmpfs size per slot"
    )
    p.add_argument("--max-queue", type=_bounded(int, 1), default=100_000)
    p.add_argument(
        "--max-request-output-mb",
        type=_bounded(float, 0.001),
        default=256.0,
        help="stdout + stderr of one request's jobs together; past it they come back cut",
    )
    p.add_argument(
        "--idle-timeout-s",
        type=_bounded(float, 0.01),
        default=IDLE_TIMEOUT_S,
        help="a connection must send a whole request head within this (from its opening or its "
        "last answer), and then the body within this, or it is closed / answered 408",
    )
    p.add_argument(
        "--preload", default=None, help="comma-separated modules to import in the zygote"
    )
    p.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="file holding the token clients must send (Authorization: Bearer); mode 600. "
        "Default: $RSTAR2_SANDBOX_TOKEN; without either, only a loopback --host is served",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve a non-loopback --host without a token: anyone who reaches it runs code",
    )
    p.add_argument(
        "--exit-with-parent",
        type=int,
        default=None,
        metavar="PID",
        help="drain and exit when process PID (the parent that started the daemon) dies",
    )
    return p


def config_from_args(args: argparse.Namespace) -> PoolConfig:
    config = PoolConfig(
        num_workers=args.workers,
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
        max_output_bytes=args.max_output_bytes,
        max_procs=args.max_procs,
        disk_mb=args.disk_mb,
        max_queue=args.max_queue,
        max_request_output_bytes=int(args.max_request_output_mb * 2**20),
    )
    if args.preload is not None:
        config.preload = tuple(m for m in args.preload.split(",") if m)
    return config


def main(argv: list[str] | None = None) -> None:
    """The `rstar2-sandboxd` script: bad input is one line on stderr and exit code 2."""
    args = parse_args(argv)
    if args.exit_with_parent is not None:
        # NOTE: a parent killed by SIGTERM/SIGKILL never runs its cleanup; the kernel's
        # parent-death signal turns that into our own graceful SIGTERM drain. Checked after
        # arming it, in case the parent died first.
        from sandboxd.isolation import set_parent_death_signal

        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != args.exit_with_parent:
            sys.exit("sandboxd: the parent that started this daemon is gone")
    try:
        token = load_token(args.token_file)
        check_bind(args.host, token, args.insecure_no_auth)
    except TokenError as exc:
        _fail(str(exc))
    config = config_from_args(args)
    if args.preload is not None and (missing := unimportable(config.preload)):
        _fail(f"--preload: no module named {', '.join(missing)}")
    try:
        asyncio.run(
            serve(
                config,
                args.host,
                args.port,
                idle_timeout_s=args.idle_timeout_s,
                token=token,
                insecure_no_auth=args.insecure_no_auth,
            )
        )
    except OSError as exc:
        _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
