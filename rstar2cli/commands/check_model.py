"""`rstar2 check-model`: the checks a model folder should pass before you train it with rstar2.

Loads the recipe given with `--recipe` (default: recipes/stage2_12k.yaml, the paper's longest RL
budget) for its prompt template and token budget, runs `rstar2cli.model_check.check_model_dir`
(config and tokenizer only, no weights), prints one table, and exits 2 with one line per problem.
Tested in tests/cli/test_check_model.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rstar2cli.errors import UserError

if TYPE_CHECKING:
    from rstar2cli.model_check import Budget

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "stage2_12k.yaml"


def check_model(
    model_dir: Path = typer.Argument(..., metavar="DIR", help="The HF model folder to check."),
    recipe: Path | None = typer.Option(
        None,
        "--recipe",
        help="An RL or SFT recipe whose token budget and template the model must hold. "
        "Default: recipes/stage2_12k.yaml, the paper's longest RL budget.",
    ),
) -> None:
    """Check that a model folder can be trained and served with the rstar2 protocol.

    The checks: config.json and the tokenizer load; the chat template renders the protocol's
    system prompt and a tool turn exactly as the agent loop does; the template is append-only,
    so a model trained on appended tokens is served the same context by its own template;
    <|im_end|> ends a turn; and the model's positions hold the recipe's budget.

    Only config.json and the tokenizer are read, never the weights. The exit code is 2 when a
    check finds a problem, with one line per problem.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rstar2cli.model_check import PROBLEM, check_model_dir
    from rstar2cli.preflight import check_model_folder

    check_model_folder(model_dir)
    template, budget = _recipe_budget(recipe or DEFAULT_RECIPE, given=recipe is not None)
    checks = check_model_dir(model_dir, template=template, budget=budget)
    table = Table(title=f"rstar2 check-model {model_dir}", title_justify="left")
    for column in ("check", "status", "detail"):
        table.add_column(column, overflow="fold")
    colours = {"ok": "green", "note": "yellow", PROBLEM: "bold red"}
    for c in checks:
        table.add_row(c.name, f"[{colours[c.status]}]{c.status}[/]", escape(c.detail))
    Console(highlight=False).print(table)
    problems = [c for c in checks if c.status == PROBLEM]
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    for c in problems:
        err.print(f"[bold red]problem:[/] {escape(c.name)}: {escape(c.detail)}")
    if problems:
        raise typer.Exit(code=2)


def _recipe_budget(path: Path, *, given: bool) -> tuple[str, Budget | None]:
    """(prompt template, budget) of an RL recipe (it has `rollout`) or an SFT one."""
    import yaml

    from rstar2cli.model_check import Budget
    from rstar2cli.recipe import load_recipe

    if not path.is_file():
        if given:
            raise UserError(f"recipe not found: {path}")
        return "paper", None  # an installed package without the repository's recipes/
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    shown = str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
    if isinstance(raw, dict) and "rollout" in raw:
        from rstar2cli.rl.stage_recipe import RlRecipe

        rl = load_recipe(path, RlRecipe)
        r = rl.rollout
        what = f"{r.max_prompt_tokens} prompt + {r.max_response_tokens} response"
        budget = Budget(
            source=shown,
            need_tokens=r.max_prompt_tokens + r.max_response_tokens,
            what=what,
            max_prompt_tokens=r.max_prompt_tokens,
        )
        return rl.data.template, budget
    from rstar2cli.sft.coldstart_recipe import SftRecipe

    sft = load_recipe(path, SftRecipe)
    what = f"data.max_seq_len {sft.data.max_seq_len}"
    return sft.data.template, Budget(source=shown, need_tokens=sft.data.max_seq_len, what=what)
