"""A slot's two runners: routing by code, the same results either way, surviving L's death.

As root each zygote runs jobs that name a module only it has loaded (numpy, sympy) itself and
hands every other job to its light runner; without root there is no light runner and these tests
are skipped. Hostile snippets through both runners are in test_hostile.py.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest
from sbhelpers import (
    leftover_job_pids,
    light_runner_pids,
    parent_pid,
    processes_below,
    run_jobs,
)

HEAVY = "\n# numpy"  # a trailing comment naming numpy routes a job to the zygote; lines stay put
FACTS = (
    "import os, resource\n"
    "print(os.getuid() == os.geteuid() == os.getgid() != 0, os.getcwd(), sorted(os.environ.items()))\n"
    "print(sorted(os.listdir('/proc/self/fd')), os.listdir('.'))\n"
    "limits = 'CPU NPROC FSIZE NOFILE CORE'.split()\n"
    "print([resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in limits])\n"
    "keys = ('Seccomp:', 'NoNewPrivs:', 'CapEff:', 'CapBnd:')\n"
    "print([ln.split() for ln in open('/proc/self/status') if ln.startswith(keys)])\n"
)
SAME_JOBS = [
    {"code": "print(2**100)"},
    {"code": "x = 3\nx * 2"},
    {"code": "def f():\n    return 1 / 0\nf()"},
    {"code": "print(input()[::-1])", "stdin": "abc\n"},
    {"code": "import sys\nsys.exit(3)"},
    {"code": "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nprint('not reached')"},
    {"code": "open('f.txt', 'w').write('x')\nimport os\nprint(sorted(os.listdir('.')))"},
    {"code": FACTS},
]


@pytest.fixture(scope="module")
def light_daemon(daemon):
    if "light runner" not in daemon.startup_line:
        pytest.skip("no light runner: the daemon does not run as root")
    return daemon


def test_startup_line_names_the_zygote_only_modules(light_daemon):
    found = re.search(r"light runner for jobs without (\S+)", light_daemon.startup_line)
    assert found and {"numpy", "sympy"} <= set(found.group(1).rstrip(",;").split("/"))


def test_jobs_are_routed_by_the_modules_they_name(light_daemon):
    probe = "import sys\nprint(sorted(m for m in ('num' + 'py', 'sym' + 'py') if m in sys.modules))"
    light, heavy = run_jobs(light_daemon.url, [{"code": probe}, {"code": probe + HEAVY}])
    assert light["stdout"] == "[]\n", light
    assert heavy["stdout"] == "['numpy', 'sympy']\n", heavy


def test_results_are_the_same_on_both_runners(light_daemon):
    jobs = SAME_JOBS + [dict(job, code=job["code"] + HEAVY) for job in SAME_JOBS]
    results = [
        (r["status"], r["stdout"], r["stderr"], r["exit_code"])
        for r in run_jobs(light_daemon.url, jobs)
    ]
    num = len(SAME_JOBS)
    assert results[:num] == results[num:]
    assert [r[0] for r in results[:num]] == [
        "ok",
        "ok",
        "error",
        "ok",
        "error",
        "error",
        "ok",
        "ok",
    ]
    assert "ZeroDivisionError" in results[2][2] and "KeyboardInterrupt" in results[5][2]
    assert results[6][1] == "['f.txt']\n"


def test_light_job_importing_numpy_by_a_trick_still_works(light_daemon):
    code = "np = __import__('num' + 'py')\nprint(int(np.arange(4).sum()))"
    res = run_jobs(light_daemon.url, [{"code": code}])[0]
    assert (res["status"], res["stdout"]) == ("ok", "6\n"), res


def test_light_runner_killed_mid_job(light_daemon):
    daemon_pid = light_daemon.process.pid
    before = light_runner_pids(daemon_pid)
    assert len(before) == 2
    answer: list[dict] = []
    worker = threading.Thread(
        target=lambda: answer.extend(
            run_jobs(light_daemon.url, [{"code": "import time\ntime.sleep(5)\nprint('late')"}])
        )
    )
    worker.start()
    victim = None
    deadline = time.monotonic() + 10.0
    while victim is None and time.monotonic() < deadline:
        below = processes_below(daemon_pid)
        busy = [pid for pid in before if any(parent_pid(p) == pid for p in below)]
        victim = busy[0] if busy else None
        time.sleep(0.02)
    assert victim is not None, "the job never showed up below a light runner"
    os.kill(victim, signal.SIGKILL)
    worker.join(30)
    assert answer[0]["status"] == "sandbox_error", answer
    again = run_jobs(light_daemon.url, [{"code": "print(1)"}] * 4)
    assert [r["stdout"] for r in again] == ["1\n"] * 4
    after = light_runner_pids(daemon_pid)
    assert len(after) == 2 and victim not in after
    assert leftover_job_pids(daemon_pid) == []
