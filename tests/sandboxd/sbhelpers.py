"""Helpers shared by the sandboxd tests: HTTP calls to a real daemon on 127.0.0.1."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

SECRET = "sandboxd-test-secret-5b1f0c"


def post_json(url: str, body: object, timeout_s: float = 60.0) -> tuple[int, object]:
    """POST JSON, return (HTTP status, decoded body) also for 4xx/5xx answers."""
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def run_jobs(url: str, jobs: list[dict]) -> list[dict]:
    status, body = post_json(url + "/v1/batch", {"jobs": jobs})
    assert status == 200, body
    return body["results"]  # type: ignore[index]


def parent_pid(pid: int) -> int | None:
    """The parent of `pid` (from /proc/PID/stat), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def processes_below(daemon_pid: int) -> dict[int, int]:
    """pid -> depth below the daemon, for every process in the daemon's tree."""
    parent_of: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (parent := parent_pid(int(name))) is not None:
            parent_of[int(name)] = parent
    depths = {}
    for pid in parent_of:
        depth, up = 0, pid
        while up in parent_of and up != daemon_pid:
            up, depth = parent_of[up], depth + 1
        if up == daemon_pid:
            depths[pid] = depth
    return depths


def _is_light_runner(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"light_main" in f.read()
    except OSError:
        return False


def light_runner_pids(daemon_pid: int) -> list[int]:
    """The slots' light runners: children of a zygote, exec'd from our own interpreter."""
    return [
        pid
        for pid, depth in processes_below(daemon_pid).items()
        if depth == 4 and _is_light_runner(pid)
    ]


def leftover_job_pids(daemon_pid: int) -> list[int]:
    """Processes below this daemon that are neither a zygote, a light runner, nor their parents.

    Every job process (and anything it spawned, setsid or not) lives below the daemon in the
    host's process tree; after a job is answered there must be none left.
    """
    # daemon -> fork server (1) -> slot process (2) -> zygote (3) -> jobs or light runner (4)
    # -> the light runner's jobs (5 and deeper)
    depths = processes_below(daemon_pid)
    return [
        pid
        for pid, depth in depths.items()
        if depth >= 4 and not (depth == 4 and _is_light_runner(pid))
    ]
