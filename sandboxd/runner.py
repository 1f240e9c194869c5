"""Run one Python snippet inside an already-sandboxed job process and return its exit code.

What it does: compiles the snippet as a module named `main.py` (so `from __future__` imports work
and tracebacks point at the user's own line numbers, with the source line shown), executes it with
fresh globals, and, if the last statement is an expression and nothing was printed, prints its
repr (the paper's "as shown by IPython"). Uncaught exceptions print a traceback trimmed to the
user's frames and exit 1; `SystemExit` behaves as in `python main.py`.

What it does not: no isolation (that is `sandboxd.isolation`, applied before this runs) and no
status decisions (the zygote decides from the exit code, signals and stderr).

Tested through a real daemon in tests/sandboxd/test_sandbox_api.py (expression display, tracebacks,
`__future__`, stdin) and tests/sandboxd/test_hostile.py.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import io
import linecache
import mmap
import os
import sys
import traceback
from types import CodeType

FILENAME = "main.py"
_FUTURE_MASK = 0
for _name in __future__.all_feature_names:
    _FUTURE_MASK |= getattr(__future__, _name).compiler_flag


class _TrackingStdout(io.TextIOWrapper):
    """stdout that remembers whether anything was written (decides the last-expression display)."""

    wrote = False

    def write(self, s: str) -> int:
        if s:
            self.wrote = True
        return super().write(s)


def _install_streams() -> _TrackingStdout:
    stdout = _TrackingStdout(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
    )
    sys.stdout = sys.__stdout__ = stdout  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace"
    )
    return stdout


def _reseed() -> None:
    """Forked children inherit the zygote's RNG state; give each job its own."""
    import random

    random.seed()
    np_random = sys.modules.get("numpy.random")  # NOTE: never import it here; it may not be loaded
    if np_random is not None:
        np_random.seed(int.from_bytes(os.urandom(4), "little"))


def _compile(source: str) -> tuple[CodeType, CodeType | None]:
    """-> (module code without the trailing expression, code of that expression or None)."""
    tree = ast.parse(source, FILENAME, "exec")
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        body = ast.Module(body=tree.body[:-1], type_ignores=[])
        body_code = compile(body, FILENAME, "exec", dont_inherit=True)
        flags = body_code.co_flags & _FUTURE_MASK
        expr_code = compile(
            ast.Expression(last.value), FILENAME, "eval", flags=flags, dont_inherit=True
        )
        return body_code, expr_code
    return compile(tree, FILENAME, "exec", dont_inherit=True), None


def _print_exception(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next  # NOTE: drop the runner's own frames; the user sees only main.py
    lines = traceback.format_exception(type(exc), exc, tb)
    sys.stderr.write("".join(lines))


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def run(source: str) -> int:
    """Execute `source`; returns the process exit code. Never raises."""
    stdout = _install_streams()
    sys.argv = [FILENAME]
    _reseed()
    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
    user_globals = {"__name__": "__main__", "__builtins__": builtins, "__file__": FILENAME}
    # NOTE: address space set aside under RLIMIT_AS and given back on MemoryError, so that the
    # traceback can still be printed; an untouched mapping costs no page faults, a bytearray 256.
    reserve = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE)
    code = 0
    try:
        body_code, expr_code = _compile(source)
        exec(body_code, user_globals)
        if expr_code is not None:
            value = eval(expr_code, user_globals)
            if value is not None and not stdout.wrote:
                print(repr(value))
    except SystemExit as exc:
        code = _exit_code(exc)
    except MemoryError as exc:
        reserve.close()
        _print_exception(exc)
        code = 1
    except BaseException as exc:  # noqa: BLE001 - anything the snippet raises is reported, not fatal
        _print_exception(exc)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or broken stream must not change the status
            pass
    return code
