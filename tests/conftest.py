"""Shared fixtures: the tiny model (built once per session, never downloaded) and repo paths."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EVAL_DATA = REPO.parent / "shared" / "data" / "eval"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rstar2cli.data.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def eval_data_dir() -> Path:
    if not EVAL_DATA.is_dir():
        pytest.skip(f"benchmark data not found at {EVAL_DATA}")
    return EVAL_DATA
