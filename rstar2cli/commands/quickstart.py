"""`rstar2 quickstart`: the whole pipeline on the tiny default, end to end, on a laptop."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import typer

from rstar2cli.errors import UserError
from sandboxd.pool import DEFAULT_WORKERS

REPO_RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "tiny"
# for --model: sized for a ~100M-parameter pretrained model on a CPU (tuned on SmolLM2-135M)
PRETRAINED_RECIPES = REPO_RECIPES.parent / "pretrained"


def quickstart(
    ctx: typer.Context,
    out: Path = typer.Option(
        Path("quickstart_out"),
        "--out",
        help="Folder for every stage's output, summary.json and pipeline.sh.",
    ),
    fresh: bool = typer.Option(
        False,
        "--fresh",
        help="Delete --out first and start over (default: resume); only a folder an earlier "
        "quickstart wrote (or an empty one).",
    ),
    sandbox_workers: int = typer.Option(
        DEFAULT_WORKERS, "--sandbox-workers", min=1, help="Sandbox worker slots."
    ),
    model: Path | None = typer.Option(
        None,
        "--model",
        metavar="DIR",
        help="A local HF causal-LM folder to start from instead of the tiny model (e.g. the one "
        "`make smollm2` builds); uses recipes/pretrained/, sized for ~100M parameters on a CPU.",
    ),
) -> None:
    """Run data -> cold-start SFT -> sandbox daemon -> eval -> GRPO-RoC -> eval on a local model.

    Uses the same commands a user chains (their exact arguments are written to OUT/pipeline.sh),
    a real sandbox daemon it starts and stops itself, vLLM (CPU build) engines and DeepSpeed. A
    rerun skips finished stages and resumes an interrupted one; --fresh starts over. Results:
    OUT/summary.json, a before/after table, OUT/quickstart.png, OUT/eval/eval.png, OUT/rl/ plots.
    """
    from rich.console import Console

    from rstar2cli import pipeline
    from rstar2cli.fileio import check_output_path, read_jsonl_if_exists, write_json_atomic
    from rstar2cli.records import read_graded

    console = Console()
    recipes = REPO_RECIPES if model is None else PRETRAINED_RECIPES
    if not (recipes / "sft.yaml").is_file() or not (recipes / "rl.yaml").is_file():
        raise UserError(f"recipes not found in {recipes}: run from a checkout of rstar2cli")
    if model is not None and not (model / "config.json").is_file():
        raise UserError(f"--model {model}: no config.json there; give an HF model folder")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder")
    if fresh and out.exists() and any(out.iterdir()):
        if not _is_quickstart_output(out):
            raise UserError(
                f"--fresh would delete {out}, which holds files but no quickstart pipeline.sh: "
                "give a new or empty folder, or one an earlier quickstart wrote"
            )
        shutil.rmtree(out)
    check_output_path(out)
    started = time.monotonic()
    settings = pipeline.QuickstartSettings(recipes_dir=recipes)
    if model is not None:
        settings = pipeline.pretrained_settings(recipes, model.resolve())
    steps = pipeline.plan_steps(out, settings)
    (out / "pipeline.sh").write_text(pipeline.shell_script(steps), encoding="utf-8")
    console.print(
        f"[bold]rstar2 quickstart[/] -> {out}  (the same commands: {out / 'pipeline.sh'})"
    )

    from sandboxd.spawn import spawn_daemon

    with spawn_daemon(workers=sandbox_workers, timeout_s=5.0, memory_mb=512) as daemon:
        console.print(f"sandbox daemon: {daemon.startup_line.strip()}")
        for step in steps:
            if step.done_marker.exists():
                console.print(f"[dim]= {step.name}: done, skipped[/]")
                continue
            argv = step.bound(daemon.url)
            console.rule(f"[bold]{step.name}[/]")
            console.print("[dim]rstar2 " + " ".join(argv) + "[/]")
            _run_command(ctx, argv)
            if step.name.startswith("eval-"):
                step.done_marker.touch()

    # step 0 is the held-out eval before training; training steps are 1..N
    rl_steps = max(
        (int(r.get("step", 0)) for r in read_jsonl_if_exists(out / "rl" / "metrics.jsonl")),
        default=0,
    )
    summary = pipeline.summarize(
        read_graded(out / "eval" / "results.jsonl"), rl_steps, time.monotonic() - started
    )
    write_json_atomic(out / "summary.json", summary)
    _print_table(console, summary)
    _plot(summary, out / "quickstart.png")
    console.print(
        f"summary: {out / 'summary.json'}  plots: {out / 'quickstart.png'}, {out / 'eval'}, {out / 'rl'}"
    )


def _is_quickstart_output(out: Path) -> bool:
    """Whether `out` is a folder a quickstart wrote (its pipeline.sh says so), so that
    --fresh may delete it; never a folder of the user's that merely got passed as --out."""
    from rstar2cli import pipeline

    script = out / "pipeline.sh"
    try:
        head = script.read_text(encoding="utf-8")[:512] if script.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return False
    return pipeline.SCRIPT_MARK in head


def _run_command(ctx: typer.Context, argv: list[str]) -> None:
    """Run one `rstar2` command in this process, through the same parser a shell user hits (the
    root of this invocation's command tree)."""
    command = ctx.find_root().command
    try:
        command.main(args=argv, prog_name="rstar2", standalone_mode=False)
    except SystemExit as exc:  # a command that exits on purpose with a non-zero code
        if exc.code not in (0, None):
            raise UserError(f"`rstar2 {argv[0]}` exited with code {exc.code}") from exc


def _fmt(value: float | None, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if pct else f"{value:.1f}"


def _print_table(console: object, summary: dict) -> None:
    from rich.table import Table

    table = Table(title="quickstart: held-out synthetic test set, before vs after RL")
    for col in ("metric", "SFT", "SFT + GRPO-RoC"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    sft, rl = summary["sft"], summary["rl"]
    table.add_row("accuracy (avg pass@1)", _fmt(sft["accuracy"]), _fmt(rl["accuracy"]))
    table.add_row(
        "tool calls / trajectory",
        _fmt(sft.get("tool_calls_per_trajectory"), False),
        _fmt(rl.get("tool_calls_per_trajectory"), False),
    )
    table.add_row(
        "tool-error share in correct", _fmt(sft["tool_error_share"]), _fmt(rl["tool_error_share"])
    )
    table.add_row(
        "mean response tokens",
        _fmt(sft.get("mean_response_tokens"), False),
        _fmt(rl.get("mean_response_tokens"), False),
    )
    table.add_row("RL steps", "", str(rl["steps"]))
    console.print(table)  # type: ignore[attr-defined]
    console.print(f"total: {summary['seconds']:.0f} s")  # type: ignore[attr-defined]


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [
        ("accuracy", "accuracy"),
        ("tool_error_share", "tool-error share\n(correct trajectories)"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        values = [summary[k][key] or 0.0 for k in ("sft", "rl")]
        ax.bar(["SFT", "SFT + RL"], values, color=["#8c8c8c", "#2a7ab0"])
        ax.set_title(title)
        ax.set_ylim(0, 1.12 * max(1.0, *values))  # NOTE: room for the value labels above the bars
        for i, v in enumerate(values):
            ax.text(i, v, f"{100 * v:.1f}%", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
