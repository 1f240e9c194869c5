"""The CLI itself: instant import, --version, --help, one-line errors."""

import subprocess
import sys

from rstar2cli import __version__

HEAVY = ("torch", "vllm", "transformers", "deepspeed", "ray", "datasets", "math_verify", "pyarrow")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rstar2cli.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_importing_the_cli_imports_no_heavy_library():
    code = f"import sys, rstar2cli.cli; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"heavy modules imported at CLI import: {out.stdout.strip()}"


def test_version_and_help():
    v = _run("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"rstar2 {__version__}"
    h = _run("--help")
    assert h.returncode == 0
    assert "prepare-data" in h.stdout


def test_bad_input_is_one_line_error_without_traceback(tmp_path):
    missing = tmp_path / "nope.jsonl"
    r = _run("prepare-data", "--source", str(missing), "--out", str(tmp_path / "x.parquet"))
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in r.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_unknown_command_is_a_usage_error():
    r = _run("no-such-command")
    assert r.returncode == 2 and "No such command" in r.stderr


def test_error_text_in_brackets_is_printed_as_is(tmp_path):
    missing = tmp_path / "[run 1]" / "nope.jsonl"
    r = _run("prepare-data", "--source", str(missing), "--out", str(tmp_path / "x.parquet"))
    assert r.returncode == 2 and "[run 1]" in r.stderr, r.stderr


def test_debug_after_the_command_shows_the_traceback(tmp_path):
    missing = tmp_path / "nope.jsonl"
    out = str(tmp_path / "x.parquet")
    r = _run("prepare-data", "--source", str(missing), "--out", out, "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "UserError" in r.stderr, r.stderr
