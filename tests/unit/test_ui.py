"""Progress displays: a rich bar on a terminal, whole plain lines in a log."""

from __future__ import annotations

import io

from rich.console import Console

from rstar2cli.ui import LogProgress, progress_bar


def test_a_log_gets_whole_lines_not_a_bar_cut_at_80_columns():
    out = io.StringIO()
    progress = progress_bar("rollout", "{task.description}", console=Console(file=out))
    assert isinstance(progress, LogProgress)
    progress.every_s = 0.0  # a line on every update
    long = "tools 3 | KV reserved/used " + " ".join(f"e{i} 90%/85%" for i in range(12))
    with progress:
        task = progress.add_task("starting", total=40)
        progress.update(task, description=long, advance=12)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("rollout 12/40 (30%) 0:00:0") and lines[0].endswith(long)
    assert len(lines[0]) > 120 and lines[-1] == lines[0]  # the last line again at stop


def test_log_lines_come_at_most_once_per_interval():
    out = io.StringIO()
    progress = LogProgress("eval", [], file=out, every_s=3600.0)
    with progress:
        task = progress.add_task("x", total=1000)
        for _ in range(1000):
            progress.advance(task)
    assert out.getvalue().splitlines() == ["eval 1000/1000 (100%) 0:00:00"]


def test_a_terminal_gets_the_rich_bar():
    from rich.progress import Progress

    assert isinstance(progress_bar("sft", console=Console(force_terminal=True)), Progress)
