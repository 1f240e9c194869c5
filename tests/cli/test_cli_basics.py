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
    assert r.returncode == 2 and "Traceback" in r.stderr and "UserError" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: file not found")


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    return lines[0]


def test_quickstart_model_that_is_no_model_folder_is_one_line(tmp_path):
    line = _one_line(_run("quickstart", "--model", str(tmp_path), "--out", str(tmp_path / "q")))
    assert "--model" in line and "no config.json" in line
    assert not (tmp_path / "q").exists()


def test_quickstart_fresh_deletes_no_folder_it_did_not_write(tmp_path):
    """--fresh deletes --out only when an earlier quickstart wrote it (its pipeline.sh says so):
    a user's folder passed by mistake keeps every file. A bad --out is one line too."""
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    line = _one_line(_run("quickstart", "--fresh", "--out", str(precious)))
    assert "--fresh would delete" in line and "no quickstart pipeline.sh" in line
    assert (precious / "thesis.txt").read_text() == "years of work"
    # a pipeline.sh that is not a quickstart's does not count either
    (precious / "pipeline.sh").write_text("#!/bin/sh\nmake all\n")
    assert "--fresh would delete" in _one_line(
        _run("quickstart", "--fresh", "--out", str(precious))
    )
    assert (precious / "thesis.txt").exists()
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert "is a file" in _one_line(_run("quickstart", "--out", str(blocker)))
    assert "cannot write to" in _one_line(_run("quickstart", "--out", str(blocker / "q")))
    assert blocker.read_text() == "x"


def test_usage_errors_are_one_line_naming_the_help_to_read(tmp_path):
    """A bad value, an unknown option and a missing one: one line each, exit 2, no usage box."""
    cases = {
        (
            "serve-sandbox",
            "--port",
            "99999",
        ): "'--port': Input should be less than or equal to 65535",
        ("rollout", "--samplez", "3"): "No such option: --samplez",
        ("rollout", "--data", "d.jsonl"): "Missing option '--model'",
    }
    for argv, expected in cases.items():
        line = _one_line(_run(*argv))
        assert expected in line and line.endswith(f"(see rstar2 {argv[0]} --help)"), line
    bare = _run()  # no command: the help, on stdout, and no error line
    assert bare.returncode == 2 and "Usage" in bare.stdout and not bare.stderr.strip(), bare.stderr
