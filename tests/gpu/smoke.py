"""GPU smoke: the GPU-only paths of the trainer, the weight sync and the transformers engine, on one
GPU, in a few minutes, without vLLM or Ray (what a lent H100 image with torch, transformers and
accelerate can run once DeepSpeed travels as a wheel: `make gpu-wheels`, then `make gpu-smoke`).

Stages, each in a subprocess of its own under a timeout, each appending one JSON line to --out
({"stage", "ok", "seconds", ...measurements, "error" on failure}), so a run cut off still reports
what it finished:
- env: torch/CUDA/NCCL/DeepSpeed/transformers versions, the device, bf16 support.
- logprobs: `chunked_logprobs` (3 chunks) against a full log-softmax, values and gradients,
  fp32 and bf16.
- train_zero0 / train_zero2 / train_zero3: one RL update of `PolicyTrainer` (bf16, gradient
  checkpointing, 2 micro-batches of long trajectories): finite loss and grad norm, weights moved,
  the optimizer, the gradient accumulation dtype (fp32 under ZeRO 2/3), peak memory.
- train_lora: LoRA RL updates under ZeRO-3 (2 mini-batches: the old-log-prob pass with the
  adapter on; a KL term against the base with it off): the base unchanged, the adapter moved,
  the broadcast push equal to the merged buckets, a checkpoint of the adapter alone that a new
  trainer resumes to the same weights, final/ merged with final_adapter/ beside it.
- buckets: weight buckets packed and unpacked on the device, checksums equal to the CPU's, and
  `send_module` through a one-member transfer group (NCCL on a GPU: its probe included).
- sft_collectives: the SFT loss sums all-reduced on the engine's device over the default group
  (NCCL on a GPU), and a CPU tensor refused there (why sft/train.py moves it).
- hf_engine: `HfEngine` on the device: greedy equals transformers' generate, seeded sampling
  repeats.
- agreement: the engine's log-probs of its own samples against the trainer's `ScoringLM` on the
  same tokens.

`--device cpu` runs the same stages on the CPU (fp32, gloo, a smaller model) so the script is
checked on every CPU run (tests/integration/test_gpu_smoke_cpu.py); the GPU run is tests/gpu/test_smoke.py.
What it cannot reach: vLLM (start, KV sizing, sleep/wake, reload), Ray placement, NCCL between two
GPUs, a 14B model; those need a node with CUDA vLLM (README, "Running on a cluster").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STAGES = (
    "env",
    "logprobs",
    "train_zero0",
    "train_zero2",
    "train_zero3",
    "train_lora",
    "buckets",
    "sft_collectives",
    "hf_engine",
    "agreement",
)
STAGE_TIMEOUT_S = {"train_zero0": 120, "train_zero2": 120, "train_zero3": 150, "train_lora": 180}
DEFAULT_STAGE_TIMEOUT_S = 60
SIZE_NAMES = ("tiny", "small", "100m")  # rstar2cli.data.tiny.SIZES


def _device(args: argparse.Namespace) -> Any:
    import torch

    return torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")


def _dtype(args: argparse.Namespace) -> Any:
    import torch

    return torch.bfloat16 if args.device == "cuda" else torch.float32


# -- stages ---------------------------------------------------------------------------------


def stage_env(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    out: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        import deepspeed

        out["deepspeed"] = deepspeed.__version__
    except ImportError as exc:
        out["deepspeed"] = f"missing: {exc}"
    if args.device == "cuda":
        assert torch.cuda.is_available(), "--device cuda without CUDA"
        props = torch.cuda.get_device_properties(0)
        out |= {
            "gpu": props.name,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": list(torch.cuda.get_device_capability(0)),
            "bf16": torch.cuda.is_bf16_supported(),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        }
        options = torch.distributed.ProcessGroupNCCL.Options()  # type: ignore[attr-defined]
        options._timeout = datetime.timedelta(seconds=30)  # as weight_sync.open_group sets it
    return out


def stage_logprobs(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rstar2cli.lm_scoring import chunked_logprobs

    dev = _device(args)
    torch.manual_seed(0)
    num_tokens, hidden_size, vocab = 2500, 64, 5000  # 3 chunks of 1024
    out: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        head = torch.nn.Linear(hidden_size, vocab, bias=False).to(dev, dtype)
        hidden = torch.randn(num_tokens, hidden_size, device=dev, dtype=dtype, requires_grad=True)
        targets = torch.randint(0, vocab, (num_tokens,), device=dev)
        logp, _ = chunked_logprobs(hidden, head, targets, chunk_tokens=1024)
        (logp.sum()).backward()
        grads = (hidden.grad.clone(), head.weight.grad.clone())
        hidden.grad, head.weight.grad = None, None
        full = torch.log_softmax(head(hidden).float(), dim=-1).gather(-1, targets[:, None])
        full.sum().backward()
        name = str(dtype).removeprefix("torch.")
        value_diff = float((logp - full.squeeze(-1)).abs().max())
        grad_diff = max(
            float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))
            for a, b in zip(grads, (hidden.grad, head.weight.grad), strict=True)
        )
        out[f"{name}_max_abs_logprob_diff"] = value_diff
        out[f"{name}_max_rel_grad_diff"] = grad_diff
        limit = 1e-5 if dtype == torch.float32 else 1e-2
        assert value_diff <= limit, f"{name}: chunked log-probs off by {value_diff}"
        assert grad_diff <= limit * 10, f"{name}: chunked gradients off by {grad_diff}"
    return out


def _samples(vocab: int, num: int, tokens: int) -> list[Any]:
    import random

    from rstar2cli.rl.batch import TrainSample

    rng = random.Random(0)
    out = []
    for i in range(num):
        prompt = [rng.randrange(vocab) for _ in range(tokens // 8)]
        response = [rng.randrange(vocab) for _ in range(tokens - len(prompt))]
        mask = [0 if 10 <= j < 20 else 1 for j in range(len(response))]  # a tool answer inside
        out.append(TrainSample(prompt, response, mask, 1.0 if i % 2 else -0.5))
    return out


def _train(args: argparse.Namespace, zero_stage: int) -> dict[str, Any]:
    import math

    import torch

    from rstar2cli.rl.train_recipe import RlTrainConfig
    from rstar2cli.rl.trainer import PolicyTrainer, plan_update
    from rstar2cli.train_utils import init_distributed

    on_gpu = args.device == "cuda"
    init_distributed()
    tokens = 3072 if on_gpu else 96  # per trajectory
    cfg = RlTrainConfig(
        lr=1.0e-3,  # NOTE: large enough that one step moves bf16 weights (8-bit mantissa)
        warmup_steps=0,
        num_mini_batches=1,
        max_tokens_per_micro_batch=2 * tokens,  # 4 trajectories -> 2 micro-batches
        num_trainer_ranks=1,
        zero_stage=zero_stage,
        gradient_checkpointing=True,
        # NOTE: bf16 on the GPU, what the recipes run; DeepSpeed's ZeRO-0 bf16 needs a GPU
        precision="bf16" if on_gpu else "fp32",
    )
    trainer = PolicyTrainer(str(args.model), cfg)
    before = {n: t.clone() for b in trainer.weight_buckets() for n, t in b}
    vocab = len(trainer.tokenizer)
    plans, mini_tokens = plan_update(
        _samples(vocab, 4, tokens), 1, 1, cfg.max_tokens_per_micro_batch, (0, 0, 1)
    )
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    sums = trainer.update(plans[0], mini_tokens)
    update_s = time.perf_counter() - began
    after = {n: t for b in trainer.weight_buckets() for n, t in b}
    moved = sum(not torch.equal(before[n], after[n]) for n in before)
    optimizer = trainer.engine.optimizer
    accum = getattr(optimizer, "gradient_accumulation_dtype", None)
    out = {
        "zero_stage": zero_stage,
        "precision": cfg.precision,
        "num_micro_batches": sum(len(mini) for mini in plans[0]),
        "loss": sums.loss / max(1, sums.num_tokens),
        "grad_norms": sums.grad_norms,
        "weights_moved": f"{moved}/{len(before)}",
        "optimizer": type(optimizer).__name__,
        "grad_accum_dtype": None if accum is None else str(accum).removeprefix("torch."),
        "update_s": round(update_s, 2),
    }
    if on_gpu:
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    assert math.isfinite(out["loss"]), "loss is not finite"
    assert all(g is None or math.isfinite(g) for g in sums.grad_norms), "grad norm not finite"
    assert moved > 0, "the update moved no weight"
    if on_gpu and zero_stage >= 1:
        assert out["grad_accum_dtype"] == "float32", f"accumulating in {out['grad_accum_dtype']}"
    if zero_stage == 3:
        folder = Path(tempfile.mkdtemp(prefix="smoke-hf-"))
        trainer.save_hf(folder / "final")
        out["saved_files"] = sorted(p.name for p in (folder / "final").iterdir())
    return out


def stage_train_zero0(args: argparse.Namespace) -> dict[str, Any]:
    return _train(args, 0)


def stage_train_zero2(args: argparse.Namespace) -> dict[str, Any]:
    return _train(args, 2)


def stage_train_zero3(args: argparse.Namespace) -> dict[str, Any]:
    return _train(args, 3)


def _gathered_copy(named: list[tuple[str, Any]]) -> dict[str, Any]:
    import deepspeed

    with deepspeed.zero.GatheredParameters([p for _, p in named]):
        return {n: p.detach().to("cpu", copy=True) for n, p in named}


def _merged(trainer: Any) -> dict[str, Any]:
    return {n: t for b in trainer.weight_buckets() for n, t in b}


def _lora_push_checksums(trainer: Any, args: argparse.Namespace) -> tuple[int | None, int]:
    """The broadcast push through a one-member group, and the checksum of the disk path's
    merged buckets packed by the same plan: both paths must send the same bytes."""
    import torch

    from rstar2cli.cluster import weight_sync as ws

    wire = str(_dtype(args)).removeprefix("torch.")
    plan = trainer.weight_plan(wire)
    backend = "nccl" if args.device == "cuda" else "gloo"
    group = ws.open_group(ws.GroupAddress("127.0.0.1", ws.free_port(), 1, backend), 0, 30)
    sent = trainer.send_weights(group, plan)
    merged = _merged(trainer)
    scratch = ws.empty_buffer(ws._largest(plan), wire, "cpu")
    with torch.no_grad():
        sums = [ws.checksum(ws.pack([merged[s.name] for s in b], b, scratch)) for b in plan.buckets]
    return sent, ws.combine(sums)


def stage_train_lora(args: argparse.Namespace) -> dict[str, Any]:
    return _train_lora(args, zero_stage=3)  # ZeRO-3: the gathers the merge and saves go through


def _train_lora(args: argparse.Namespace, zero_stage: int) -> dict[str, Any]:
    import math

    import torch

    from rstar2cli.lora import LoraConfig, adapter_state
    from rstar2cli.rl.train_recipe import RlTrainConfig
    from rstar2cli.rl.trainer import PolicyTrainer, plan_update
    from rstar2cli.train_utils import init_distributed

    on_gpu = args.device == "cuda"
    init_distributed()
    tokens = 1024 if on_gpu else 96
    cfg = RlTrainConfig(
        lr=1.0e-3,
        warmup_steps=0,
        num_mini_batches=2,  # the second is scored before the step: the old-log-prob pass
        kl_coef=0.1,  # the reference: the base, adapters off
        max_tokens_per_micro_batch=2 * tokens,
        zero_stage=zero_stage,
        gradient_checkpointing=True,
        precision="bf16" if on_gpu else "fp32",
        lora=LoraConfig(enabled=True, rank=8, alpha=16),
    )
    first = PolicyTrainer(str(args.model), cfg)
    lm = first.engine.module.lm
    base = [(n, p) for n, p in lm.named_parameters() if not p.requires_grad]
    base_before = _gathered_copy(base)
    adapter_before = _gathered_copy(adapter_state(lm))
    vocab = len(first.tokenizer)
    steps = [
        plan_update(_samples(vocab, 8, tokens), 2, 1, cfg.max_tokens_per_micro_batch, (0, 0, k))
        for k in (1, 2)
    ]
    began = time.perf_counter()
    sums = first.update(steps[0][0][0], steps[0][1])
    update_s = time.perf_counter() - began
    base_moved = [n for n, t in _gathered_copy(base).items() if not torch.equal(t, base_before[n])]
    adapter_after = _gathered_copy(adapter_state(lm))
    adapter_moved = sum(not torch.equal(adapter_after[n], t) for n, t in adapter_before.items())
    sent, packed = _lora_push_checksums(first, args)
    work = Path(tempfile.mkdtemp(prefix="smoke-lora-"))
    first.save_checkpoint(work / "ckpt", 1, {"step": 1})
    states = next((work / "ckpt" / "step1").glob("*model_states.pt"))
    module_keys = list(torch.load(states, weights_only=False)["module"])
    first.update(steps[1][0][0], steps[1][1])
    straight = _merged(first)
    first.save_hf(work / "final")
    del first
    second = PolicyTrainer(str(args.model), cfg)
    client = second.load_checkpoint(work / "ckpt")
    second.update(steps[1][0][0], steps[1][1])
    resumed = _merged(second)
    resume_diff = max(float((straight[n] - t).abs().max()) for n, t in resumed.items())
    out = {
        "loss": sums.loss / max(1, sums.num_tokens),
        "kl_ref": sums.kl_ref / max(1, sums.num_tokens),
        "grad_norms": sums.grad_norms,
        "base_moved": len(base_moved),
        "adapter_moved": f"{adapter_moved}/{len(adapter_before)}",
        "checkpoint_module_keys": len(module_keys),
        "resume_max_abs_diff": resume_diff,
        "final_files": sorted(p.name for p in (work / "final").iterdir()),
        "adapter_files": sorted(p.name for p in (work / "final_adapter").iterdir()),
        "update_s": round(update_s, 2),
    }
    assert math.isfinite(out["loss"]), "loss is not finite"
    assert not base_moved, f"the frozen base moved: {base_moved[:3]}"
    assert adapter_moved == len(adapter_before), f"adapter moved {out['adapter_moved']}"
    assert sent == packed, "the broadcast push differs from the merged buckets"
    assert set(module_keys) == {f"lm.{n}" for n in adapter_before}, "not the adapter alone"
    assert client is not None and client.get("step") == 1, client
    assert resume_diff <= (1e-2 if on_gpu else 0.0), f"resumed weights differ by {resume_diff}"
    assert "adapter_model.safetensors" in out["adapter_files"]
    return out


def _model(args: argparse.Namespace, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(args.model), dtype=dtype).to(_device(args))


def stage_buckets(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rstar2cli.cluster import weight_sync as ws

    dev, dtype = _device(args), _dtype(args)
    wire = str(dtype).removeprefix("torch.")
    model = _model(args, torch.float32)  # an fp32 master copy, cast to the wire dtype
    bucket_bytes = 16 * 2**20 if args.device == "cuda" else 2**19  # several buckets either way
    plan = ws.module_plan(model, wire, max_bucket_bytes=bucket_bytes)
    scratch = ws.empty_buffer(ws._largest(plan), wire, dev)
    params = dict(model.named_parameters())
    device_sums, host_sums = [], []
    with torch.no_grad():
        for bucket in plan.buckets:
            buffer = ws.pack([params[s.name] for s in bucket], bucket, scratch)
            device_sums.append(ws.checksum(buffer))
            host_sums.append(ws.checksum(buffer.cpu()))
            for name, view in ws.unpack(buffer, bucket):
                assert torch.equal(view, params[name].to(dtype)), f"{name} changed in the bucket"
    assert device_sums == host_sums, "device checksums differ from the CPU's"
    backend = "nccl" if args.device == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(dev)
    address = ws.GroupAddress("127.0.0.1", ws.free_port(), 1, backend)
    group = ws.open_group(address, 0, timeout_s=30)  # includes the probe broadcast
    sent = ws.send_module(
        model, group, plan, zero3=False, device=dev if backend == "nccl" else "cpu"
    )
    assert sent == ws.combine(host_sums), "send_module's checksum differs from the packed bytes'"
    return {
        "num_buckets": len(plan.buckets),
        "wire_dtype": wire,
        "backend": backend,
        "bytes": plan.num_bytes(),
    }


def stage_sft_collectives(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from rstar2cli.sft import train
    from rstar2cli.train_utils import init_distributed

    init_distributed()
    dev = _device(args)
    backend = dist.get_backend()
    # NOTE: one rank; sft/train.py skips the all-reduce at world 1, so it is told 2 here: the
    # all-reduce over the one-member group then runs exactly as with more ranks
    real_world_size = dist.get_world_size
    dist.get_world_size = lambda *a, **k: 2  # type: ignore[assignment]
    try:
        sums = train._all_sum([1.0, 2.0, 3.0], dev)
    finally:
        dist.get_world_size = real_world_size  # type: ignore[assignment]
    assert sums == [1.0, 2.0, 3.0], sums
    dist.barrier()
    out: dict[str, Any] = {"backend": backend, "device": str(dev)}
    if backend == "nccl":
        try:
            dist.all_reduce(torch.tensor([1.0], dtype=torch.float64))
            out["cpu_tensor_on_nccl"] = "accepted"
        except Exception as exc:  # the failure sft/train.py avoids
            out["cpu_tensor_on_nccl"] = f"refused: {str(exc).splitlines()[0][:120]}"
    dist.destroy_process_group()
    return out


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


def stage_hf_engine(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rstar2cli.engines.base import SamplingSpec
    from rstar2cli.engines.hf_engine import HfEngine

    dev = _device(args)
    engine = HfEngine(
        str(args.model), kv_cache_tokens=4096, max_model_len=1024, device=str(dev), dtype="float32"
    )
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]]

    async def both(spec: SamplingSpec, tag: str) -> list[Any]:
        import asyncio

        return await asyncio.gather(
            *(engine.generate(f"{tag}{i}", p, spec) for i, p in enumerate(prompts))
        )

    greedy = _run(both(SamplingSpec(max_tokens=24, temperature=0.0), "g"))
    for prompt, out in zip(prompts, greedy, strict=True):
        with torch.inference_mode():
            ref = engine.model.generate(
                torch.tensor([prompt], device=dev), max_new_tokens=24, do_sample=False
            )[0, len(prompt) :].tolist()
        got = out.token_ids
        assert got == ref[: len(got)], f"greedy {got} != transformers {ref}"
    spec = SamplingSpec(max_tokens=24, temperature=1.0, seed=7)
    first = [o.token_ids for o in _run(both(spec, "s"))]
    second = [o.token_ids for o in _run(both(spec, "t"))]
    assert first == second, "seeded sampling did not repeat"
    return {"device": str(engine.device), "greedy_tokens": [len(o.token_ids) for o in greedy]}


def stage_agreement(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rstar2cli.engines.base import SamplingSpec
    from rstar2cli.engines.hf_engine import HfEngine
    from rstar2cli.lm_scoring import ScoringLM

    dev = _device(args)
    out: dict[str, Any] = {}
    for dtype in ("float32", "bfloat16") if args.device == "cuda" else ("float32",):
        engine = HfEngine(
            str(args.model), kv_cache_tokens=4096, max_model_len=1024, device=str(dev), dtype=dtype
        )
        prompt = [5, 6, 7, 8, 9, 10, 11, 12]
        spec = SamplingSpec(max_tokens=32, temperature=1.0, seed=3, want_logprobs=True)
        gen = _run(engine.generate("a", prompt, spec))
        assert gen.logprobs is not None and len(gen.logprobs) == len(gen.token_ids)
        scorer = ScoringLM(engine.model)
        ids = torch.tensor([prompt + gen.token_ids], device=dev)  # [1, L]
        n = len(gen.token_ids)
        cols = torch.arange(len(prompt) - 1, len(prompt) - 1 + n, device=dev)
        with torch.no_grad():
            logp, _ = scorer(
                ids, torch.zeros(n, dtype=torch.long, device=dev), cols, ids[0, len(prompt) :]
            )
        diff = float((logp.cpu() - torch.tensor(gen.logprobs)).abs().max())
        out[f"{dtype}_max_abs_logprob_diff"] = diff
        # NOTE: bf16: a cached, batched decode against one full forward; rounding differs
        limit = 1e-3 if dtype == "float32" else 0.25
        assert diff <= limit, f"{dtype}: engine and trainer log-probs differ by {diff}"
        del engine, scorer
    return out


# -- the driver -----------------------------------------------------------------------------


def run_stage(args: argparse.Namespace) -> None:
    """In a child: one stage, one JSON line appended to --out."""
    fn: Callable[[argparse.Namespace], dict[str, Any]] = globals()[f"stage_{args.stage}"]
    began = time.perf_counter()
    row: dict[str, Any] = {"stage": args.stage, "device": args.device}
    try:
        row |= fn(args)
        row["ok"] = True
    except Exception as exc:
        row |= {
            "ok": False,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
        }
    row["seconds"] = round(time.perf_counter() - began, 1)
    _append(args.out, row)
    if not row["ok"]:
        sys.exit(1)


def _append(path: Path, row: dict[str, Any]) -> None:
    line = json.dumps(row, default=str)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    print(line, flush=True)


def _stage_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU run stays on the CPU on a GPU machine too
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # each stage is a world of its own
    return env


def run_all(args: argparse.Namespace) -> int:
    """Build the model once, then every stage in a child process under its timeout."""
    from rstar2cli.data.tiny import build_tiny_model_dir

    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rstar2-smoke-"))
    size = args.size or ("100m" if args.device == "cuda" else "tiny")
    model = build_tiny_model_dir(work / "model", seed=0, size=size)
    failed = 0
    for stage in args.stages:
        cmd = [sys.executable, __file__, "--stage", stage, "--device", args.device]
        cmd += ["--model", str(model), "--out", str(args.out)]
        timeout_s = STAGE_TIMEOUT_S.get(stage, DEFAULT_STAGE_TIMEOUT_S) * args.timeout_scale
        began = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, env=_stage_env(args), timeout=timeout_s, capture_output=True, text=True
            )
        except subprocess.TimeoutExpired:
            _append(
                args.out,
                {"stage": stage, "ok": False, "error": f"timed out after {timeout_s:.0f} s"},
            )
            failed += 1
            continue
        if proc.returncode != 0:
            failed += 1
            if not _has_row(args.out, stage):  # died before it could write its own line
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                _append(
                    args.out,
                    {
                        "stage": stage,
                        "ok": False,
                        "exit": proc.returncode,
                        "error": " | ".join(tail)[:600],
                        "seconds": round(time.perf_counter() - began, 1),
                    },
                )
    return 1 if failed else 0


def _has_row(path: Path, stage: str) -> bool:
    if not path.exists():
        return False
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return bool(rows) and rows[-1].get("stage") == stage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=Path("smoke.jsonl"))
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=tuple(SIZE_NAMES), help="tiny-kit model size")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="x every stage's timeout")
    args = parser.parse_args(argv)
    # NOTE: the GPU image runs the checkout without installing it (`pip install -e` would try to
    # resolve vLLM and Ray): the repository is the import root, here and in every stage
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if args.stage is not None:
        run_stage(args)
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
