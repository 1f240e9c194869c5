"""`rstar2 rl-stage`: one RL stage of GRPO-RoC from a recipe, resumable.

Loads and validates the recipe (every problem listed at once, before any work), applies the
options that say *where* (`--init-from`, `--sandbox`, `--ray-address`, `--out`), runs the
pre-flight checks (`rstar2cli.preflight`: data files, model folder and context, Ray, sandbox,
tokenizer, prompts that fit), and only then writes the resolved recipe to OUT/recipe.yaml and
hands over to `run_stage`. Rerunning the same command on the same OUT resumes from the newest
checkpoint; a different recipe for an OUT whose run has started (checkpoints or metrics) is
refused, but for the keys that say where it runs and in what memory
(`rstar2cli.recipe.RESUME_FREE_KEYS`: micro-batch size, gradient checkpointing, sandbox), whose
changes it prints.

`--init-from` takes an HF model folder (weights only; e.g. sft-coldstart's final/) or a previous
rl-stage OUT (its final/ weights, plus its optimizer state unless `--reset-optimizer`, which is
how stage 3 starts). A LoRA stage's OUT goes on with its adapter on the base it trained (its
final_adapter/ names it), not on its merged final/. Heavy imports happen inside the function.
Tested in tests/integration/test_rl_stage.py, tests/unit/test_rl_recipe.py and
tests/cli/test_stage_preflight.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rstar2cli.errors import UserError

if TYPE_CHECKING:
    from rstar2cli.rl.stage_recipe import RlRecipe


def rl_stage(
    recipe: Path = typer.Option(
        ..., "--recipe", help="RL recipe YAML (e.g. recipes/tiny/rl.yaml)."
    ),
    sets: list[str] | None = typer.Option(
        None,
        "--set",
        metavar="KEY=VALUE",
        help="Override a recipe value, e.g. train.num_steps=5. Repeatable.",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Run folder: recipe, checkpoints, metrics, plots, final/ model."
    ),
    init_from: Path | None = typer.Option(
        None,
        "--init-from",
        metavar="CKPT",
        help="Start from this HF folder, or a previous rl-stage OUT (weights + optimizer state).",
    ),
    reset_optimizer: bool = typer.Option(
        False,
        "--reset-optimizer",
        help="With --init-from a previous stage: fresh optimizer (stage 3).",
    ),
    sandbox: list[str] | None = typer.Option(
        None, "--sandbox", metavar="URL", help="sandboxd URL (repeatable); overrides the recipe's."
    ),
    sandbox_token_file: Path | None = typer.Option(
        None,
        "--sandbox-token-file",
        metavar="PATH",
        help="File holding the sandbox daemons' token; overrides the recipe's "
        "(default: $RSTAR2_SANDBOX_TOKEN).",
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="Place engines and trainer ranks with Ray: 'local' or a cluster address.",
    ),
) -> None:
    """Train one GRPO-RoC stage: rollout 2G -> grade -> RoC to G -> PPO-clip update -> push weights."""
    from rich.console import Console

    from rstar2cli import preflight
    from rstar2cli.fileio import check_output_path
    from rstar2cli.recipe import check_resume, dump_recipe, load_recipe, resume_changes_line
    from rstar2cli.rl.stage_recipe import RlRecipe

    console = Console(highlight=False, stderr=True)
    resolved = load_recipe(recipe, RlRecipe, list(sets or []))
    init_checkpoint = _apply_where(
        resolved,
        init_from=init_from,
        reset_optimizer=reset_optimizer,
        sandbox=sandbox,
        sandbox_token_file=sandbox_token_file,
    )
    preflight.check_rl_inputs(resolved)
    preflight.check_ray_address(ray_address)
    preflight.check_local_speculation(
        resolved.rollout.speculative,
        resolved.rollout.temperature,
        ray_address,
        name="rollout.speculative",
    )
    check_output_path(out)
    if changed := check_resume(out, resolved):
        console.print(f"rl-stage: {resume_changes_line(changed)}")
    if (out / "final" / "config.json").exists():
        console.print(f"rl-stage: {out} is already finished; model in {out / 'final'}")
        return
    from rstar2cli.rl.stage import StageOptions, run_stage

    # NOTE: the pre-flight checks run before recipe.yaml is written, so a failed check leaves OUT
    # as it was and the corrected command starts cleanly.
    inputs = preflight.prepare_rl_stage(resolved)
    dump_recipe(resolved, out / "recipe.yaml")
    opts = StageOptions(
        out=out,
        ray_address=ray_address,
        init_checkpoint=init_checkpoint,
        reset_optimizer=reset_optimizer,
    )
    final = run_stage(resolved, opts, inputs)
    console.print(
        f"rl-stage: done; model in {final} (metrics: {out / 'metrics.jsonl'}, plots: {out / 'curves.png'})"
    )


def _apply_where(
    resolved: RlRecipe,
    *,
    init_from: Path | None,
    reset_optimizer: bool,
    sandbox: list[str] | None,
    sandbox_token_file: Path | None,
) -> Path | None:
    """Put the options that say where into the recipe; the checkpoint to load state from."""
    init_checkpoint = None
    if init_from is not None:
        resolved.model, init_checkpoint = _resolve_init(init_from, reset_optimizer)
    elif reset_optimizer:
        raise UserError("--reset-optimizer needs --init-from (a previous rl-stage OUT)")
    if sandbox:
        resolved.sandbox.urls = list(sandbox)
    if sandbox_token_file is not None:
        resolved.sandbox.token_file = str(sandbox_token_file)
    return init_checkpoint


def _resolve_init(init_from: Path, reset_optimizer: bool) -> tuple[str, Path | None]:
    """(HF folder the model is built from, checkpoint folder to load state from or None)."""
    if (init_from / "config.json").is_file():
        if reset_optimizer:
            raise UserError(
                f"{init_from} is a model folder (no optimizer state); --reset-optimizer applies to a "
                "previous rl-stage OUT"
            )
        return str(init_from), None
    final, ckpts = init_from / "final", init_from / "checkpoints"
    if (final / "config.json").is_file() and (ckpts / "latest").is_file():
        from rstar2cli.lora import run_base_model

        # NOTE: a LoRA run's checkpoint holds its adapter: it goes on its base, not on final/
        # (the adapter merged in already)
        return run_base_model(init_from) or str(final), ckpts
    raise UserError(
        f"--init-from {init_from}: expected a HF model folder (config.json) or a finished rl-stage "
        "OUT (final/ and checkpoints/)"
    )
