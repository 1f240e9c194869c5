"""Calls made on every trainer rank at once (Ray actors), and a failing rank as one line.

`gather_ranks` waits for one call on every rank and raises at the first rank that fails, without
waiting for the others (they may be waiting for it in a collective). Its error is a
`TrainerRankError`: one line naming the rank, the call, the exception's type and its message,
never Ray's colour codes or actor ids (the CLI prints it as it prints any error); its
`__cause__` is Ray's error with the rank's own traceback, which `--debug` prints. A rank's
`UserError` (bad input it found) is raised as it is.

What it does not do: start, place or restart actors (rstar2cli.rl.workers).
Tested in tests/integration/test_trainer_ranks.py (a rank that fails while the other waits).
"""

from __future__ import annotations

import re
from typing import Any

from rstar2cli.errors import UserError, first_line


class TrainerRankError(RuntimeError):
    """A trainer rank failed in a call: one line naming the rank, the call, the exception and its
    message; `__cause__` holds Ray's error with the rank's traceback (shown under --debug)."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def gather_ranks(refs: list[Any], what: str, first_rank: int = 0) -> list[Any]:
    """The results of one call on ranks first_rank, first_rank + 1, ... (`ray.get`), raising at
    the first rank whose call failed, without waiting for the others (which may wait for it in a
    collective): a `TrainerRankError`, or the rank's own `UserError`."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except (RayTaskError, RayActorError) as exc:
            rank = first_rank + refs.index(ready[0])
            cause = exc.cause if isinstance(exc, RayTaskError) else None
            if isinstance(cause, UserError):
                raise cause from exc
            raise rank_error(rank, what, cause or exc) from exc
    return ray.get(refs)


def rank_error(rank: int, what: str, cause: BaseException) -> TrainerRankError:
    """One line: the rank, the call, the exception's type and the first line of its message."""
    text = _ANSI.sub("", first_line(cause))
    return TrainerRankError(f"trainer rank {rank} failed in {what}: {type(cause).__name__}: {text}")
