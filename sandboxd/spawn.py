"""Start a sandbox daemon as a child process on loopback and wait until it answers: for tests,
scripts and `rstar2 quickstart`.

`spawn_daemon` runs `python -m sandboxd` on 127.0.0.1 (a free port by default), reads its ready
line, checks /healthz and hands back a `DaemonHandle` (a context manager that drains it with
SIGTERM on exit). The daemon dies with its parent (`--exit-with-parent`). What it does not do:
bind anywhere but loopback, or manage daemons on other hosts. Used by every daemon test
(tests/sandboxd, tests/cli/test_sandbox_token.py, tests/integration).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from sandboxd.pool import DEFAULT_WORKERS
from sandboxd.wire import READY_PREFIX


@dataclass
class DaemonHandle:
    url: str
    process: subprocess.Popen[str]
    startup_line: str

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (graceful drain), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def kill(self) -> None:
        """SIGKILL, no drain (the zygotes follow through their parent-death signals)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def __enter__(self) -> DaemonHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_daemon(
    workers: int = DEFAULT_WORKERS,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    port: int = 0,
    max_output_bytes: int = 1_000_000,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 120.0,
) -> DaemonHandle:
    """Start `python -m sandboxd` on 127.0.0.1 and wait until /healthz answers."""
    cmd = [
        sys.executable,
        "-m",
        "sandboxd",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--timeout-s",
        str(timeout_s),
        "--memory-mb",
        str(memory_mb),
        "--max-output-bytes",
        str(max_output_bytes),
        "--exit-with-parent",
        str(os.getpid()),
        *extra_args,
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = root + os.pathsep + full_env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=full_env)
    assert proc.stdout is not None
    deadline = time.monotonic() + startup_timeout_s
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise RuntimeError(f"sandboxd exited during start-up (code {proc.returncode})")
        if line.startswith(READY_PREFIX):
            break
    match = re.search(r"http://[\d.]+:\d+", line)
    if match is None:
        proc.kill()
        raise RuntimeError("sandboxd did not report its address")
    handle = DaemonHandle(url=match.group(0), process=proc, startup_line=line.strip())
    with urllib.request.urlopen(handle.url + "/healthz", timeout=10) as resp:
        if resp.status != 200:
            handle.kill()
            raise RuntimeError("sandboxd /healthz did not answer 200")
    return handle
