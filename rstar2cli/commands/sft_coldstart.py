"""`rstar2 sft-coldstart`: the non-reasoning cold-start SFT, from a recipe, resumable.

Parses options, loads and validates the recipe (every problem listed at once, before any work),
checks that the local data files exist and the model can be found (`rstar2cli.preflight`), that
OUT is writable, and that the data holds records that convert
(`rstar2cli.sft.data.check_sources`), and only then writes the resolved recipe to OUT/recipe.yaml
and hands over to `rstar2cli.sft.train.run`. Rerunning the same command with the same OUT resumes
from the newest checkpoint; a different recipe for an OUT whose run has started is refused (but
for gradient checkpointing: `rstar2cli.recipe.RESUME_FREE_KEYS`). torch,
transformers and deepspeed are imported inside the function so `rstar2 --help` stays instant.
Tested in tests/unit/test_sft_recipe.py, tests/integration/test_sft_resume.py and
tests/cli/test_stage_preflight.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer


def sft_coldstart(
    recipe: Path = typer.Option(
        ..., "--recipe", help="SFT recipe YAML (e.g. recipes/tiny/sft.yaml)."
    ),
    sets: list[str] | None = typer.Option(
        None,
        "--set",
        metavar="KEY=VALUE",
        help="Override a recipe value, e.g. train.lr=1.0e-5. Repeatable.",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Run folder: recipe, checkpoints, metrics, final/ model."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        metavar="PATH|tiny",
        help="Start from this HF model (or a fresh tiny one); overrides the recipe.",
    ),
) -> None:
    """Cold-start SFT on tool-call format and chat data; writes a HF model folder to OUT/final."""
    from rich.console import Console

    from rstar2cli.fileio import check_output_path
    from rstar2cli.preflight import check_sft_inputs
    from rstar2cli.recipe import (
        RUN_FILES,
        check_resume,
        dump_recipe,
        load_recipe,
        resume_changes_line,
    )
    from rstar2cli.sft.coldstart_recipe import SftRecipe
    from rstar2cli.sft.data import check_sources

    console = Console(highlight=False, stderr=True)
    resolved = load_recipe(recipe, SftRecipe, list(sets or []))
    if model is not None:
        resolved.model = model
    check_sft_inputs(resolved)
    check_output_path(out)
    # NOTE: init_model (the seeded tiny model) counts as started: a rerun must not reuse it with
    # another seed.
    if changed := check_resume(out, resolved, (*RUN_FILES, "init_model")):
        console.print(f"sft-coldstart: {resume_changes_line(changed)}")
    if (out / "final" / "config.json").exists():
        console.print(f"sft-coldstart: {out} is already finished; model in {out / 'final'}")
        return
    # NOTE: the data is read and converted before anything is written (recipe.yaml, init_model,
    # DeepSpeed state), so bad data leaves OUT as it was and the corrected command starts cleanly.
    check_sources(resolved.data, resolved.train.seed)
    if os.environ.get("RANK", "0") == "0":
        dump_recipe(resolved, out / "recipe.yaml")
    from rstar2cli.sft.train import run

    final = run(resolved, out)
    if os.environ.get("RANK", "0") == "0":
        console.print(f"sft-coldstart: done; model in {final} (metrics: {out / 'metrics.jsonl'})")
