"""Wire compatibility with real clients: the `sandbox-fusion` PyPI package and code-judge requests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sbhelpers import post_json

fusion = pytest.importorskip("sandbox_fusion")


def test_sandbox_fusion_client_success_and_failures(daemon):
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    ok = run_code(
        RunCodeRequest(code="print(input()[::-1])", stdin="abc", language="python"),
        endpoint=daemon.url,
    )
    assert ok.status == RunStatus.Success
    assert (
        ok.run_result.status == "Finished"
        and ok.run_result.stdout == "cba\n"
        and ok.run_result.return_code == 0
    )

    failed = run_code(RunCodeRequest(code="1/0", language="python"), endpoint=daemon.url)
    assert failed.status == RunStatus.Failed
    assert failed.run_result.status == "Finished" and failed.run_result.return_code == 1
    assert "ZeroDivisionError" in failed.run_result.stderr

    slow = run_code(
        RunCodeRequest(code="while True: pass", language="python", run_timeout=0.5),
        endpoint=daemon.url,
    )
    assert slow.status == RunStatus.Failed and slow.run_result.status == "TimeLimitExceeded"


def test_sandbox_fusion_async_client_and_ping(daemon):
    import asyncio
    import urllib.request

    from sandbox_fusion import RunCodeRequest
    from sandbox_fusion.async_client import run_code

    resp = asyncio.run(
        run_code(RunCodeRequest(code="2**10", language="python"), endpoint=daemon.url)
    )
    assert resp.run_result.stdout == "1024\n"
    with urllib.request.urlopen(daemon.url + "/v1/ping") as r:
        assert r.read() == b'"pong"'


def test_sandbox_fusion_rejects_other_languages_with_400(daemon):
    status, body = post_json(daemon.url + "/run_code", {"code": "int main(){}", "language": "cpp"})
    assert status == 400 and "only python" in body["error"]


def test_code_judge_long_batch_as_rstar2_tool_sends_it(daemon):
    # The release's tool posts {"type": "batch", "submissions": [{"type", "solution", "input"}]}
    # to /run/long-batch and reads run_success, success, stdout, stderr, cost per result.
    submissions = [
        {
            "type": "python",
            "solution": "a, b = map(int, input().split())\nprint(a + b)",
            "input": "2 3",
        },
        {"type": "python", "solution": "print(1/0)", "input": ""},
        {"type": "python", "solution": "import time\ntime.sleep(10)", "input": ""},
        {"type": "python", "solution": "print(7)", "expected_output": "8"},
    ]
    request = {"type": "batch", "submissions": submissions}
    with ThreadPoolExecutor(2) as pool:  # both batch paths at once: their timeouts overlap
        answers = list(
            pool.map(
                lambda p: post_json(daemon.url + p, request), ("/run/long-batch", "/run/batch")
            )
        )
    for status, body in answers:
        assert status == 200
        results = body["results"]
        assert [r["run_success"] for r in results] == [True, False, False, True]
        assert [r["success"] for r in results] == [True, False, False, False]
        assert results[0]["stdout"] == "5\n" and "ZeroDivisionError" in results[1]["stderr"]
        assert results[2]["reason"] == "worker_timeout"
        assert all(isinstance(r["cost"], float) and isinstance(r["sub_id"], str) for r in results)


def test_code_judge_single_run(daemon):
    status, body = post_json(
        daemon.url + "/run",
        {"type": "python", "solution": "print(9)", "expected_output": "9", "sub_id": "q1"},
    )
    assert status == 200
    assert (
        body["success"] is True
        and body["run_success"] is True
        and body["sub_id"] == "q1"
        and body["reason"] == ""
    )
    status, body = post_json(daemon.url + "/run", {"type": "cpp", "solution": "int main(){}"})
    assert status == 400
