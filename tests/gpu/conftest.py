"""tests/gpu: every test here needs CUDA and is skipped without it (the folder is the tier, see
tests/conftest.py). tests/gpu/smoke.py is the script they run; `make gpu-smoke` runs it on a
machine without the project's CPU stack."""

from __future__ import annotations

import pytest


def pytest_runtest_setup(item):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
