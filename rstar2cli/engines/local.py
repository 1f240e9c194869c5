"""One engine of a kind in this process: what a command's in-process engines and each Ray actor run.

The engine modules are imported only when asked for, so building an HF engine never imports vLLM.
Tested through tests/unit/test_hf_engine.py and tests/integration/test_vllm_engine.py.
"""

from __future__ import annotations

from rstar2cli.engines.base import ENGINE_KINDS, Engine


def build_engine(kind: str, **kwargs) -> Engine:
    """One engine of `kind` in this process (also what each Ray actor runs)."""
    if kind == "vllm":
        from rstar2cli.engines.vllm_engine import VllmEngine

        return VllmEngine(**kwargs)
    if kind == "hf":
        from rstar2cli.engines.hf_engine import HfEngine

        return HfEngine(**kwargs)
    raise ValueError(f"unknown engine kind {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
