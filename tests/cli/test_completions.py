"""completions/ matches the app, and each script loads in its shell."""

import shutil
import subprocess
from pathlib import Path

import pytest

from rstar2cli.completions import SHELLS, command_table, render, write_all

REPO = Path(__file__).resolve().parents[2]
FILES = {"bash": "rstar2.bash", "zsh": "_rstar2", "fish": "rstar2.fish"}


@pytest.mark.parametrize("shell", SHELLS)
def test_committed_script_matches_the_app(shell):
    committed = (REPO / "completions" / FILES[shell]).read_text()
    assert committed == render(shell), (
        f"completions/{FILES[shell]} is stale: run `python -m rstar2cli.completions completions`"
    )


def test_table_lists_every_command_and_its_options():
    table = command_table()
    assert "prepare-data" in table
    opts = {o for o, _, _ in table["prepare-data"]}
    assert {"--source", "--out", "--force", "--help"} <= opts


def test_bash_completes_commands_and_options(tmp_path):
    (path,) = [p for p in write_all(tmp_path) if p.name == FILES["bash"]]
    script = (
        f"source {path}; COMP_WORDS=(rstar2 prep); COMP_CWORD=1; _rstar2; echo ${{COMPREPLY[@]}}; "
        "COMP_WORDS=(rstar2 prepare-data --sou); COMP_CWORD=2; _rstar2; echo ${COMPREPLY[@]}"
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.stdout.splitlines() == ["prepare-data", "--source"], out.stderr


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_script_parses_in_its_shell(shell, tmp_path):
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} is not installed")
    path = {p.name: p for p in write_all(tmp_path)}[FILES[shell]]
    out = subprocess.run([exe, "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
