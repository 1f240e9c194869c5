"""`rstar2 serve-sandbox`: run the sandbox daemon (sandboxd) on this node until interrupted.

A thin wrapper: options map one-to-one onto `python -m sandboxd`. The daemon prints one line
saying where it listens and which isolation layers are active, and a WARNING line for each layer
the host refuses. With `--token-file` (or $RSTAR2_SANDBOX_TOKEN) every endpoint but /healthz
wants the token; without one only a loopback `--host` is served, unless `--insecure-no-auth`.
Tested in tests/sandboxd/test_serve_sandbox.py (--help, and a real serve/stop).
"""

from __future__ import annotations

from pathlib import Path

import typer

from sandboxd.pool import DEFAULT_WORKERS, unimportable


def serve_sandbox(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind; loopback unless you expose it."
    ),
    port: int = typer.Option(
        8080, "--port", min=0, max=65535, help="Port to listen on (0 picks a free one)."
    ),
    workers: int = typer.Option(
        DEFAULT_WORKERS,
        "--workers",
        min=1,
        max=256,
        help="Worker slots (warm zygotes), about one per core.",
    ),
    timeout_s: float = typer.Option(
        10.0, "--timeout-s", min=0.01, help="Default and maximum wall time per job."
    ),
    memory_mb: int = typer.Option(
        1024,
        "--memory-mb",
        min=16,
        help="Memory a job may add: per process (address space) and all its processes together.",
    ),
    max_output_bytes: int = typer.Option(
        1_000_000, "--max-output-bytes", min=1, help="stdout+stderr cap per job."
    ),
    max_procs: int = typer.Option(64, "--max-procs", min=1, help="Processes + threads per slot."),
    disk_mb: int = typer.Option(64, "--disk-mb", min=1, help="Private tmpfs size per slot."),
    max_queue: int = typer.Option(
        100_000, "--max-queue", min=1, help="Queued jobs before answering 503."
    ),
    max_request_output_mb: float = typer.Option(
        256.0,
        "--max-request-output-mb",
        min=0.001,
        help="stdout+stderr of one request's jobs together; jobs past it come back cut.",
    ),
    idle_timeout_s: float = typer.Option(
        60.0,
        "--idle-timeout-s",
        min=0.01,
        help="A connection must send a whole request head within this (from its opening or its "
        "last answer), then its body within this; else it is closed, or answered 408.",
    ),
    preload: str = typer.Option(
        "", "--preload", help="Comma-separated modules each zygote imports (default: math stack)."
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        metavar="PATH",
        help="File holding the token clients must send (mode 600). Default: "
        "$RSTAR2_SANDBOX_TOKEN; without either, only a loopback --host is served.",
    ),
    insecure_no_auth: bool = typer.Option(
        False,
        "--insecure-no-auth",
        help="Serve a non-loopback --host without a token: anyone who reaches it runs code.",
    ),
) -> None:
    """Serve the Python tool sandbox over HTTP (native batch, SandboxFusion and code-judge APIs)."""
    import asyncio

    from rstar2cli.errors import UserError
    from sandboxd.auth import TokenError, check_bind, load_token
    from sandboxd.pool import PoolConfig
    from sandboxd.server import serve

    try:
        token = load_token(token_file)
        check_bind(host, token, insecure_no_auth)
    except TokenError as exc:
        raise UserError(str(exc)) from None

    config = PoolConfig(
        num_workers=workers,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_procs=max_procs,
        disk_mb=disk_mb,
        max_queue=max_queue,
        max_request_output_bytes=int(max_request_output_mb * 2**20),
    )
    if preload:
        config.preload = tuple(name.strip() for name in preload.split(",") if name.strip())
        if missing := unimportable(config.preload):
            raise UserError(f"--preload: no module named {', '.join(missing)}")
    try:
        asyncio.run(
            serve(
                config,
                host,
                port,
                idle_timeout_s=idle_timeout_s,
                token=token,
                insecure_no_auth=insecure_no_auth,
            )
        )
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
