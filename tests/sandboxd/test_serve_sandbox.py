"""`rstar2 serve-sandbox`: the command is registered, documents its options and stays light."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from typer.testing import CliRunner

from rstar2cli.cli import app


def test_serve_sandbox_help_lists_options():
    result = CliRunner().invoke(app, ["serve-sandbox", "--help"])
    assert result.exit_code == 0
    for option in (
        "--host",
        "--port",
        "--workers",
        "--timeout-s",
        "--memory-mb",
        "--max-output-bytes",
    ):
        assert option in result.output


def test_serve_sandbox_module_imports_nothing_heavy():
    code = "import sys, rstar2cli.commands.serve_sandbox; print(sorted(m for m in ('torch', 'sandboxd.server', 'aiohttp') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.integration
def test_serve_sandbox_serves_and_stops_cleanly():
    cmd = [
        sys.executable,
        "-c",
        "from rstar2cli.cli import main; main()",
        "serve-sandbox",
        "--port",
        "0",
    ]
    cmd += ["--workers", "1", "--timeout-s", "2", "--preload", "math"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("sandboxd listening on http://127.0.0.1:") and "isolation:" in line
        url = re.search(r"http://[\d.]+:\d+", line).group(0)
        body = json.dumps({"jobs": [{"code": "import math\nmath.comb(10, 3)"}]}).encode()
        req = urllib.request.Request(
            url + "/v1/batch", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["results"][0]["stdout"] == "120\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


def test_daemon_exits_when_the_process_that_spawned_it_is_killed():
    # A parent killed with SIGKILL runs no cleanup; the daemon must not be left behind.
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, time; from sandboxd.server import spawn_daemon; "
        "h = spawn_daemon(workers=1); print(h.process.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        daemon_pid = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(daemon_pid, 0)
            except ProcessLookupError:
                break
            # reparented to init (or a subreaper): reap it if it is ours to reap
            try:
                os.waitpid(daemon_pid, os.WNOHANG)
            except ChildProcessError:
                pass
            with open(f"/proc/{daemon_pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    break
            time.sleep(0.2)
        else:
            os.kill(daemon_pid, signal.SIGKILL)
            raise AssertionError("the daemon outlived the process that spawned it")
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()
