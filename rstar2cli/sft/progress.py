"""Progress and metrics of an SFT run: a rich progress bar, metrics.jsonl and TensorBoard.

The bar shows step, loss, tokens/s and ETA. Each step appends one JSON line
`{"step", "epoch", "loss", "lr", "grad_norm", "num_tokens", "tokens_per_s", "step_time_s"}` to
OUT/metrics.jsonl (fsynced). On resume, lines past the checkpoint's step are dropped first (they
were written by the interrupted run after its last checkpoint and are about to be redone), and
TensorBoard purges the same steps, so both show one clean curve.
Only rank 0 reports (`enabled`). Exercised by tests/integration/test_sft_resume.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rstar2cli.fileio import JsonlAppender
from rstar2cli.train_utils import open_run_logs


class Reporter:
    def __init__(
        self,
        out: Path,
        recipe: Any,
        start_step: int,
        num_steps: int,
        num_examples: int,
        enabled: bool = True,
    ):
        self.out, self.recipe, self.enabled = out, recipe, enabled
        self.start_step, self.num_steps, self.num_examples = start_step, num_steps, num_examples
        self._metrics: JsonlAppender | None = None
        self._tb: Any = None
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Reporter:
        if not self.enabled:
            return self
        self._metrics, self._tb = open_run_logs(
            self.out, self.start_step, self.recipe.log.tensorboard
        )
        self._start_bar()
        return self

    def _start_bar(self) -> None:
        from rich.progress import TimeRemainingColumn

        from rstar2cli.ui import progress_bar

        self._progress = progress_bar(
            "sft",
            "loss {task.fields[loss]}",
            "{task.fields[tps]} tok/s",
            "ETA",
            TimeRemainingColumn(),
            elapsed=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "steps", total=self.num_steps, completed=self.start_step, loss="-", tps="-"
        )

    def step(
        self, step: int, loss: float, lr: float, grad_norm: Any, num_tokens: int, step_time_s: float
    ) -> None:
        if not self.enabled:
            return
        tps = num_tokens / max(step_time_s, 1e-9)
        self._progress.update(self._task, completed=step, loss=f"{loss:.4f}", tps=f"{tps:,.0f}")
        if step % self.recipe.log.every_steps and step != self.num_steps:
            return
        row = {
            "step": step,
            "epoch": step * self.recipe.train.global_batch_size / self.num_examples,
            "loss": loss,
            "lr": lr,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "num_tokens": num_tokens,
            "tokens_per_s": tps,
            "step_time_s": step_time_s,
        }
        assert self._metrics is not None, "steps are reported inside `with Reporter(...)`"
        self._metrics.write_batch([row])
        if self._tb is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
                if row[key] is not None:
                    self._tb.add_scalar(f"train/{key}", row[key], step)

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self._progress.stop()
        if self._metrics is not None:
            self._metrics.close()
        if self._tb is not None:
            self._tb.close()
