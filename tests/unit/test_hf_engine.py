"""The transformers engine on the tiny model (CPU): greedy outputs equal transformers' own
`generate`, the KV budget is never exceeded (also under preemption), stop ids end generation,
seeded sampling is reproducible, weight updates take effect, cancellation frees the KV."""

from __future__ import annotations

import asyncio

import pytest

from rstar2cli import protocol as P
from rstar2cli.engines.base import METRIC_KEYS, Engine, SamplingSpec
from rstar2cli.engines.build import make_engines


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def run_all(engine, prompts, spec: SamplingSpec, watch: list[int] | None = None):
    """Generate all prompts at once; optionally sample kv_used_tokens() while they run."""

    async def main():
        async def sample_use():
            while True:
                watch.append(engine.kv_used_tokens())
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(sample_use()) if watch is not None else None
        outs = await asyncio.gather(
            *[engine.generate(f"r{i}", p, spec) for i, p in enumerate(prompts)]
        )
        if watcher is not None:
            watcher.cancel()
        return outs

    return asyncio.run(main())


def start(tiny_model_dir, kv_cache_tokens: int, seed: int = 0):
    [engine] = make_engines(
        str(tiny_model_dir),
        1,
        kind="hf",
        kv_cache_tokens=kv_cache_tokens,
        max_model_len=2048,
        seed=seed,
    )
    return engine


def test_greedy_matches_transformers_generate(tiny_model_dir, prompts, hf_model, hf_greedy):
    engine = start(tiny_model_dir, kv_cache_tokens=8192)
    assert isinstance(engine, Engine)
    outs = run_all(
        engine, prompts, SamplingSpec(max_tokens=12, temperature=0.0, want_logprobs=True)
    )
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(hf_model, prompt, 12)
        assert out.finish_reason == "length"
        assert len(out.logprobs) == 12 and all(lp < 0 for lp in out.logprobs)
    assert engine.kv_used_tokens() == 0  # everything finished, all KV freed
    assert engine.kv_capacity_tokens() == 8192
    metrics = engine.metrics()
    assert set(METRIC_KEYS) <= metrics.keys()
    assert metrics["num_generation_tokens"] == 4 * 12 and metrics["peak_kv_used_tokens"] > sum(
        len(p) for p in prompts
    )


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampled_logprobs_are_the_sampling_distributions(
    tiny_model_dir, prompts, hf_model, sampling_logprobs, top_p
):
    """At temperature 0.7 (and top-p 0.9) each log-prob is that of the distribution the token
    was drawn from, not the raw logits' (what rl/correction.py weighs against)."""
    engine = start(tiny_model_dir, kv_cache_tokens=8192)
    spec = SamplingSpec(max_tokens=8, temperature=0.7, top_p=top_p, seed=3, want_logprobs=True)
    [out] = run_all(engine, prompts[:1], spec)
    expected = sampling_logprobs(
        hf_model, prompts[0], out_ids=out.token_ids, temperature=0.7, top_p=top_p
    )
    assert out.logprobs == pytest.approx(expected, abs=1e-4)
    raw = sampling_logprobs(hf_model, prompts[0], out_ids=out.token_ids, temperature=1.0)
    assert out.logprobs != pytest.approx(raw, abs=1e-3)


def test_tight_budget_preempts_but_never_overcommits(tiny_model_dir, prompts, hf_model, hf_greedy):
    # Two prompts (300 + 305 tokens) fit 640 at admission; 12 new tokens each do not: the engine
    # must preempt (drop one sequence's KV and recompute it later) instead of exceeding the budget.
    capacity = 640
    engine = start(tiny_model_dir, kv_cache_tokens=capacity)
    seen: list[int] = []
    outs = run_all(engine, prompts, SamplingSpec(max_tokens=24, temperature=0.0), watch=seen)
    metrics = engine.metrics()
    assert metrics["num_preemptions"] > 0
    assert 0 < metrics["peak_kv_used_tokens"] <= capacity
    assert max(seen) <= capacity and max(seen) > 0
    # preemption + recompute does not change what greedy decoding produces
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(hf_model, prompt, 24)


def test_request_larger_than_budget_is_an_error_not_an_overrun(tiny_model_dir, prompts):
    engine = start(tiny_model_dir, kv_cache_tokens=200)
    [out] = run_all(engine, prompts[:1], SamplingSpec(max_tokens=4, temperature=0.0))
    assert out.finish_reason == "error" and out.token_ids == []
    assert engine.metrics()["peak_kv_used_tokens"] <= 200


def test_stop_ids_end_generation_and_are_kept(tiny_model_dir, prompts):
    engine = start(tiny_model_dir, kv_cache_tokens=4096)
    [free] = run_all(engine, prompts[:1], SamplingSpec(max_tokens=8, temperature=1.0, seed=3))
    stop_id = free.token_ids[3]
    first = free.token_ids.index(stop_id)
    [stopped] = run_all(
        engine,
        prompts[:1],
        SamplingSpec(max_tokens=8, temperature=1.0, seed=3, stop_token_ids=[stop_id]),
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]  # stop id included, last


def test_im_end_always_stops(tiny_model_dir, prompts, hf_model):
    # Make <|im_end|> the greedy next token: with tied embeddings the logit of token j is
    # <final hidden, E[j]>, so giving <|im_end|> twice the embedding of the current greedy token
    # doubles its (positive) logit. The prompt is cut before any <|im_end|> so its own input
    # embedding is never used.
    import torch

    from rstar2cli.data.tiny import build_tokenizer

    im_end = build_tokenizer().convert_tokens_to_ids(P.IM_END)
    prompt = prompts[0]
    assert im_end not in prompt[-20:]
    engine = start(tiny_model_dir, kv_cache_tokens=4096)
    [before] = run_all(engine, [prompt], SamplingSpec(max_tokens=4, temperature=0.0))
    assert before.finish_reason == "length"
    state = {k: v.clone() for k, v in hf_model.state_dict().items()}
    emb = state["model.embed_tokens.weight"]  # [V, H]
    emb[im_end] = 2.0 * emb[before.token_ids[0]]
    state["lm_head.weight"] = emb
    asyncio.run(engine.update_weights(state))
    [after] = run_all(engine, [prompt], SamplingSpec(max_tokens=4, temperature=0.0))
    assert after.token_ids == [im_end] and after.finish_reason == "stop"
    assert torch.equal(engine.model.get_input_embeddings().weight[im_end], emb[im_end])


def test_seeded_sampling_is_reproducible(tiny_model_dir, prompts):
    spec = [SamplingSpec(max_tokens=16, temperature=1.0, seed=s) for s in (11, 12)]
    a = start(tiny_model_dir, kv_cache_tokens=4096)
    b = start(tiny_model_dir, kv_cache_tokens=4096)

    async def both(engine):
        return await asyncio.gather(
            *[engine.generate(f"s{i}", prompts[0], s) for i, s in enumerate(spec)]
        )

    out_a, out_b = asyncio.run(both(a)), asyncio.run(both(b))
    assert [o.token_ids for o in out_a] == [o.token_ids for o in out_b]
    assert out_a[0].token_ids != out_a[1].token_ids  # different seeds, different samples
    [alone] = run_all(b, prompts[:1], spec[0])  # same seed, different batch company
    assert alone.token_ids == out_a[0].token_ids


def test_update_from_folder_matches_new_weights(tiny_model_dir, prompts, tmp_path, hf_greedy):
    import torch
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():  # louder layers: greedy output stops being "repeat the last token"
        for name, param in new.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(20.0)
    new.save_pretrained(tmp_path / "new")
    engine = start(tiny_model_dir, kv_cache_tokens=4096)
    spec = SamplingSpec(max_tokens=10, temperature=0.0)
    [before] = run_all(engine, prompts[:1], spec)
    asyncio.run(engine.update_weights(str(tmp_path / "new")))
    [after] = run_all(engine, prompts[:1], spec)
    assert after.token_ids != before.token_ids
    assert after.token_ids == hf_greedy(new, prompts[0], 10)


def test_cancelled_request_frees_its_kv(tiny_model_dir, prompts):
    engine = start(tiny_model_dir, kv_cache_tokens=4096)

    async def main():
        task = asyncio.create_task(
            engine.generate("long", prompts[0], SamplingSpec(max_tokens=500, temperature=0.0))
        )
        while engine.kv_used_tokens() == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        out = await engine.generate("next", prompts[1], SamplingSpec(max_tokens=3, temperature=0.0))
        await engine.shutdown()
        return out

    out = asyncio.run(main())
    assert len(out.token_ids) == 3
    assert engine.kv_used_tokens() == 0


def test_a_dtype_is_refused_for_the_transformers_engine_before_it_starts(tiny_model_dir):
    from rstar2cli.errors import UserError

    with pytest.raises(UserError, match="dtype 'bfloat16' is for vllm engines"):
        make_engines(str(tiny_model_dir), 1, kind="hf", max_model_len=256, dtype="bfloat16")
