"""Run `rstar2 rl-stage` as a benchmark arm and read its metrics rows back.

The A/B benchmarks (roc_vs_grpo, correction_ab) run the real command in a subprocess, one arm
after another from the same model and seed, each into its own folder; a rerun of the same
command resumes an interrupted arm (rl-stage's own checkpoints).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_stage(name: str, *, model: str, out: Path, recipe: Path, sets: list[str]) -> list[dict]:
    """`rl-stage --recipe RECIPE --init-from MODEL --out OUT --set S...`; its metrics.jsonl rows."""
    cmd = [sys.executable, "-m", "rstar2cli.cli", "rl-stage", "--recipe", str(recipe)]
    cmd += ["--out", str(out), "--init-from", model]
    for s in sets:
        cmd += ["--set", s]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)
    return read_rows(out / "metrics.jsonl")


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def plot_steps(
    results: dict[str, list[dict]],
    *,
    panels: list[tuple[str, str]],
    title: str,
    path: Path,
    log_keys: tuple[str, ...] = (),
) -> None:
    """One panel per (metrics key, panel title), one line per run over its rows' `step`; a row
    without the key (or with None) is skipped; `log_keys` panels on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2))
    for ax, (key, panel_title) in zip(axes, panels, strict=True):
        for name, rows in results.items():
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=name)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if key in log_keys:
            ax.set_yscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
