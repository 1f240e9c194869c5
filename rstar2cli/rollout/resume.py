"""What lets a rollout command resume: the model's fingerprint, the run-state stamp, the check that
new samples are made with the settings of those already written.

A resumable command (`rollout`, `filter-hard`, `eval`) appends records to its output and, rerun
with the same output, runs only what is missing. Before it adds a sample it compares this run's
sample settings (`options.RolloutArgs.sample_settings`, with `model_fingerprint` as the model)
with those stamped by the run that wrote the earlier records, and refuses with one line when they
differ: mixing samples of two temperatures or two checkpoints in one file would go unnoticed.

What it does not do: decide which settings define a sample (`rstar2cli.options`) or find the
records already written (each command reads its own output). Tested in tests/unit/test_resume.py
and through each command's integration test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError


def model_fingerprint(model: Path | str) -> str:
    """The model folder, resolved, with its weights' sizes and times: a changed or retrained
    model in the same folder makes a resumed run refuse to mix samples."""
    folder = Path(model).resolve()
    parts = [str(folder)]
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
    return "|".join(parts)


def start_run_state(
    stats_path: Path, settings: dict[str, Any], run: dict[str, Any], num_done: int, what: str
) -> None:
    """Before a resumable run: refuse (one line) when the `num_done` records already in `what`
    were made with other sample settings, then record this run's settings in `stats_path` (the
    statistics join them at the end)."""
    from rstar2cli.fileio import write_json_atomic

    if num_done:
        earlier = read_run_state(stats_path).get("settings")
        check_same_settings(
            earlier=earlier,
            now=settings,
            where=what,
            fix="use another --out, or the same settings",
        )
    write_json_atomic(stats_path, {"settings": settings, "run": run})


def read_run_state(stats_path: Path) -> dict[str, Any]:
    """The stamp `start_run_state` wrote (with the statistics added at the end); {} if none."""
    try:
        state = json.loads(stats_path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def check_same_settings(
    earlier: dict[str, Any] | None, now: dict[str, Any], where: str, fix: str
) -> None:
    """Refuse (one line) to add samples made with other settings to `where`."""
    if not earlier:
        return
    for key, value in now.items():
        if key in earlier and earlier[key] != value:
            old, new = earlier[key], value
            if key == "model":  # a fingerprint: show the folder
                old, new = str(old).split("|")[0], str(new).split("|")[0]
                if old == new:
                    old, new = "an earlier version of it", "changed weights"
            raise UserError(f"{where} was made with {key}={old}, now {new}: {fix}")
