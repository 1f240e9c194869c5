"""The `rstar2` command line: the whole command list, visible in one place.

Each command lives in `rstar2cli/commands/<name>.py` as one function whose module imports nothing
heavy at top level (torch, vllm, transformers, deepspeed and ray are imported inside the
function), so `rstar2 --help` and `--version` stay instant. `main()` turns a `UserError` or a
usage error (a bad option or value) into one red line and exit code 2 (130 for an interrupt), and
any other exception into a one-line summary and exit code 1; the traceback is shown only with
`--debug` (same exit codes). vLLM logs warnings and errors only unless VLLM_LOGGING_LEVEL says
otherwise (`--debug`: everything). Tested in tests/cli/.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import typer

from rstar2cli import __version__
from rstar2cli.commands import (
    check_model,
    filter_hard,
    prepare_data,
    quickstart,
    rl_stage,
    rollout,
    serve_sandbox,
    sft_coldstart,
)
from rstar2cli.commands import eval as eval_command

app = typer.Typer(
    name="rstar2",
    help=(
        "Agentic RL for math reasoning with a Python tool (rStar2-Agent), as single-purpose "
        "commands that chain in shell scripts."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"rstar2 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version_callback,
        is_eager=True,
        help="Print the version and exit.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    """rstar2: prepare data, cold-start SFT, serve the sandbox, roll out, train GRPO-RoC, evaluate."""


def _help(command: Any) -> str:
    """A command's docstring as `--help` shows it: each paragraph one line, wrapped by the terminal.

    NOTE: Typer's rich mode keeps a docstring's line breaks after its first paragraph, which cuts
    sentences at the source's 100 columns, whatever the terminal's width. Paragraphs are separated
    by blank lines; a line that starts with "- " stays a list item on a line of its own."""
    paragraphs = []
    for block in inspect.cleandoc(command.__doc__ or "").split("\n\n"):
        lines: list[str] = []
        for line in block.splitlines():
            if lines and not line.startswith("- "):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


# The command table, in pipeline order. Each module holds exactly one function and imports
# nothing heavy at top level.
COMMANDS: dict[str, Callable[..., Any]] = {
    "prepare-data": prepare_data.prepare_data,
    "check-model": check_model.check_model,
    "sft-coldstart": sft_coldstart.sft_coldstart,
    "serve-sandbox": serve_sandbox.serve_sandbox,
    "rollout": rollout.rollout,
    "rl-stage": rl_stage.rl_stage,
    "filter-hard": filter_hard.filter_hard,
    "eval": eval_command.eval_cmd,
    "quickstart": quickstart.quickstart,
}
for _name, _function in COMMANDS.items():
    app.command(_name, help=_help(_function))(_function)


_TRACKER_WARNINGS_OFF = "ignore:resource_tracker:UserWarning"  # a PYTHONWARNINGS filter


def _plain_flags(command: Any) -> None:
    """`--force` in the help, not `--force <bool>`: switches take no value, so they show no type
    (Typer prints one for every option, the built-in --help included)."""
    from typer._click import Context

    for cmd in [command, *getattr(command, "commands", {}).values()]:
        help_option = cmd.get_help_option(Context(cmd))
        for param in [*cmd.params, *([help_option] if help_option else [])]:
            if getattr(param, "is_bool_flag", False) and param.metavar is None:
                param.metavar = ""


def _quiet_children(debug: bool) -> None:
    """Without --debug, vLLM logs warnings only and the resource tracker's exit warnings are off."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG" if debug else "WARNING")
    filters = os.environ.get("PYTHONWARNINGS", "")
    if not debug and _TRACKER_WARNINGS_OFF not in filters:
        # NOTE: multiprocessing's resource tracker (a child process) warns at exit about the
        # shared memory and semaphores it removed after processes that were killed, e.g. an
        # engine abandoned mid-start by Ctrl-C; it has removed them, so there is nothing to do
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [filters, _TRACKER_WARNINGS_OFF]))


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point with one-line errors."""
    from rich.console import Console
    from rich.markup import escape
    from typer._click.exceptions import ClickException

    from rstar2cli.errors import UserError
    from rstar2cli.fileio import remove_created_if_empty

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:  # accepted anywhere on the line, as the error hint says; it is the root's option
        args = ["--debug", *(a for a in args if a != "--debug")]
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    _quiet_children(debug)
    try:
        _plain_flags(command := typer.main.get_command(app))
        try:
            # NOTE: not standalone: a usage error comes here as an exception, to be one line;
            # what comes back is an exit code (typer.Exit, --help, Ctrl-C: 130) or None
            code = command.main(args=args, prog_name="rstar2", standalone_mode=False)
            if isinstance(code, int) and code:
                sys.exit(code)
        except BaseException as exc:  # a failed command leaves no empty folder of its own
            if not isinstance(exc, SystemExit) or exc.code not in (0, None):
                remove_created_if_empty()
            raise
    except SystemExit as exc:
        raise exc
    except ClickException as exc:  # a bad option or value: one line, with where to look
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        if msg := exc.format_message().rstrip("."):  # none when the help was shown instead
            err.print(f"[bold red]error:[/] {escape(msg)}{where}", markup=True)
        sys.exit(exc.exit_code)
    except UserError as exc:
        if debug:
            traceback.print_exc()  # then the same line and exit code as without --debug
        err.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        sys.exit(130)
    except Exception as exc:  # a bug, or a library failure we did not anticipate
        if debug:
            traceback.print_exc()
            sys.exit(1)
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        err.print(
            f"[bold red]error:[/] {type(exc).__name__}: {escape(msg)} (rerun with --debug for the "
            "traceback)",
            markup=True,
        )
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
