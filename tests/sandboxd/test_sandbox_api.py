"""The native HTTP API of a real daemon: execution semantics, statuses, errors, limits, metrics."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest
from sbhelpers import post_json, run_jobs

from sandboxd.runner import PRECOMPILE_MAX_CHARS
from sandboxd.spawn import spawn_daemon


def test_results_keep_order_and_carry_all_fields(daemon):
    jobs = [{"code": f"print({i} * {i})"} for i in range(20)]
    results = run_jobs(daemon.url, jobs)
    assert [r["stdout"] for r in results] == [f"{i * i}\n" for i in range(20)]
    assert all(set(r) == {"status", "stdout", "stderr", "exit_code", "duration_s"} for r in results)
    assert all(r["status"] == "ok" and r["exit_code"] == 0 and r["duration_s"] > 0 for r in results)


@pytest.mark.parametrize(
    "code,stdout",
    [
        ("x = 3\nx * 14", "42\n"),  # last expression shown like IPython
        ("print('a')\n1 + 1", "a\n"),  # ...but not when something was printed
        ("None", ""),
        ("import sympy\nsympy.factor(sympy.Symbol('x')**2 - 1)", "(x - 1)*(x + 1)\n"),
        ("import numpy as np\nint(np.arange(10).sum())", "45\n"),
        (
            "from __future__ import annotations\ndef f(a: Undefined) -> int:\n    return 1\nf(0)",
            "1\n",
        ),
        ("from fractions import Fraction\nFraction(1, 3) + Fraction(1, 6)", "Fraction(1, 2)\n"),
    ],
)
def test_execution_semantics(daemon, code, stdout):
    res = run_jobs(daemon.url, [{"code": code}])[0]
    assert res["status"] == "ok", res
    assert res["stdout"] == stdout


def test_traceback_points_at_user_lines(daemon):
    code = "a = 1\nb = 2\n\ndef f():\n    return 1 / 0\n\nf()\n"
    res = run_jobs(daemon.url, [{"code": code}])[0]
    assert res["status"] == "error" and res["exit_code"] == 1
    assert 'File "main.py", line 5, in f' in res["stderr"]
    assert 'File "main.py", line 7, in <module>' in res["stderr"]
    assert (
        "return 1 / 0" in res["stderr"]
        and "zygote" not in res["stderr"]
        and "runner" not in res["stderr"]
    )


def test_syntax_error_and_system_exit(daemon):
    results = run_jobs(
        daemon.url,
        [
            {"code": "def f(:\n"},
            {"code": "import sys\nsys.exit(0)"},
            {"code": "raise SystemExit(4)"},
        ],
    )
    assert (
        results[0]["status"] == "error"
        and "SyntaxError" in results[0]["stderr"]
        and "main.py" in results[0]["stderr"]
    )
    assert results[1]["status"] == "ok"
    assert results[2]["status"] == "error" and results[2]["exit_code"] == 4


def test_long_code_is_compiled_by_the_job_with_the_same_results(daemon):
    # the runner compiles code up to PRECOMPILE_MAX_CHARS itself; the job compiles longer code
    pad = "# padding\n" * (PRECOMPILE_MAX_CHARS // 10 + 1)
    assert len(pad) >= PRECOMPILE_MAX_CHARS
    short = ["x = 40\nx + 2", "\ndef f(:\n", "x = 1\n\ny = x / 0\n"]
    results = run_jobs(daemon.url, [{"code": c} for c in short + [pad + c for c in short]])
    lines = pad.count("\n")
    assert [r["status"] for r in results] == ["ok", "error", "error"] * 2, results
    assert results[0]["stdout"] == results[3]["stdout"] == "42\n"
    assert (
        'File "main.py", line 2' in results[1]["stderr"] and "SyntaxError" in results[1]["stderr"]
    )
    assert f'File "main.py", line {lines + 2}' in results[4]["stderr"]
    assert 'File "main.py", line 3, in <module>' in results[2]["stderr"]
    assert f'File "main.py", line {lines + 3}, in <module>' in results[5]["stderr"]
    assert "y = x / 0" in results[2]["stderr"] and "y = x / 0" in results[5]["stderr"]


def test_every_job_starts_with_fresh_stdio(daemon):
    # the stdio wrappers are made once per runner; what one job wrote must not reach the next
    jobs = [
        {"code": "import sys\nsys.stdout.write('a')\nsys.stderr.write('b')"},
        {"code": "1 + 1"},
        {"code": "import sys\nprint([s.seekable() for s in (sys.stdin, sys.stdout, sys.stderr)])"},
    ] * 4
    results = run_jobs(daemon.url, jobs)
    assert [(r["stdout"], r["stderr"]) for r in results] == [
        ("a", "b"),
        ("2\n", ""),
        ("[False, False, False]\n", ""),
    ] * 4


def test_stdin_is_fed(daemon):
    big = "\n".join(str(i) for i in range(30000)) + "\n"  # larger than a pipe buffer
    res = run_jobs(
        daemon.url, [{"code": "import sys\nprint(sum(int(x) for x in sys.stdin))", "stdin": big}]
    )[0]
    assert res["status"] == "ok" and res["stdout"] == f"{sum(range(30000))}\n"


def test_per_job_timeout_is_honoured_and_capped(daemon):
    results = run_jobs(
        daemon.url,
        [
            {"code": "import time\ntime.sleep(1)", "timeout_s": 0.3},
            {"code": "import time\ntime.sleep(30)", "timeout_s": 1000},
        ],
    )
    assert [r["status"] for r in results] == ["timeout", "timeout"]
    # the short limit is honoured; the huge one is capped at the daemon's --timeout-s (5 s), not 30 s
    assert results[0]["duration_s"] < results[1]["duration_s"] < 30.0


def test_random_state_differs_between_jobs(daemon):
    results = run_jobs(daemon.url, [{"code": "import random\nrandom.random()"} for _ in range(4)])
    assert len({r["stdout"] for r in results}) == 4


@pytest.mark.parametrize(
    "body,fragment",
    [
        (b"not json", "not valid JSON"),
        ({"jobs": "x"}, "'jobs' must be a list"),
        ({"jobs": [{"stdin": ""}]}, "missing field 'code'"),
        ({"jobs": [{"code": 3}]}, "'code' must be a string"),
        ({"jobs": [{"code": "1", "timeout_s": -1}]}, "positive number"),
        ({"jobs": [{"code": "1", "timeout_s": float("nan")}]}, "positive number"),
        (b"[" * 200_000 + b"]" * 200_000, "not valid JSON"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_malformed_requests_get_400(daemon, body, fragment):
    status, answer = post_json(daemon.url + "/v1/batch", body)
    assert status == 400
    assert fragment in answer["error"]


def test_healthz_and_metrics(daemon):
    with urllib.request.urlopen(daemon.url + "/healthz") as resp:
        health = json.loads(resp.read())
    assert health["ok"] is True and health["workers_alive"] == 2
    assert any("seccomp" in layer for layer in health["isolation"]["active"])
    run_jobs(daemon.url, [{"code": "1/0"}])
    with urllib.request.urlopen(daemon.url + "/metrics") as resp:
        text = resp.read().decode()
    assert 'sandboxd_jobs_total{status="error"}' in text
    assert (
        "sandboxd_queue_depth 0" in text
        and 'sandboxd_job_latency_seconds_bucket{le="+Inf"}' in text
    )
    count = int(
        next(
            line
            for line in text.splitlines()
            if line.startswith("sandboxd_job_latency_seconds_count")
        ).split()[1]
    )
    assert count >= 2


def test_startup_line_names_isolation(daemon):
    assert daemon.startup_line.startswith("sandboxd listening on http://127.0.0.1:")
    assert "isolation:" in daemon.startup_line and "netns" in daemon.startup_line


def test_full_queue_answers_503_and_drain_answers_everything():
    handle = spawn_daemon(workers=1, timeout_s=5.0, extra_args=("--max-queue", "2"))
    answers: list[tuple[int, object]] = []
    try:
        slow = {"jobs": [{"code": "import time\ntime.sleep(1.0)\nprint('done')"}]}
        threads = [
            threading.Thread(
                target=lambda: answers.append(post_json(handle.url + "/v1/batch", slow))
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
            time.sleep(0.15)
        for path in ("/v1/batch", "/v1/stream"):
            status, body = post_json(handle.url + path, {"jobs": [{"code": "1"}] * 3})
            assert status == 503 and "queue full" in body["error"], path
        subs = [{"type": "python", "solution": "print(1)", "sub_id": f"s{i}"} for i in range(3)]
        status, body = post_json(
            handle.url + "/run/long-batch", {"type": "batch", "submissions": subs}
        )
        assert status == 503 and [r["reason"] for r in body["results"]] == ["queue_timeout"] * 3
        handle.process.send_signal(15)  # graceful: the three accepted jobs must still be answered
        for t in threads:
            t.join(30)
        assert handle.process.wait(30) == 0
    finally:
        handle.stop()
    assert sorted(s for s, _ in answers) == [200, 200, 200]
    assert all(b["results"][0]["stdout"] == "done\n" for _, b in answers)


def _in_flight(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics") as resp:
        text = resp.read().decode()
    return int(
        next(ln for ln in text.splitlines() if ln.startswith("sandboxd_in_flight ")).split()[1]
    )


def test_stream_answers_each_job_as_it_finishes(daemon):
    slow = "import time\ntime.sleep(3.0)\nprint('slow')"
    body = {"jobs": [{"code": slow}, {"code": "print('quick')"}]}
    req = urllib.request.Request(
        daemon.url + "/v1/stream",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        first = json.loads(resp.readline())
        # the quick job (index 1) is on the wire while the slow one is still running
        still_running = _in_flight(daemon.url)
        rest = [json.loads(line) for line in resp if line.strip()]
    assert first["index"] == 1 and first["result"]["stdout"] == "quick\n"
    assert still_running == 1
    assert [(r["index"], r["result"]["stdout"]) for r in rest] == [(0, "slow\n")]
    assert first["result"]["status"] == rest[0]["result"]["status"] == "ok"


def test_stream_malformed_request_gets_400(daemon):
    status, answer = post_json(daemon.url + "/v1/stream", {"jobs": "x"})
    assert status == 400 and "'jobs' must be a list" in answer["error"]


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics") as resp:
        text = resp.read().decode()
    return float(next(ln for ln in text.splitlines() if ln.startswith(name + " ")).split()[1])


def _wait_for(check, bound_s: float = 30.0) -> None:
    deadline = time.monotonic() + bound_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_single_job_waits_for_no_other_clients_whole_batch(daemon):
    """The queue serves submissions in turn: while one client's ten jobs queue on the two
    slots, another client's single job starts next, not after all ten."""
    stamp = "import time\nprint(time.time())\ntime.sleep(0.4)\n"
    answers: list = []
    big = threading.Thread(
        target=lambda: answers.append(
            post_json(daemon.url + "/v1/batch", {"jobs": [{"code": stamp}] * 10})
        )
    )
    big.start()
    _wait_for(lambda: _metric(daemon.url, "sandboxd_queue_depth") >= 6)
    small = run_jobs(daemon.url, [{"code": stamp}])[0]
    big.join(60)
    status, body = answers[0]
    assert status == 200 and small["status"] == "ok"
    starts = [float(r["stdout"]) for r in body["results"]]
    assert sum(s > float(small["stdout"]) for s in starts) >= 5, (small, starts)


def test_the_queued_jobs_of_a_client_that_left_are_dropped_unrun(daemon):
    """A client sends eight 1 s jobs and hangs up without reading: the two slots finish what
    they started, the rest never run (counted in sandboxd_abandoned_total)."""
    before = _metric(daemon.url, "sandboxd_abandoned_total")
    ran_before = _metric(daemon.url, "sandboxd_job_latency_seconds_count")
    body = json.dumps({"jobs": [{"code": "import time\ntime.sleep(1.0)"}] * 8}).encode()
    host, port = daemon.url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        _wait_for(lambda: _metric(daemon.url, "sandboxd_queue_depth") > 0)
    _wait_for(
        lambda: (
            _metric(daemon.url, "sandboxd_queue_depth") == 0
            and _metric(daemon.url, "sandboxd_in_flight") == 0
        )
    )
    dropped = _metric(daemon.url, "sandboxd_abandoned_total") - before
    ran = _metric(daemon.url, "sandboxd_job_latency_seconds_count") - ran_before
    assert dropped >= 4 and dropped + ran == 8, (dropped, ran)
    assert run_jobs(daemon.url, [{"code": "print(2)"}])[0]["stdout"] == "2\n"


def test_one_requests_output_together_is_capped():
    """Twenty jobs each printing 90,000 characters under a 1 MB cap for the request: the jobs
    that finish within it come back whole, the rest cut (output_limit), and all the output
    together stays within the cap, however many jobs ask."""
    handle = spawn_daemon(
        workers=2,
        timeout_s=5.0,
        max_output_bytes=100_000,
        extra_args=("--max-request-output-mb", "1"),
    )
    try:
        results = run_jobs(handle.url, [{"code": "print('x' * 90_000)"}] * 20)
        second = run_jobs(handle.url, [{"code": "print('x' * 90_000)"}] * 2)
    finally:
        handle.stop()
    whole = [r for r in results if r["status"] == "ok"]
    cut = [r for r in results if r["status"] == "output_limit"]
    assert len(whole) == 2**20 // 90_001 and len(whole) + len(cut) == 20
    assert all(r["stdout"] == "x" * 90_000 + "\n" for r in whole)
    assert sum(len(r["stdout"]) + len(r["stderr"]) for r in results) == 2**20
    # the cap is per request: the next one starts afresh
    assert [r["status"] for r in second] == ["ok", "ok"]


def _closed_within(conn: socket.socket, bound_s: float) -> bytes:
    """What the daemon sends before closing `conn`; fails if it is still open after `bound_s`."""
    conn.settimeout(bound_s)
    data = b""
    while chunk := conn.recv(4096):
        data += chunk
    return data


def test_a_client_that_sends_its_request_a_byte_at_a_time_holds_no_connection():
    """With --idle-timeout-s 1: a request head never finished, one dripped a byte at a time and
    a body that never comes are all cut off, while a job that runs longer than the timeout is
    answered in full and the daemon serves on."""
    handle = spawn_daemon(workers=1, timeout_s=5.0, extra_args=("--idle-timeout-s", "1"))
    host, port = handle.url.rsplit("/", 1)[1].split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as half:
            half.sendall(b"POST /v1/batch HTTP/1.1\r\nHost: x\r\n")
            assert _closed_within(half, 10.0) == b""  # closed, nothing answered
        with socket.create_connection((host, int(port)), timeout=10) as drip:
            drip.sendall(b"POST /v1/batch HTTP/1.1\r\n")
            drip.settimeout(0.2)
            closed = False
            for _ in range(50):  # 10 s at most: a header byte every 0.2 s never completes
                try:
                    drip.sendall(b"X")
                    closed = drip.recv(4096) == b""
                except TimeoutError:
                    continue
                except OSError:  # reset by the daemon
                    closed = True
                break
            assert closed
        with socket.create_connection((host, int(port)), timeout=10) as no_body:
            no_body.sendall(
                b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            answer = _closed_within(no_body, 10.0)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b"did not arrive within 1 s" in answer
        slow = run_jobs(handle.url, [{"code": "import time\ntime.sleep(1.5)\nprint('done')"}])
        assert slow[0]["status"] == "ok" and slow[0]["stdout"] == "done\n"
    finally:
        handle.stop()
