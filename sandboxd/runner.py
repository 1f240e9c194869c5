"""Run one Python snippet inside an already-sandboxed job process and return its exit code.

What it does: compiles the snippet as a module named `main.py` (so `from __future__` imports work
and tracebacks point at the user's own line numbers, with the source line shown), executes it with
fresh globals, and, if the last statement is an expression and nothing was printed, prints its
repr (the paper's "as shown by IPython"). Uncaught exceptions print a traceback trimmed to the
user's frames and exit 1; `SystemExit` behaves as in `python main.py`.

Work moved before the fork. Whatever a job process writes to costs it a copy-on-write page fault
(~3-5 us each), and compiling even a three-line snippet writes to ~190 pages of the interpreter
(~0.6 ms). So the runner process compiles short snippets itself (`precompile`) and the job
inherits the code objects; the stdio wrappers are made once per runner (`prepare_streams`).
Longer code is compiled by the job, under its own limits: a 600 KB tuple literal takes the
compiler ~1 s and ~300 MB, which must not be spent outside them.

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
from dataclasses import dataclass
from types import CodeType

FILENAME = "main.py"
PRECOMPILE_MAX_CHARS = 16_384  # longest source the runner compiles (a few ms and MB at most)
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


class _PipeIO(io.FileIO):
    """A job's fd 0, 1 or 2: always a pipe, whatever that fd is in the runner that made it."""

    def seekable(self) -> bool:
        return False


@dataclass(frozen=True)
class _Streams:
    stdin: io.TextIOWrapper
    stdout: _TrackingStdout
    stderr: io.TextIOWrapper


def _make_streams() -> _Streams:
    return _Streams(
        stdin=io.TextIOWrapper(_PipeIO(0, "r", closefd=False), encoding="utf-8", errors="replace"),
        stdout=_TrackingStdout(
            _PipeIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
        ),
        stderr=io.TextIOWrapper(
            _PipeIO(2, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        ),
    )


_prepared: _Streams | None = None


def prepare_streams() -> None:
    """Make the jobs' stdio wrappers in the runner process, once; every job inherits them unused.

    NOTE: the runner itself never writes to them, so each job starts from empty buffers.
    """
    global _prepared
    _prepared = _make_streams()


def _install_streams() -> _TrackingStdout:
    streams = _prepared if _prepared is not None else _make_streams()
    sys.stdin = sys.__stdin__ = streams.stdin  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = streams.stdout  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = streams.stderr  # type: ignore[misc]
    return streams.stdout


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


@dataclass(frozen=True)
class Compiled:
    """A snippet compiled by the runner: its two code objects, or the error compiling raised."""

    body: CodeType | None = None
    expr: CodeType | None = None
    error: Exception | None = None


def precompile(source: str) -> Compiled | None:
    """Compile `source` in the runner, before the fork; None if it is too long (the job will)."""
    if len(source) > PRECOMPILE_MAX_CHARS:
        return None
    _remember_source(source)
    try:
        body, expr = _compile(source)
    except Exception as exc:  # noqa: BLE001 - SyntaxError, RecursionError, ...: the job reports it
        return Compiled(error=exc)
    return Compiled(body, expr)


def _remember_source(source: str) -> None:
    """Let tracebacks show the user's source lines."""
    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)


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


def run(source: str, compiled: Compiled | None = None) -> int:
    """Execute `source` (`compiled`: its `precompile`); returns the exit code. Never raises."""
    stdout = _install_streams()
    sys.argv = [FILENAME]
    _reseed()
    if compiled is None:
        _remember_source(source)
    user_globals = {"__name__": "__main__", "__builtins__": builtins, "__file__": FILENAME}
    # NOTE: address space set aside under RLIMIT_AS and given back on MemoryError, so that the
    # traceback can still be printed; an untouched mapping costs no page faults, a bytearray 256.
    reserve = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE)
    code = 0
    try:
        if compiled is None:
            body_code, expr_code = _compile(source)
        elif compiled.error is not None:
            raise compiled.error
        else:
            assert compiled.body is not None
            body_code, expr_code = compiled.body, compiled.expr
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
