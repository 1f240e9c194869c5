"""`--help` texts: paragraphs the terminal wraps (never the source's line breaks), no measurements.

Typer's rich mode keeps a docstring's line breaks after its first paragraph, so a sentence broken
at the source's 100 columns shows broken mid-line on any terminal; cli.py hands each command its
docstring with every paragraph on one line. Measured ratios belong on the docs' Results page, not
in help texts.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from rstar2cli.cli import app

COMMAND = typer.main.get_command(app)
NAMES = sorted(COMMAND.commands)  # type: ignore[attr-defined]
MEASUREMENT = re.compile(r"\b\d+(\.\d+)?x\b|\b(faster|slower|measured|speed-?up)\b", re.I)


def _help_texts() -> list[tuple[str, str]]:
    texts = [("rstar2", COMMAND.help or "")]
    for name in NAMES:
        cmd = COMMAND.commands[name]  # type: ignore[attr-defined]
        texts.append((name, cmd.help or ""))
        texts += [(f"{name} {p.opts[0]}", getattr(p, "help", None) or "") for p in cmd.params]
    return texts


@pytest.mark.parametrize("name", NAMES)
def test_each_paragraph_of_a_command_help_is_one_line(name):
    runner = CliRunner()
    out = runner.invoke(app, [name, "--help"], env={"COLUMNS": "1000"}).output
    shown = {line.strip() for line in out.splitlines()}
    help_text = COMMAND.commands[name].help or ""  # type: ignore[attr-defined]
    for paragraph in help_text.split("\n\n"):
        lines = paragraph.splitlines()
        assert all(line.startswith("- ") for line in lines[1:]), paragraph
        for line in lines:
            assert line.strip() in shown, (line, out)


def test_help_texts_quote_no_measurements():
    quoted = [
        (where, m.group(0)) for where, text in _help_texts() if (m := MEASUREMENT.search(text))
    ]
    assert quoted == []


def test_the_measurement_pattern_sees_a_ratio():
    assert MEASUREMENT.search("predicted (1.08x faster than data order)")
    assert not MEASUREMENT.search("Synthetic: number of problems (train + test; ~20% test).")
