"""Access control of sandboxd: the token's sources and checks, and real daemons on 127.0.0.1.

A daemon started with `--token-file` answers 401 on every endpoint but /healthz to a request
without the token or with another one, and runs the jobs of the right one; no job of a refused
request runs. A daemon refuses to listen beyond loopback without a token. The client sends the
token, and a 401 is raised at once as `SandboxUnauthorized`, naming the URL, never the token; the
tool batcher turns it into a UserError (the run stops), never into a `sandbox_error` result.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from rstar2cli.agent.tools import ToolBatcher
from rstar2cli.errors import UserError
from sandboxd.auth import (
    TOKEN_ENV,
    SandboxUnauthorized,
    TokenError,
    check_bind,
    is_loopback,
    load_token,
    token_matches,
)
from sandboxd.client import SandboxClient
from sandboxd.spawn import spawn_daemon
from sandboxd.wire import Job

TOKEN = "tok-9f3c2a7e5d1b48c6a0e2f4d6b8c1a3e5"
OTHER = "tok-00000000000000000000000000000000"
JOB = {"code": "print(6*7)"}
# (method, path, body) of every endpoint but /healthz
ENDPOINTS = [
    ("POST", "/v1/batch", {"jobs": [JOB]}),
    ("POST", "/v1/stream", {"jobs": [JOB]}),
    ("POST", "/run_code", {"code": JOB["code"], "language": "python"}),
    ("POST", "/run", {"type": "python", "solution": JOB["code"]}),
    ("POST", "/run/batch", {"submissions": [{"type": "python", "solution": JOB["code"]}]}),
    ("POST", "/run/long-batch", {"submissions": [{"type": "python", "solution": JOB["code"]}]}),
    ("GET", "/v1/ping", None),
    ("GET", "/metrics", None),
]


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def _token_file(tmp_path, text: str = TOKEN + "\n", mode: int = 0o600):
    path = tmp_path / "sandbox.token"
    path.write_text(text)
    path.chmod(mode)
    return path


def _call(url: str, method: str, body: object, headers: dict[str, str]) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------- the token and the bind rule


def test_token_file_is_read_stripped_and_beats_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, OTHER)
    assert load_token(_token_file(tmp_path)) == TOKEN
    assert load_token(None) == OTHER
    monkeypatch.delenv(TOKEN_ENV)
    assert load_token(None) is None


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        ("\n", 0o600, "is empty"),
        (TOKEN, 0o644, "chmod 600"),
        (TOKEN, 0o640, "may be read by other users"),
        (TOKEN + " second-word", 0o600, "one word of printable ASCII"),
    ],
)
def test_a_bad_token_file_is_refused_without_showing_it(tmp_path, text, mode, message):
    with pytest.raises(TokenError, match=message) as err:
        load_token(_token_file(tmp_path, text, mode))
    assert TOKEN not in str(err.value)


def test_a_missing_token_file_and_an_empty_variable_are_refused(tmp_path, monkeypatch):
    with pytest.raises(TokenError, match="cannot read token file"):
        load_token(tmp_path / "nope")
    monkeypatch.setenv(TOKEN_ENV, " ")
    with pytest.raises(TokenError, match=f"\\${TOKEN_ENV} is empty"):
        load_token(None)


def test_header_match_is_bearer_and_exact():
    assert token_matches(f"Bearer {TOKEN}", TOKEN) and token_matches(f"bearer {TOKEN}", TOKEN)
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {OTHER}", f"Bearer {TOKEN}x"):
        assert not token_matches(header, TOKEN), header


def test_only_loopback_may_go_without_a_token():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "", "::", "10.0.0.5", "cpu-node-1"]))
    check_bind("127.0.0.1", None, insecure_no_auth=False)
    check_bind("0.0.0.0", TOKEN, insecure_no_auth=False)
    check_bind("0.0.0.0", None, insecure_no_auth=True)
    with pytest.raises(TokenError, match=r"secrets\.token_urlsafe\(32\).*--token-file"):
        check_bind("0.0.0.0", None, insecure_no_auth=False)
    with pytest.raises(TokenError, match="exclude each other"):
        check_bind("127.0.0.1", TOKEN, insecure_no_auth=True)


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "sandboxd"],  # what the rstar2-sandboxd script runs
        [sys.executable, "-m", "rstar2cli.cli", "serve-sandbox"],
    ],
)
def test_a_non_loopback_bind_without_a_token_does_not_start(command):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    res = subprocess.run(
        [*command, "--host", "0.0.0.0", "--port", "0", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and res.stdout == "" and len(lines) == 1, res.stderr
    assert "refusing to serve 0.0.0.0 without a token" in lines[0]
    assert 'python -c "import secrets; print(secrets.token_urlsafe(32))"' in lines[0]


def test_a_world_readable_token_file_does_not_start_a_daemon(tmp_path):
    path = _token_file(tmp_path, mode=0o644)
    res = subprocess.run(
        [sys.executable, "-m", "sandboxd", "--port", "0", "--token-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "chmod 600" in res.stderr and TOKEN not in res.stderr


# ---------------------------------------------------------------- a real daemon with a token


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    path = _token_file(tmp_path_factory.mktemp("tok"))
    with spawn_daemon(workers=1, timeout_s=5.0, extra_args=("--token-file", str(path))) as d:
        yield d, path


def _jobs_run(url: str) -> int:
    status, body = _call(url + "/metrics", "GET", None, _bearer(TOKEN))
    assert status == 200
    return sum(int(n) for n in re.findall(rb'sandboxd_jobs_total\{status="\w+"\} (\d+)', body))


def test_every_endpoint_but_healthz_wants_the_token(guarded):
    daemon, _ = guarded
    assert "auth: bearer token" in daemon.startup_line and TOKEN not in daemon.startup_line
    assert _call(daemon.url + "/healthz", "GET", None, {})[0] == 200
    before = _jobs_run(daemon.url)
    refused = [{}, _bearer(OTHER), {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}]
    for method, path, body in ENDPOINTS:
        for headers in refused:
            status, answer = _call(daemon.url + path, method, body, headers)
            assert status == 401, (path, headers, status)
            assert TOKEN.encode() not in answer and b"Bearer" in answer
    assert _jobs_run(daemon.url) == before  # no refused request ran a job
    for method, path, body in ENDPOINTS:
        status, answer = _call(daemon.url + path, method, body, _bearer(TOKEN))
        assert status == 200, (path, answer)
        if method == "POST":
            assert b"42" in answer, (path, answer)
    assert _jobs_run(daemon.url) == before + 1 + 1 + 1 + 1 + 1 + 1  # one job per POST


def test_the_client_sends_the_token_from_a_file_or_the_variable(guarded, monkeypatch):
    daemon, path = guarded

    async def go(**kwargs) -> str:
        async with SandboxClient([daemon.url], timeout_s=30.0, **kwargs) as client:
            assert await client.check() == []
            results = await client.run_batch([Job(code="print(6*7)")], on_result=lambda i, r: None)
            return results[0].stdout

    assert asyncio.run(go(token_file=path)) == "42\n"
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert asyncio.run(go()) == "42\n"


@pytest.mark.parametrize(("token", "says"), [(None, "none was sent"), (OTHER, "refused the token")])
def test_a_401_is_one_line_naming_the_url_and_never_retried(guarded, monkeypatch, token, says):
    daemon, _ = guarded
    if token is not None:
        monkeypatch.setenv(TOKEN_ENV, token)

    async def go() -> None:
        async with SandboxClient([daemon.url], timeout_s=30.0, max_attempts=50) as client:
            with pytest.raises(SandboxUnauthorized) as err:
                await client.check()
            check_message = str(err.value)
            for stream in (False, True):
                on_result = (lambda i, r: None) if stream else None
                with pytest.raises(SandboxUnauthorized) as err:
                    await client.run_batch([Job(code="print(1)")], on_result=on_result)
                assert str(err.value) == check_message
            # not marked failed as an outage would be (max_attempts 50 never came into play)
            assert client.endpoints[0].failed_until == 0.0
            return check_message

    message = asyncio.run(go())
    assert message.startswith(f"the sandbox at {daemon.url} answered 401 Unauthorized")
    assert says in message and "\n" not in message and TOKEN not in message


def test_the_tool_batcher_stops_the_run_instead_of_counting_a_tool_error(guarded):
    daemon, _ = guarded

    async def go() -> None:
        async with SandboxClient([daemon.url], timeout_s=30.0) as client:
            tools = ToolBatcher(client)
            with pytest.raises(UserError, match="answered 401 Unauthorized"):
                await asyncio.gather(tools.run(Job(code="print(1)")), tools.run(Job(code="2")))

    asyncio.run(go())


def test_insecure_no_auth_says_so_on_its_startup_line():
    with spawn_daemon(workers=1, timeout_s=5.0, extra_args=("--insecure-no-auth",)) as daemon:
        assert "auth: NONE (--insecure-no-auth" in daemon.startup_line
        assert _call(daemon.url + "/v1/ping", "GET", None, {})[0] == 200
