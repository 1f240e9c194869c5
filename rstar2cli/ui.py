"""The progress display every long command shows: its name, the bar, done/total, then its own columns.

`progress_bar("eval", console=c)` gives `eval ━━━━━━━━━━ 12/40 0:00:31` on a terminal; extra
columns follow, a string being a format over the task (e.g. "loss {task.fields[loss]}"). When the
output is not a terminal (a cluster job's log file, a pipe) a bar would come out once, at the end,
cut to 80 columns; there `LogProgress` writes one whole plain line instead, every
`LOG_EVERY_S` seconds and at the end: `eval 12/40 (30%) 0:00:31 | <the extra columns>`.
Both offer what the commands use: add_task, update, advance, start/stop, and `with`.
Rich is imported on first use, so importing this module costs nothing.
Tested in tests/unit/test_ui.py.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

LOG_EVERY_S = 30.0


def progress_bar(
    name: str, *extra: Any, console: Any = None, elapsed: bool = True, transient: bool = False
) -> Any:
    """A progress display (not started): a rich `Progress` on a terminal, `LogProgress`
    elsewhere. `elapsed` adds the time since start after done/total."""
    from rich import get_console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or get_console()
    if not console.is_terminal:
        formats = [c for c in extra if isinstance(c, str)]
        return LogProgress(name, formats, file=console.file, elapsed=elapsed)
    columns: list[Any] = [TextColumn(name), BarColumn(), MofNCompleteColumn()]
    if elapsed:
        columns.append(TimeElapsedColumn())
    columns += [TextColumn(c) if isinstance(c, str) else c for c in extra]
    return Progress(*columns, console=console, transient=transient)


@dataclass
class _Task:
    description: str
    total: float | None
    completed: float = 0.0
    fields: dict[str, Any] = field(default_factory=dict)


class LogProgress:
    """Plain progress lines for logs: whole lines, never cut, at most one per `every_s`."""

    def __init__(
        self,
        name: str,
        formats: list[str],
        file: Any = None,
        elapsed: bool = True,
        every_s: float = LOG_EVERY_S,
    ):
        self.name, self.formats, self.elapsed, self.every_s = name, formats, elapsed, every_s
        self.file = file or sys.stderr
        self.tasks: list[_Task] = []
        self.started = self.last_line = time.monotonic()

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        self.tasks.append(_Task(description, total, 0.0, dict(fields)))
        return len(self.tasks) - 1

    def update(
        self,
        task_id: int,
        *,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        total: float | None = None,
        **fields: Any,
    ) -> None:
        task = self.tasks[task_id]
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        if description is not None:
            task.description = description
        if total is not None:
            task.total = total
        task.fields.update(fields)
        if time.monotonic() - self.last_line >= self.every_s:
            self._write()

    def advance(self, task_id: int, advance: float = 1.0) -> None:
        self.update(task_id, advance=advance)

    def start(self) -> None:
        self.started = self.last_line = time.monotonic()

    def stop(self) -> None:
        self._write()

    def __enter__(self) -> LogProgress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def line(self, task: _Task) -> str:
        done = f"{task.completed:.0f}"
        if task.total:
            done += f"/{task.total:.0f} ({task.completed / task.total:.0%})"
        parts = [self.name, done]
        if self.elapsed:
            seconds = int(time.monotonic() - self.started)
            parts.append(f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}")
        text = " ".join(parts)
        extras = [f.format(task=task) for f in self.formats]
        extras = [e for e in extras if e.strip()]
        return text + (" | " + " | ".join(extras) if extras else "")

    def _write(self) -> None:
        self.last_line = time.monotonic()
        for task in self.tasks:
            print(self.line(task), file=self.file, flush=True)
