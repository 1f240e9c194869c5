"""User-facing errors.

`UserError` is what a command raises for bad input (a missing file, a bad recipe, a sandbox that
does not answer). The CLI entry point prints its message as one line and exits non-zero; any other
exception is a bug and gets a one-line summary too, with the traceback only under `--debug`.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment: printed as one line, exit code 2."""

    exit_code = 2


class EngineDead(UserError):
    """An engine can serve no more requests (its process died). A rollout stops at the first one:
    every request after it would fail too, and writing those trajectories as finished
    (`engine_error`) would make a resumed run skip them."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (or its type's name when it has none), for
    one-line errors that quote a library's failure."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
