"""Helpers shared by the sandboxd tests: HTTP calls to a real daemon on 127.0.0.1."""

from __future__ import annotations

import json
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
