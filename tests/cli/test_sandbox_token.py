"""Commands that take `--sandbox` send the daemons' token, and never write it anywhere.

`rstar2 eval --endpoint` (the scripted loopback "model" of test_reward_leak.py, whose first turn
calls the Python tool) runs against a real sandbox daemon started with `--token-file`: with
`--sandbox-token-file` the tool call runs in that daemon; every file the run writes, its stdout and
its stderr are then searched for the token. Without the token, or with another one, the command
stops before any work with one line naming the daemon. rl-stage takes the file from its recipe
(`sandbox.token_file`) or `--sandbox-token-file`, and its resolved recipe names the file only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from clihelpers import OFFLINE, RSTAR2
from test_reward_leak import _scripted_server

from sandboxd.auth import TOKEN_ENV
from sandboxd.spawn import spawn_daemon

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-cli-4e8d1f0a9b7c6e5d3a2f1b0c9d8e7f6a"


def _run(*args: object, env_token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    if env_token is not None:
        env[TOKEN_ENV] = env_token
    return subprocess.run(
        [*RSTAR2, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, **OFFLINE},
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "sandbox.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def guarded(token_file):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    with spawn_daemon(
        workers=1, timeout_s=5.0, extra_args=("--token-file", str(token_file)), env=env
    ) as daemon:
        yield daemon


def _jobs_run(url: str) -> int:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        text = resp.read().decode()
    return sum(int(n) for n in re.findall(r'sandboxd_jobs_total\{status="\w+"\} (\d+)', text))


def _one_line_error(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert TOKEN not in res.stderr + res.stdout
    return lines[0]


def test_eval_through_an_authenticated_daemon_writes_the_token_nowhere(
    tmp_path, tiny_model_dir, token_file, guarded
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"question": "Compute 12*7+5.", "answer": "89"}) + "\n")
    out = tmp_path / "eval"
    jobs_before = _jobs_run(guarded.url)
    with _scripted_server(tokenizer, "honest") as url:
        common = ["eval", "--endpoint", url, "--tokenizer", tiny_model_dir, "--data", data,
                  "--samples", 1, "--max-turns", 3, "--max-response-tokens", 400,
                  "--sandbox", guarded.url]  # fmt: skip
        missing = _one_line_error(_run(*common, "--out", tmp_path / "no"))
        wrong = _one_line_error(_run(*common, "--out", tmp_path / "no", env_token="tok-other"))
        debug = _run(*common, "--out", tmp_path / "no", "--debug", env_token="tok-other-debug")
        res = _run(*common, "--out", out, "--sandbox-token-file", token_file)
    # a traceback (--debug) shows the same line and never the token that was sent
    assert debug.returncode == 2 and "answered 401 Unauthorized" in debug.stderr
    assert "Traceback" in debug.stderr and "tok-other-debug" not in debug.stderr + debug.stdout
    for line, says in ((missing, "none was sent"), (wrong, "refused the token")):
        assert f"the sandbox at {guarded.url} answered 401 Unauthorized" in line and says in line
    assert not (tmp_path / "no").exists()
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [c["status"] for c in row["tool_calls"]] == ["ok"]
    assert _jobs_run(guarded.url) == jobs_before + 1  # the tool call ran in the guarded daemon
    assert row["reward"] == 1.0
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) >= 2, written  # results and summary at least
    for path in written:
        assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in res.stdout + res.stderr
    assert TOKEN not in guarded.startup_line


def test_sandbox_token_file_without_sandbox_is_refused(tmp_path, tiny_model_dir, token_file):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"question": "1+1?"}) + "\n")
    line = _one_line_error(
        _run(
            *["rollout", "--model", tiny_model_dir, "--data", data],
            *["--out", tmp_path / "o.jsonl", "--sandbox-token-file", token_file],
        )
    )
    assert "--sandbox-token-file is for --sandbox URLs" in line


def _rl(tmp_path: Path, *extra: object) -> subprocess.CompletedProcess:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}", encoding="utf-8")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n", encoding="utf-8")
    return _run(
        *["rl-stage", "--recipe", REPO / "recipes/tiny/rl.yaml", "--out", tmp_path / "run"],
        *["--set", f"model={model}", "--set", f"data.train={good}"],
        *["--set", f"data.eval={good}"],
        *extra,
    )


def test_rl_stage_takes_the_token_file_from_its_recipe_or_option(tmp_path, token_file, guarded):
    line = _one_line_error(_rl(tmp_path, "--sandbox", guarded.url))
    assert f"the sandbox at {guarded.url} answered 401 Unauthorized" in line
    loose = tmp_path / "loose.token"
    loose.write_text(TOKEN)
    loose.chmod(0o644)
    line = _one_line_error(_rl(tmp_path, "--sandbox", guarded.url, "--sandbox-token-file", loose))
    assert "--sandbox-token-file: token file" in line and "chmod 600" in line
    # the right token gets past the sandbox check: the next one (the model folder's tokenizer:
    # config.json only) fails
    for extra in (
        ["--set", f"sandbox.token_file={token_file}"],
        ["--sandbox-token-file", token_file],
    ):
        res = _rl(tmp_path, "--sandbox", guarded.url, *extra)
        assert res.returncode != 0 and "tokenizer" in res.stderr, res.stderr[-3000:]
        assert "401" not in res.stderr and TOKEN not in res.stderr + res.stdout
    assert not (tmp_path / "run").exists()


def test_rl_resolved_recipe_names_the_file_never_the_token(tmp_path, token_file):
    from rstar2cli.recipe import dump_recipe, load_recipe
    from rstar2cli.rl.stage_recipe import RlRecipe

    sets = [f"sandbox.token_file={token_file}", "sandbox.urls=[http://127.0.0.1:1]"]
    recipe = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe, sets)
    dump_recipe(recipe, tmp_path / "recipe.yaml")
    text = (tmp_path / "recipe.yaml").read_text()
    assert f"token_file: {token_file}" in text and TOKEN not in text
