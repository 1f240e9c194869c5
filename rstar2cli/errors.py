"""User-facing errors.

`UserError` is what a command raises for bad input (a missing file, a bad recipe, a sandbox that
does not answer). The CLI entry point prints its message as one line and exits non-zero; any other
exception is a bug and gets a one-line summary too, with the traceback only under `--debug`.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment: printed as one line, exit code 2."""

    exit_code = 2
