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


def _serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from rstar2cli.cli import main; main()", "serve-sandbox", *args]


def test_ctrl_c_to_the_terminal_group_stops_quietly():
    # A terminal's Ctrl-C sends SIGINT to the whole foreground process group.
    import os

    cmd = _serve_cmd("--port", "0", "--workers", "1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout.readline().startswith("sandboxd listening on")
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


_DAEMON_CMD = [sys.executable, "-m", "sandboxd"]  # what the rstar2-sandboxd script runs


@pytest.mark.parametrize("daemon", [False, True], ids=["serve-sandbox", "rstar2-sandboxd"])
def test_unusable_address_or_preload_is_one_line_error(daemon):
    import socket

    def command(*args: str) -> list[str]:
        return [*_DAEMON_CMD, *args] if daemon else _serve_cmd(*args)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args, expect in (
            (["--port", port, "--workers", "1"], "cannot listen on 127.0.0.1:" + port),
            (["--port", "0", "--preload", "math,no_such_module_xyz"], "no_such_module_xyz"),
            (["--port", "0", "--preload", "no_pkg_xyz.sub"], "no_pkg_xyz.sub"),
        ):
            r = subprocess.run(command(*args), capture_output=True, text=True, timeout=120)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and expect in lines[0], r.stderr


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--workers", "0"], "--workers: 0 is not between 1 and 256"),
        (["--port", "http"], "--port: 'http' is not a valid int"),
        (["--timeout-s", "0"], "--timeout-s: 0 is not at least 0.01"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["--token-file", "/no/such/token"], "cannot read token file /no/such/token"),
    ],
)
def test_the_daemon_script_says_what_is_wrong_in_one_line(args, expect):
    r = subprocess.run([*_DAEMON_CMD, *args], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, r.stderr
    assert lines[0].startswith("sandboxd: error: ") and expect in lines[0], lines[0]


def test_daemon_exits_when_the_process_that_spawned_it_is_killed():
    # A parent killed with SIGKILL runs no cleanup; the daemon must not be left behind.
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, time; from sandboxd.spawn import spawn_daemon; "
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
