"""What an RL stage shows and writes: metrics.jsonl, TensorBoard, W&B, a rich live view, PNG plots.

One row per step goes to OUT/metrics.jsonl (fsynced). On resume, rows past the checkpoint's step
are dropped first (the interrupted run wrote them after its last checkpoint and they are about to
be redone) and TensorBoard purges the same steps, so every output shows one clean curve. W&B (the
optional `wandb` extra) is used only when the recipe names a project; WANDB_MODE=offline keeps
its run under OUT/wandb. The live view is a rich progress bar over steps with the
current phase (rollout progress, grading, update, sync) and the last step's headline numbers.
`plot_metrics` draws the main curves into OUT/curves.png.

What it does not do: compute metrics (rstar2cli.rl.stage does). Exercised by
tests/integration/test_rl_stage.py; the W&B hook by tests/unit/test_wandb_offline.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError
from rstar2cli.fileio import JsonlAppender
from rstar2cli.train_utils import open_run_logs

SCALARS = (
    "reward",
    "pass_rate",
    "tool_error_share_correct",
    "format_penalty",
    "response_tokens",
    "num_kept",
    "num_dropped_groups",
    "num_engine_error_rollouts",  # left out of their groups (rstar2cli/rl/selection.py)
    "num_sandbox_error_rollouts",
    "clip_frac",
    "entropy",
    "approx_kl",
    "loss",
    "grad_norm",
    "lr",
    "trainer_peak_mem_gib",
    "eval_accuracy",
    "time_rollout_s",
    "time_grade_s",
    "time_update_s",
    "time_sync_s",
    "stale_token_share",  # 0 without partial rollout
    "num_carried",
    "mismatch_kl",  # rstar2cli/rl/correction.py
    "stale_kl",
    "is_ratio_mean",
    "is_ratio_max",
    "truncated_token_share",
    "masked_token_share",
    "masked_sequence_share",
)

# (keys drawn in one panel, its title)
PLOTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("reward",), "reward (mean over rollouts)"),
    (("eval_accuracy",), "held-out accuracy"),
    (("tool_error_share_correct",), "tool-error share in correct trajectories"),
    (("response_tokens",), "response length (tokens)"),
    (("entropy",), "token entropy"),
    (("clip_frac",), "clip fraction"),
    (("mismatch_kl", "stale_kl"), "engine vs trainer: k3 KL(mu || pi_old), own / stale tokens"),
    (("is_ratio_mean", "is_ratio_max"), "importance ratio pi_old / mu"),
    (
        (
            "truncated_token_share",
            "masked_token_share",
            "masked_sequence_share",
            "stale_token_share",
        ),
        "corrected shares",
    ),
)


class StageReporter:
    def __init__(
        self,
        out: Path,
        log_cfg: Any,
        start_step: int,
        num_steps: int,
        run_name: str,
        recipe_dump: dict[str, Any],
        live: bool = True,
    ):
        self.out, self.log_cfg = out, log_cfg
        self.start_step, self.num_steps = start_step, num_steps
        self.run_name, self.recipe_dump, self.live = run_name, recipe_dump, live
        self._metrics: JsonlAppender | None = None
        self._tb: Any = None
        self._wandb: Any = None
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> StageReporter:
        self._metrics, self._tb = open_run_logs(self.out, self.start_step, self.log_cfg.tensorboard)
        if self.log_cfg.wandb_project:
            self._wandb = _start_wandb(
                self.log_cfg.wandb_project, self.run_name, self.recipe_dump, self.out
            )
        if self.live:
            self._start_bar()
        return self

    def _start_bar(self) -> None:
        from rstar2cli.ui import progress_bar

        self._progress = progress_bar("rl-stage", "{task.fields[phase]}", "{task.fields[last]}")
        self._progress.start()
        self._task = self._progress.add_task(
            "steps", total=self.num_steps, completed=self.start_step, phase="starting", last=""
        )

    def phase(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, phase=text)

    def rollout_tick(self, snap: Any) -> None:
        self.phase(f"rollout {snap.num_done}/{snap.num_total} (tools {snap.num_tool_in_flight})")

    def step(self, row: dict[str, Any]) -> None:
        assert self._metrics is not None, "steps are reported inside `with StageReporter(...)`"
        self._metrics.write_batch([row])
        step = int(row["step"])
        if self._tb is not None:
            for key in SCALARS:
                value = row.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(f"rl/{key}", value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: row[k] for k in SCALARS if row.get(k) is not None}, step=step)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, phase="", last=headline(row))

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._metrics is not None:
            self._metrics.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def headline(row: dict[str, Any]) -> str:
    """The last step's numbers for the live view (an eval-only row shows just its accuracy)."""
    parts = []
    if "reward" in row:
        err = row.get("tool_error_share_correct")
        parts += [
            f"reward {row['reward']:.2f}",
            "err-in-correct " + ("-" if err is None else f"{err:.1%}"),
            f"kept {row['num_kept']}",
            f"len {row['response_tokens']:.0f}",
        ]
        if row.get("stale_token_share"):  # partial rollout
            parts.append(f"stale {row['stale_token_share']:.0%}")
        if row.get("mismatch_kl") is not None:
            parts.append(f"mismatch {row['mismatch_kl']:.1e}")
    if row.get("eval_accuracy") is not None:
        parts.append(f"eval {row['eval_accuracy']:.2f}")
    return " | ".join(parts)


def _start_wandb(project: str, name: str, config: dict[str, Any], out: Path) -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise UserError(
            "log.wandb_project is set but wandb is not installed (pip install wandb)"
        ) from exc
    return wandb.init(
        project=project, name=name, config=config, dir=str(out), resume="allow", id=name
    )


def plot_metrics(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """The main curves of a stage, one panel each, into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(13, 10))
    for ax, (keys, label) in zip(axes.flat, PLOTS, strict=False):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=False)
                ax.plot(xs, ys, marker="o", markersize=3, label=key)
        if len(keys) > 1:
            ax.legend(fontsize=7)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
