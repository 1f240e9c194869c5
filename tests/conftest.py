"""Shared fixtures: the tiny model (built once per session, never downloaded), repo paths, and
real sandbox daemons on 127.0.0.1: `daemon` per module for tests/sandboxd (hostile snippets: a
module's damage stays in its module), `sandbox_daemon` once per session for the commands the
integration tests run (tests that need special settings start their own)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import suiteplan  # tests/suiteplan.py

# No test reports anywhere: vLLM's CUDA worker posts usage statistics unless told not to (the
# subprocesses the tests start inherit this environment).
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
# NOTE: two xdist workers share two cores: one OpenMP thread per process (torch in the tests, the
# engines, trainers and graders they start, which inherit this) instead of two threads spinning
# against another process's two
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
EVAL_DATA = REPO.parent / "shared" / "data" / "eval"
# NOTE: the folder is the tier: every test is marked with its folder's name, and only that way
# (`pytest -m "unit or cli"` is the fast set, `-m integration` the real-engine one).
TIERS = ("unit", "cli", "sandboxd", "integration", "gpu")


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups given here
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).resolve().parent
    for item in items:
        folder = Path(str(item.fspath)).resolve().relative_to(tests).parts[0]
        if folder not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: tests live in one of tests/{{{','.join(TIERS)}}}"
            )
        item.add_marker(folder)
        group = suiteplan.group_of(item.nodeid, item.get_closest_marker("ray") is not None)
        item.add_marker(pytest.mark.xdist_group(group))
    # NOTE: with `--dist loadgroup --no-loadscope-reorder` (make test) xdist hands out the groups
    # in this order: longest first (tests/suiteplan.py)
    items[:] = suiteplan.longest_first(
        items,
        key=lambda it: (it.nodeid, it.get_closest_marker("xdist_group").args[0]),
        durations=suiteplan.read_durations(),
    )


NO_GROUPS = (
    "pytest-xdist cannot group tests under this pytest (--dist loadgroup): install the dev extra's "
    "pytest<9.2 (pyproject.toml)"
)


def pytest_configure(config):
    # NOTE: pytest 9.2 keeps a test's id where pytest-xdist 3.8 cannot add its "@group"; the
    # workers would then spread a module's tests, and its fixtures, over both (said here, where
    # the message shows; pytest_collection_finish below refuses on the workers themselves)
    if config.getoption("dist", "no") == "loadgroup":
        from importlib.metadata import version

        from packaging.version import Version

        pytest_version, xdist_version = (
            Version(pytest.__version__),
            Version(version("pytest-xdist")),
        )
        if pytest_version >= Version("9.2") and xdist_version <= Version("3.8.0"):
            raise pytest.UsageError(NO_GROUPS)


def pytest_collection_finish(session):
    """Under `--dist loadgroup` each worker's test ids carry their group (xdist adds "@group")."""
    # xdist sets option.loadgroup on its workers only; a plain `pytest` run has no such option
    if getattr(session.config.option, "loadgroup", False) and session.items:
        if not all("@" in item.nodeid for item in session.items):
            raise pytest.UsageError(NO_GROUPS)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rstar2cli.data.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def eval_data_dir() -> Path:
    if not EVAL_DATA.is_dir():
        pytest.skip(f"benchmark data not found at {EVAL_DATA}")
    return EVAL_DATA


@pytest.fixture(scope="session")
def prompts(tiny_model_dir) -> list[list[int]]:
    """Four prompts that share their first 300 tokens (prefix-cache hits), 300-315 tokens long."""
    from transformers import AutoTokenizer

    from rstar2cli import protocol as P

    # NOTE: a long sum, since the tiny tokenizer packs the fixed prompt text into ~80 tokens
    question = "Compute " + "+".join(str(n) for n in range(100, 200)) + "."
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(P.render_prompt(question))["input_ids"]
    assert len(ids) >= 315
    return [ids[:n] for n in (300, 305, 310, 315)]


def _hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="session")
def hf_greedy():
    """transformers' own greedy continuation: the reference the engines are checked against."""
    return _hf_greedy


def _sampling_logprobs(
    model, prompt: list[int], out_ids: list[int], temperature: float, top_p: float = 1.0
) -> list[float]:
    """Log-prob of each sampled token under transformers' logits / temperature, the top-p mass
    renormalised (one forward pass): the distribution an engine drew it from."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([prompt + out_ids])).logits[0, len(prompt) - 1 : -1]  # [T, V]
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [T, V]
    out = []
    for t, token in enumerate(out_ids):
        p = probs[t]  # [V]
        if top_p < 1.0:
            ordered, order = torch.sort(p, descending=True)
            keep = torch.cumsum(ordered, -1) - ordered < top_p
            p = torch.zeros_like(p).scatter(0, order, ordered * keep)
            p = p / p.sum()
        out.append(float(torch.log(p[token])))
    return out


@pytest.fixture(scope="session")
def sampling_logprobs():
    """The reference for engines' log-probs at a temperature and top-p."""
    return _sampling_logprobs


@pytest.fixture(scope="module")
def daemon() -> Iterator:
    from sbhelpers import SECRET  # tests/sandboxd

    from sandboxd.spawn import spawn_daemon

    env = dict(os.environ, SANDBOXD_TEST_SECRET=SECRET)
    handle = spawn_daemon(
        workers=2, timeout_s=5.0, memory_mb=256, max_output_bytes=200_000, env=env
    )
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def sandbox_daemon() -> Iterator:
    """One daemon for every integration test of a pytest process that only runs tools through it
    (2 workers, 5 s, 512 MB, the settings a tiny run needs); never stopped or reconfigured by a
    test."""
    from sandboxd.spawn import spawn_daemon

    handle = spawn_daemon(workers=2, timeout_s=5.0, memory_mb=512)
    try:
        yield handle
    finally:
        handle.stop()
