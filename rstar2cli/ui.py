"""The progress bar every long command shows: its name, the bar, done/total, then its own columns.

`progress_bar("eval", console=c)` gives `eval ━━━━━━━━━━ 12/40 0:00:31`; extra columns follow, a
string being a rich `TextColumn` format over the task (e.g. "loss {task.fields[loss]}"). Rich is
imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any


def progress_bar(
    name: str, *extra: Any, console: Any = None, elapsed: bool = True, transient: bool = False
) -> Any:
    """A rich `Progress` (not started): `elapsed` adds the time since start after done/total."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns: list[Any] = [TextColumn(name), BarColumn(), MofNCompleteColumn()]
    if elapsed:
        columns.append(TimeElapsedColumn())
    columns += [TextColumn(c) if isinstance(c, str) else c for c in extra]
    return Progress(*columns, console=console, transient=transient)
