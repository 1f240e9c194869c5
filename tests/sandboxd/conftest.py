"""Fixtures for the sandboxd suite: real daemons on 127.0.0.1 started with `spawn_daemon`.

One shared daemon per module keeps the suite fast on two cores; tests that need special settings
(a tiny queue, a second daemon) start their own and stop them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sbhelpers import SECRET

from sandboxd.server import DaemonHandle, spawn_daemon


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonHandle]:
    env = dict(os.environ, SANDBOXD_TEST_SECRET=SECRET)
    handle = spawn_daemon(
        workers=2, timeout_s=5.0, memory_mb=256, max_output_bytes=200_000, env=env
    )
    try:
        yield handle
    finally:
        handle.stop()
