"""Pure pieces of sandboxd: the seccomp program, wire validation, dialect mappings (no daemon)."""

from __future__ import annotations

import os
import struct

import pytest

from sandboxd import isolation
from sandboxd import wire as sbwire
from sandboxd.wire import Job, JobResult, ProtocolError


def _decode(program: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]


def test_seccomp_program_shape():
    insns = _decode(isolation.build_seccomp_program())
    # first: load arch, kill on a foreign arch; last two: allow, then the shared EPERM return
    assert insns[0] == (0x20, 0, 0, 4) and insns[1][3] == isolation.AUDIT_ARCH_X86_64
    assert insns[-2][3] == isolation.SECCOMP_RET_ALLOW
    assert insns[-1][3] == isolation.SECCOMP_RET_ERRNO | isolation.EPERM
    denied_rows = [
        i
        for i, ins in enumerate(insns)
        if ins[0] == 0x15 and ins[3] in isolation.DENIED_SYSCALLS.values()
    ]
    assert len(denied_rows) == len(isolation.DENIED_SYSCALLS)
    for row in denied_rows:  # every deny-list jump lands exactly on the final EPERM return
        assert row + 1 + insns[row][1] == len(insns) - 1


def test_job_validation():
    assert sbwire.jobs_from_batch({"jobs": [{"code": "1", "timeout_s": 2}]}) == [Job("1", "", 2.0)]
    with pytest.raises(ProtocolError, match="jobs\\[0\\]: missing field 'code'"):
        sbwire.jobs_from_batch({"jobs": [{}]})
    with pytest.raises(ProtocolError, match="positive"):
        sbwire.job_from_wire({"code": "1", "timeout_s": True})


@pytest.mark.parametrize(
    "status,exit_code,fusion_status,run_status",
    [
        ("ok", 0, "Success", "Finished"),
        ("error", 1, "Failed", "Finished"),
        ("timeout", None, "Failed", "TimeLimitExceeded"),
        ("memory", 1, "Failed", "Finished"),
        ("output_limit", None, "Failed", "Error"),
    ],
)
def test_fusion_mapping(status, exit_code, fusion_status, run_status):
    wire = sbwire.result_to_fusion(JobResult(status, "o", "e", exit_code, 0.1))
    assert wire["status"] == fusion_status and wire["run_result"]["status"] == run_status
    assert set(wire) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
    }


def test_fusion_sandbox_error_has_no_run_result():
    wire = sbwire.result_to_fusion(sbwire.sandbox_error("down"))
    assert (
        wire["status"] == "SandboxError"
        and wire["run_result"] is None
        and wire["message"] == "down"
    )


def test_code_judge_mapping_compares_stripped_output():
    job, meta = sbwire.job_from_code_judge(
        {"type": "python", "solution": "print(9)", "expected_output": "9\n\n"}
    )
    assert job == Job("print(9)", "")
    wire = sbwire.result_to_code_judge(JobResult("ok", "9\n", "", 0, 0.01), meta)
    assert wire["success"] and wire["run_success"] and wire["reason"] == ""
    timeout = sbwire.result_to_code_judge(JobResult("timeout", "", "", None, 2.0), meta)
    assert timeout["reason"] == "worker_timeout" and not timeout["run_success"]


def test_clear_dir_empties_deep_trees_without_following_symlinks(tmp_path):
    """What a job may leave in its tmpfs: 3000 nested directories (a recursive walk overflows,
    and the path passes PATH_MAX), a symlink to a directory outside, a locked directory, and a
    kept entry. All but the kept one go; the symlink's target is untouched."""
    from sandboxd.job import clear_dir

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    top = tmp_path / "tmp"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    try:
        os.mkdir("deep", dir_fd=fd)
        inner = os.open("deep", os.O_RDONLY, dir_fd=fd)
        for _ in range(3000):
            os.mkdir("d", dir_fd=inner)
            nxt = os.open("d", os.O_RDONLY, dir_fd=inner)
            os.close(inner)
            inner = nxt
        with open(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, dir_fd=inner), "w") as f:
            f.write("leaf")
        os.close(inner)
    finally:
        os.close(fd)
    (top / "job").symlink_to(outside)
    (top / "locked" / "sub").mkdir(parents=True)
    (top / "locked" / "sub" / "f").write_text("y")
    os.chmod(top / "locked", 0)
    (top / "kept").mkdir()
    (top / "kept" / "venv.txt").write_text("z")
    (top / "file.txt").write_text("w")

    clear_dir(str(top), {str(top / "kept")})

    assert sorted(os.listdir(top)) == ["kept"]
    assert (top / "kept" / "venv.txt").read_text() == "z"
    assert (outside / "precious").read_text() == "x"
