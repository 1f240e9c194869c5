"""Wire models of sandboxd: jobs, results, and the three dialects the HTTP server speaks.

What it does: defines `Job` and `JobResult` (the boundary types used by the pool, the server and
the client), validates incoming JSON into jobs (raising `ProtocolError` with a one-line message,
answered as HTTP 400), and maps results to the native format, to SandboxFusion's `/run_code`
response and to code-judge's `/run` submission result.

What it does not: no I/O, no execution. Status semantics are decided by `sandboxd.pool`.

Tested in tests/sandboxd/test_sandbox_units.py (pure) and through a real daemon in
test_sandbox_api.py and test_wire_compat.py.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "sandbox_error")
MAX_JOBS_PER_REQUEST = 50_000
# the daemon's first stdout line once it listens: READY_PREFIX + its URL (sandboxd.spawn reads it)
READY_PREFIX = "sandboxd listening on "


class ProtocolError(ValueError):
    """A malformed request; the message is returned to the caller as is."""


@dataclass
class Job:
    code: str
    stdin: str = ""
    timeout_s: float | None = None


@dataclass
class JobResult:
    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


def sandbox_error(message: str) -> JobResult:
    return JobResult(
        status="sandbox_error", stdout="", stderr=message, exit_code=None, duration_s=0.0
    )


def result_from_wire(obj: dict[str, Any]) -> JobResult:
    status = obj.get("status")
    if status not in STATUSES:
        raise ProtocolError(f"unknown status {status!r}")
    return JobResult(
        status=status,
        stdout=str(obj.get("stdout", "")),
        stderr=str(obj.get("stderr", "")),
        exit_code=obj.get("exit_code"),
        duration_s=float(obj.get("duration_s", 0.0)),
    )


def _require_str(obj: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if value is None and default is not None:
        value = default
    if not isinstance(value, str):
        raise ProtocolError(f"{where}: field {key!r} must be a string")
    return value


def _optional_timeout(obj: dict[str, Any], key: str, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:  # NaN
        raise ProtocolError(f"{where}: field {key!r} must be a positive number of seconds")
    return float(value)


def _require_object(body: Any, where: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError(f"{where}: the request body must be a JSON object")
    return body


def job_from_wire(obj: Any, where: str = "job") -> Job:
    obj = _require_object(obj, where)
    if "code" not in obj:
        raise ProtocolError(f"{where}: missing field 'code'")
    return Job(
        code=_require_str(obj, "code", where),
        stdin=_require_str(obj, "stdin", where, default=""),
        timeout_s=_optional_timeout(obj, "timeout_s", where),
    )


def jobs_from_batch(body: Any) -> list[Job]:
    """`{"jobs": [{"code", "stdin", "timeout_s"}, ...]}` -> jobs (native batch endpoint)."""
    body = _require_object(body, "batch")
    jobs = body.get("jobs")
    if not isinstance(jobs, list):
        raise ProtocolError("batch: field 'jobs' must be a list")
    if len(jobs) > MAX_JOBS_PER_REQUEST:
        raise ProtocolError(f"batch: at most {MAX_JOBS_PER_REQUEST} jobs per request")
    return [job_from_wire(j, f"jobs[{i}]") for i, j in enumerate(jobs)]


# ---------------------------------------------------------------- SandboxFusion dialect

_FUSION_PYTHON = ("python", "python3")


def job_from_fusion(body: Any) -> Job:
    """SandboxFusion `RunCodeRequest` -> job. Only Python; files are not supported."""
    body = _require_object(body, "run_code")
    language = body.get("language", "python")
    if language not in _FUSION_PYTHON:
        raise ProtocolError(f"run_code: language {language!r} is not supported (only python)")
    if body.get("files"):
        raise ProtocolError("run_code: 'files' is not supported by sandboxd")
    if "code" not in body:
        raise ProtocolError("run_code: missing field 'code'")
    stdin = body.get("stdin")
    return Job(
        code=_require_str(body, "code", "run_code"),
        stdin=stdin if isinstance(stdin, str) else "",
        timeout_s=_optional_timeout(body, "run_timeout", "run_code"),
    )


_FUSION_RUN_STATUS = {"ok": "Finished", "timeout": "TimeLimitExceeded"}


def result_to_fusion(result: JobResult) -> dict[str, Any]:
    """JobResult -> SandboxFusion `RunCodeResponse` (Success / Failed / SandboxError)."""
    if result.status == "sandbox_error":
        return {
            "status": "SandboxError",
            "message": result.stderr or "sandbox error",
            "compile_result": None,
            "run_result": None,
            "executor_pod_name": None,
            "files": {},
        }
    run_status = _FUSION_RUN_STATUS.get(result.status, "Error")
    if result.status != "timeout" and result.exit_code is not None and result.status != "ok":
        run_status = "Finished"  # SandboxFusion: the process finished, with a non-zero code
    if result.status in ("memory", "output_limit") and result.exit_code is None:
        run_status = "Error"
    return {
        "status": "Success" if result.status == "ok" else "Failed",
        "message": "" if result.status == "ok" else result.status,
        "compile_result": None,
        "run_result": {
            "status": run_status,
            "execution_time": result.duration_s,
            "return_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "executor_pod_name": None,
        "files": {},
    }


# ---------------------------------------------------------------- code-judge dialect

_CODE_JUDGE_REASON = {"timeout": "worker_timeout", "sandbox_error": "internal_error"}


def job_from_code_judge(obj: Any, where: str = "submission") -> tuple[Job, dict[str, Any]]:
    """code-judge `Submission` -> (job, the fields needed to answer it)."""
    obj = _require_object(obj, where)
    kind = obj.get("type", "python")
    if kind != "python":
        raise ProtocolError(f"{where}: type {kind!r} is not supported (only python)")
    if "solution" not in obj:
        raise ProtocolError(f"{where}: missing field 'solution'")
    expected = obj.get("expected_output")
    if expected is not None and not isinstance(expected, str):
        raise ProtocolError(f"{where}: field 'expected_output' must be a string")
    stdin = obj.get("input")
    job = Job(
        code=_require_str(obj, "solution", where), stdin=stdin if isinstance(stdin, str) else ""
    )
    sub_id = obj.get("sub_id") or uuid.uuid4().hex
    return job, {"sub_id": str(sub_id), "expected_output": expected}


def code_judge_batch(body: Any) -> tuple[list[Job], list[dict[str, Any]], str]:
    body = _require_object(body, "batch")
    subs = body.get("submissions")
    if not isinstance(subs, list):
        raise ProtocolError("batch: field 'submissions' must be a list")
    if len(subs) > MAX_JOBS_PER_REQUEST:
        raise ProtocolError(f"batch: at most {MAX_JOBS_PER_REQUEST} submissions per request")
    pairs = [job_from_code_judge(s, f"submissions[{i}]") for i, s in enumerate(subs)]
    sub_id = str(body.get("sub_id") or uuid.uuid4().hex)
    return [p[0] for p in pairs], [p[1] for p in pairs], sub_id


def result_to_code_judge(
    result: JobResult, meta: dict[str, Any], reason: str | None = None
) -> dict[str, Any]:
    run_success = result.status == "ok"
    expected = meta.get("expected_output")
    success = run_success and (expected is None or result.stdout.strip() == expected.strip())
    if reason is None:
        reason = _CODE_JUDGE_REASON.get(
            result.status, "" if result.status in ("ok", "error") else result.status
        )
    return {
        "sub_id": meta["sub_id"],
        "success": success,
        "run_success": run_success,
        "cost": result.duration_s,
        "reason": reason,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
