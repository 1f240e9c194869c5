"""One RL update on one GPU against what the chip can do: trained tokens/s and model FLOPs
utilisation (MFU), through rl-stage's own trainer.

Per shape, in a process of its own: a Qwen3 model of that shape (the config is written below,
the weights are random, saved as an HF folder in bf16), loaded by `PolicyTrainer` exactly as
rl-stage loads it (DeepSpeed ZeRO-2, bf16 with fp32 gradient accumulation, gradient checkpointing
of the decoder layers, chunked log-probs of the model tokens: rstar2cli/lm_scoring.py). It runs
one warm-up update on an eighth of the batch, then one timed update: 64 trajectories of 8,192
tokens (a 1,024-token prompt, a 7,168-token response holding a 64-token tool response, masked),
one mini-batch (one optimizer step, the paper's setting: no old-log-prob pass), micro-batches of
at most the stage recipes' 20,480 tokens (two trajectories each).

One JSON line per shape (--out): update seconds, trained tokens/s (every token of the batch),
the model's FLOPs, MFU against the rated dense bf16 peak (989 TFLOP/s for an H100 or H200 SXM,
the denominator published MFU figures use) and against a bf16 8192^3 matrix product timed in the
same process (what the chip really reaches), peak GPU memory. `--profile` adds torch.profiler's
table of where an update's time goes (OUT.SHAPE.profile.txt), taken on a quarter of the batch
after the timed update: every micro-batch is alike, only the optimizer step's share is 4x.

FLOPs of one update, PaLM's count (Chowdhery et al. 2022, appendix B): 6 x N x T for the
matrices, where N counts the decoder layers' weight matrices (q, k, v, o, gate, up, down; no
norms, no embedding lookup) and T every token of the batch; plus 6 x V x H for the output layer
at each scored position only (the model tokens: chunked log-probs skip the rest); plus attention,
12 x L x (heads x head_dim) x S per token for sequences of S tokens. PaLM does not halve the
attention term for the causal mask (a causal kernel does about half that work), and counts no
recomputation: gradient checkpointing runs each layer's forward twice, about 8N per token of work,
which MFU leaves out by definition.

`--shapes A B C --time-limit-s T` runs shapes in order while the next one's estimate (scaled
from the last) fits in T; the rest get a "skipped" line. `--device cpu --shape tiny`: a tiny
shape, four short trajectories, fp32, for CI (tests/integration/test_gpu_update_cpu.py; on a GPU,
tests/gpu/test_update.py). Not measured: several ranks, ZeRO-3's gathers, rollouts, the weight
sync, padding (equal lengths: attention runs unmasked, as causal; rollouts of mixed lengths pad).
Run from the repository root: python -m benchmarks.gpu_update --shape qwen3-0.6b
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RATED_BF16_TFLOPS = 989.0  # H100 / H200 SXM, dense (the vendors' datasheets)


@dataclass(frozen=True)
class Shape:
    """A Qwen3 decoder's shape (the public configs' values; tied input and output embeddings)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 128
    vocab_size: int = 151936


SHAPES = {
    "qwen3-0.6b": Shape(
        hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8
    ),
    "qwen3-1.7b": Shape(
        hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16, num_kv_heads=8
    ),
    "qwen3-4b": Shape(
        hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32, num_kv_heads=8
    ),
    # CI's CPU run: the tiny kit's size (rstar2cli/data/tiny.py), with a vocabulary of its own
    "tiny": Shape(
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        vocab_size=1024,
    ),
}


@dataclass(frozen=True)
class Batch:
    """The trajectories of the timed update."""

    num_trajectories: int
    prompt_tokens: int
    response_tokens: int
    tool_tokens: int  # inside the response, loss mask 0
    max_tokens_per_micro_batch: int = 20480  # recipes/stage1_8k.yaml


BATCHES = {
    "cuda": Batch(num_trajectories=64, prompt_tokens=1024, response_tokens=7168, tool_tokens=64),
    "cpu": Batch(num_trajectories=4, prompt_tokens=32, response_tokens=224, tool_tokens=16),
}


def matrix_params(s: Shape) -> int:
    """N: the decoder layers' weight matrices (attention and MLP), all layers."""
    attn = s.hidden_size * s.head_dim * (2 * s.num_heads + 2 * s.num_kv_heads)  # q, o, k, v
    mlp = 3 * s.hidden_size * s.intermediate_size  # gate, up, down
    return s.num_layers * (attn + mlp)


def update_flops(s: Shape, b: Batch) -> int:
    """One update's model FLOPs (PaLM's count, the module docstring)."""
    seq = b.prompt_tokens + b.response_tokens
    tokens = b.num_trajectories * seq
    scored = b.num_trajectories * (b.response_tokens - b.tool_tokens)
    dense = 6 * matrix_params(s) * tokens
    head = 6 * s.vocab_size * s.hidden_size * scored
    attention = 12 * s.num_layers * s.num_heads * s.head_dim * seq * tokens
    return dense + head + attention


def samples(s: Shape, b: Batch, seed: int = 0) -> list[Any]:
    """Random token ids in the layout of an agent's trajectory; advantages +-1."""
    import random

    from rstar2cli.rl.batch import TrainSample

    rng = random.Random(seed)
    start = (b.response_tokens - b.tool_tokens) // 2  # the tool response sits mid-response
    mask = [0 if start <= j < start + b.tool_tokens else 1 for j in range(b.response_tokens)]
    return [
        TrainSample(
            prompt_ids=[rng.randrange(s.vocab_size) for _ in range(b.prompt_tokens)],
            response_ids=[rng.randrange(s.vocab_size) for _ in range(b.response_tokens)],
            loss_mask=mask,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(b.num_trajectories)
    ]


# -- in a shape's process --------------------------------------------------------------------


def write_model(s: Shape, folder: Path, device: str) -> int:
    """A random-initialised Qwen3 of shape `s` as an HF folder (bf16 on a GPU, fp32 on a CPU),
    with the tiny kit's tokenizer (the trainer reads only its padding id); its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rstar2cli import protocol as P
    from rstar2cli.data.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.convert_tokens_to_ids(P.IM_END),
    )
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):  # NOTE: initialised on the GPU: seconds, not minutes, at 4B
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    num_params = sum(p.numel() for p in model.parameters())
    del model
    return num_params


def matmul_tflops(device: str) -> float:
    """The chip's reach: a bf16 8192^3 product on a GPU (fp32 1024^3 on a CPU), the mean of ten
    after three warm-ups."""
    import torch

    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    _sync(device)
    began = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync(device)
    return 2 * n**3 * 10 / (time.perf_counter() - began) / 1e12


def _sync(device: str) -> None:
    if device == "cuda":
        sys.modules["torch"].cuda.synchronize()


def build_trainer(folder: Path, device: str, b: Batch) -> Any:
    """`PolicyTrainer` on the folder, configured as a GPU stage recipe trains (one rank)."""
    from rstar2cli.rl.train_recipe import RlTrainConfig
    from rstar2cli.rl.trainer import PolicyTrainer
    from rstar2cli.train_utils import init_distributed

    init_distributed()
    cfg = RlTrainConfig(
        lr=1.0e-6,
        warmup_steps=0,
        num_mini_batches=1,
        max_tokens_per_micro_batch=b.max_tokens_per_micro_batch,
        num_trainer_ranks=1,
        zero_stage=2,
        gradient_checkpointing=True,
        precision="bf16" if device == "cuda" else "fp32",
    )
    return PolicyTrainer(str(folder), cfg)


def timed_update(trainer: Any, batch: list[Any], device: str) -> tuple[float, Any, int]:
    """(seconds, the update's sums, micro-batches) of one update on `batch`."""
    from rstar2cli.rl.trainer import plan_update

    cfg = trainer.cfg
    plans, tokens = plan_update(
        batch,
        num_mini_batches=1,
        world=1,
        max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
        seed_key=(0,),
    )
    _sync(device)
    began = time.perf_counter()
    sums = trainer.update(plans[0], tokens)
    _sync(device)
    return time.perf_counter() - began, sums, sum(len(mini) for mini in plans[0])


def profile_update(trainer: Any, batch: list[Any], device: str, path: Path) -> None:
    """torch.profiler's table of an update on `batch`, heaviest operators first."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        timed_update(trainer, batch, device)
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    path.write_text(prof.key_averages().table(sort_by=key, row_limit=40) + "\n")


def measure(name: str, device: str, profile_path: Path | None) -> dict[str, Any]:
    """One shape's row: set-up, a warm-up update, the timed update, the matrix product."""
    import torch

    s, b = SHAPES[name], BATCHES[device]
    began = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix=f"gpu-update-{name}-"))
    try:
        num_params = write_model(s, folder, device)
        trainer = build_trainer(folder, device, b)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    batch = samples(s, b)
    timed_update(trainer, batch[: max(1, len(batch) // 8)], device)  # warm-up
    setup_s = time.perf_counter() - began
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds, sums, num_micro = timed_update(trainer, batch, device)
    loss, norms = sums.loss / max(1, sums.num_tokens), sums.grad_norms
    assert math.isfinite(loss) and all(math.isfinite(g) for g in norms if g is not None), "NaN"
    flops, reach = update_flops(s, b), matmul_tflops(device)
    rate = flops / seconds / 1e12
    rated = _rated_tflops(device)
    row: dict[str, Any] = {
        "params": num_params,
        "batch": asdict(b),
        "micro_batches": num_micro,
        "setup_s": round(setup_s, 1),
        "update_s": _sig(seconds),
        "tokens_per_s": round(b.num_trajectories * (b.prompt_tokens + b.response_tokens) / seconds),
        "model_flop": flops,
        "tflop_per_s": _sig(rate),
        "rated_tflop_per_s": rated,
        "mfu_rated": None if rated is None else _sig(rate / rated),
        "matmul_tflop_per_s": _sig(reach),
        "mfu_matmul": _sig(rate / reach),
        "loss": loss,
        "grad_norm": norms[-1],
    }
    if device == "cuda":
        row["gpu"] = torch.cuda.get_device_name(0)
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if profile_path is not None:
        profile_update(trainer, batch[: max(1, len(batch) // 4)], device, profile_path)
        row["profile"] = str(profile_path)
    return row


def _sig(x: float) -> float:
    """Four significant digits (a CPU's rates are thousandths of a TFLOP/s)."""
    return float(f"{x:.4g}")


def _rated_tflops(device: str) -> float | None:
    """The rated dense bf16 peak of an H100 or H200 SXM; None for another chip or a CPU."""
    import torch

    if device != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    sxm = "H200" in name or ("H100" in name and "PCIe" not in name)
    return RATED_BF16_TFLOPS if sxm else None


# -- the driver ------------------------------------------------------------------------------


def _append(path: Path, row: dict[str, Any]) -> None:
    line = json.dumps(row, default=str)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    print(line, flush=True)


def run_child(args: argparse.Namespace) -> int:
    """In a shape's own process: measure it and append its line (an error is a line too)."""
    row: dict[str, Any] = {"shape": args.child, "device": args.device}
    profile_path = None
    if args.profile:
        profile_path = args.out.with_name(f"{args.out.stem}.{args.child}.profile.txt")
    try:
        row |= measure(args.child, args.device, profile_path) | {"ok": True}
    except Exception as exc:
        row |= {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    _append(args.out, row)
    return 0 if row["ok"] else 1


def estimate_s(name: str, last: dict[str, Any], device: str) -> float:
    """The next shape's seconds: set-up scaled by parameters, then a warm-up (1/8) and the timed
    update at the last shape's FLOP rate (run_shapes adds a quarter for --profile)."""
    s, b = SHAPES[name], BATCHES[device]
    rate = last["model_flop"] / last["update_s"]
    params = matrix_params(s) + s.vocab_size * s.hidden_size
    scale = params / max(1, last["params"])
    return last["setup_s"] * scale + 1.125 * update_flops(s, b) / rate


def run_shapes(args: argparse.Namespace) -> int:
    """Each shape in a child process, while the next one's estimate fits the time limit."""
    began, last, failed = time.perf_counter(), None, 0
    env = dict(os.environ)
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    for name in args.shapes:
        left = args.time_limit_s - (time.perf_counter() - began)
        need = None if last is None else estimate_s(name, last, args.device)
        head = {"shape": name, "device": args.device}
        if need is not None and need * (1.25 if args.profile else 1.0) > left:
            _append(args.out, head | {"skipped": True, "estimate_s": round(need)})
            continue
        cmd = [sys.executable, "-m", "benchmarks.gpu_update", "--child", name]
        cmd += ["--device", args.device, "--out", str(args.out)] + ["--profile"] * args.profile
        try:
            subprocess.run(cmd, env=env, timeout=max(60.0, left), check=False)
        except subprocess.TimeoutExpired:
            _append(args.out, head | {"ok": False, "error": f"timed out after {left:.0f} s"})
        rows = [json.loads(ln) for ln in args.out.read_text().splitlines() if ln.strip()]
        if not rows or rows[-1].get("shape") != name or not rows[-1].get("ok"):
            failed += 1  # NOTE: a child that died without its line counts as failed too
            continue
        last = rows[-1]
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), help="one shape")
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), help="several, in order")
    parser.add_argument("--time-limit-s", type=float, default=480.0, help="for --shapes")
    parser.add_argument("--device", choices=tuple(BATCHES), default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu_update.jsonl"))
    parser.add_argument("--profile", action="store_true", help="write torch.profiler's table")
    parser.add_argument("--child", choices=tuple(SHAPES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return run_child(args)
    if (args.shape is None) == (args.shapes is None):
        parser.error("give --shape or --shapes")
    args.shapes = args.shapes or [args.shape]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    return run_shapes(args)


if __name__ == "__main__":
    sys.exit(main())
