"""Training memory per token: the old update path against the new one, measured on a CPU, and the
same accounting applied to Qwen3-14B at the paper's lengths.

Part 1 (measured). A Qwen3-architecture model built here (no download: random weights, ~52M
parameters, 32768-word vocabulary, untied output layer like Qwen3-14B) trains one RL update on
4096-token trajectories (512-token prompt, 3584-token response with a 64-token tool response in
it), one trajectory per micro-batch: old log-probs (no grad), then forward, PPO-clip loss and
backward per micro-batch, a torch AdamW step at the end; each path in its own process:
- old: the update as it was: the model's full logits, a full-vocabulary fp32 log-softmax for the
  log-probs and another for the entropy, every activation kept for backward;
- new: what the trainers run now: `rstar2cli.lm_scoring.ScoringLM` (log-probs and entropy of the
  model tokens only, in chunks, recomputed in backward) with gradient checkpointing of the
  decoder layers.
Per path, two processes, each timing or measuring one step after a warm-up step:
- memory: glibc unmaps every freed block of 64 KB or more (MALLOC_MMAP_THRESHOLD_), so RSS
  follows the live tensors: peak RSS during the step (VmHWM, reset before it), the resident state
  before it (weights, AdamW moments), bytes per trained token = (peak - state) / tokens of the
  micro-batch;
- time: glibc as is; wall seconds and CPU seconds of the step. One torch thread (`--threads`), so
  the CPU seconds are the step's compute even on a box other jobs load, where wall time swings by
  tens of percent from run to run.
Ratios: memory = old / new bytes per token (target >= 3); time = new / old CPU seconds of the
step (target <= 1.3; the wall-clock ratio is printed too).

Part 2 (computed). The per-token bytes of each path from the model's shapes (the formulas in
`activation_bytes_per_token`, plus the new path's fixed chunk spread over the micro-batch: printed
next to the measurement of part 1 as a check of the formulas), and per GPU
the ZeRO-3 state of Qwen3-14B on 32 ranks, the gathered output layer and the chunk; the table
gives the longest micro-batch (tokens, and whole 8K / 12K trajectories) that fits 80 GiB and
192 GiB, bf16.

Run (from the repository root; ~15 minutes on 2 busy cores, ~5 GB of RAM at the old path's peak):
    python -m benchmarks.train_memory --json runs/train_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """What the memory of a decoder-only Qwen3 model depends on."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    num_params: float


BENCH = Shape(  # num_params filled in when built
    vocab=32768,
    hidden=512,
    layers=6,
    heads=8,
    kv_heads=4,
    head_dim=64,
    intermediate=1536,
    num_params=0.0,
)
QWEN3_14B = Shape(
    vocab=151936,
    hidden=5120,
    layers=40,
    heads=40,
    kv_heads=8,
    head_dim=128,
    intermediate=17408,
    num_params=14.8e9,
)
PROMPT_TOKENS, SEQ_TOKENS, NUM_SEQS, TOOL_TOKENS = 512, 4096, 2, 64


# ---------------------------------------------------------------------------------------------
# Part 1: the two paths, each in its own process


def build_model(folder: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    s = BENCH
    config = Qwen3Config(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        max_position_embeddings=SEQ_TOKENS,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def trajectories() -> list[Any]:
    import random

    from rstar2cli.rl.batch import TrainSample

    rng = random.Random(0)
    out = []
    for i in range(NUM_SEQS):
        response = [rng.randrange(BENCH.vocab) for _ in range(SEQ_TOKENS - PROMPT_TOKENS)]
        mask = [0 if 1000 <= j < 1000 + TOOL_TOKENS else 1 for j in range(len(response))]
        prompt = [rng.randrange(BENCH.vocab) for _ in range(PROMPT_TOKENS)]
        out.append(TrainSample(prompt, response, mask, 1.0 if i % 2 else -1.0))
    return out


def old_score(model: Any, sample: Any) -> tuple[Any, Any, Any, Any]:
    """The update as it was: full logits, full-vocabulary log-softmax and entropy.
    Returns logprobs, entropy (no grad) or None, mask [1, T] and advantages [1]."""
    import torch

    from rstar2cli.rl.loss import token_entropy, token_logprobs

    ids = torch.tensor([sample.prompt_ids + sample.response_ids])  # [1, L]
    start = len(sample.prompt_ids) - 1
    logits = model(input_ids=ids, use_cache=False).logits[:, start:-1]  # [1, T, V]
    logprobs = token_logprobs(logits, ids[:, start + 1 :])  # [1, T]
    entropy = None
    if torch.is_grad_enabled():  # NOTE: the old trainer took the entropy metric in this pass only
        with torch.no_grad():
            entropy = token_entropy(logits.detach())  # [1, T]
    mask = torch.tensor([sample.loss_mask], dtype=torch.bool)  # [1, T]
    return logprobs, entropy, mask, torch.tensor([sample.advantage])


def new_score(model: Any, sample: Any) -> tuple[Any, Any, Any, Any]:
    """As `rstar2cli.rl.trainer.PolicyTrainer` runs it: model tokens only, chunked; the entropy
    (a metric) only in the no-grad pass. Returns logprobs, entropy or None, mask and advantages,
    all [1, N]."""
    import torch

    from rstar2cli.rl.batch import collate

    batch = collate([sample], pad_id=0)
    logprobs, entropy = model(
        input_ids=batch.input_ids,
        rows=batch.rows,
        cols=batch.cols,
        targets=batch.targets,
        attention_mask=batch.attention_mask,
        with_entropy=not torch.is_grad_enabled(),
    )  # [N], [N] or None
    mask = torch.ones_like(logprobs, dtype=torch.bool)  # [N]
    entropy = None if entropy is None else entropy[None]
    return logprobs[None], entropy, mask[None], batch.advantages[None]


def proc_status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def trim_and_reset_peak() -> int:
    """Return glibc's free heap to the kernel, then restart VmHWM from the resident size;
    that resident size in KiB."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss_kb = proc_status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # NOTE: resets VmHWM to the current RSS
    return rss_kb


def worker(path: str, mode: str, model_dir: str) -> dict[str, float]:
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from rstar2cli.lm_scoring import ScoringLM
    from rstar2cli.rl.loss import ppo_clip_loss

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lm.config.use_cache = False
    model: Any = lm
    score = old_score
    if path == "new":
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model, score = ScoringLM(lm), new_score
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0e-6)
    samples = trajectories()

    def step() -> None:
        """An RL update: old log-probs (no grad), then forward + loss + backward per
        micro-batch, one optimizer step."""
        with torch.no_grad():
            old = [score(model, sample)[:2] for sample in samples]
        for sample, (old_logprobs, old_entropy) in zip(samples, old, strict=True):
            logprobs, entropy, mask, adv = score(model, sample)
            entropy = old_entropy if entropy is None else entropy  # the new path's metric
            loss, _ = ppo_clip_loss(logprobs, old_logprobs, adv, mask, entropy=entropy)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: AdamW allocates its moments here
    gc.collect()
    if mode == "time":
        began_wall, began_cpu = time.perf_counter(), time.process_time()
        step()
        return {
            "step_s": time.perf_counter() - began_wall,
            "step_cpu_s": time.process_time() - began_cpu,
        }
    state_kb = trim_and_reset_peak()
    step()
    peak_kb = proc_status_kb("VmHWM")
    return {
        "peak_rss_mb": peak_kb / 1024,
        "state_rss_mb": state_kb / 1024,
        "bytes_per_token": (peak_kb - state_kb) * 1024 / SEQ_TOKENS,
    }


def run_path(path: str, model_dir: Path, num_threads: int) -> dict[str, float]:
    """Two processes: memory (glibc unmaps every freed block of 64 KB or more, so RSS follows the
    live tensors; the page faults that costs would distort the time) and time (glibc as is)."""
    out: dict[str, float] = {}
    for mode in ("memory", "time"):
        env = {**os.environ, "OMP_NUM_THREADS": str(num_threads)}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
        if mode == "memory":
            env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
        cmd = [sys.executable, "-m", "benchmarks.train_memory", "--worker", path, mode]
        cmd += ["--model", str(model_dir)]
        res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        out.update(json.loads(res.strip().splitlines()[-1]))
    return out


# ---------------------------------------------------------------------------------------------
# Part 2: the accounting


def layer_activation_elements(s: Shape) -> int:
    """Per token, what one decoder layer keeps for its backward pass (HF Qwen3, sdpa):
    attention: the two norm inputs/outputs, q/k/v, q/k norms and rotary outputs, the attention
    output; MLP: gate, up, act(gate), act(gate) * up; plus the two residual sums."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = 2 * s.hidden + (q + 2 * kv) + 2 * (q + kv) + (q + kv) + q + s.hidden
    mlp = 2 * s.hidden + 4 * s.intermediate + s.hidden
    return attention + mlp


def activation_bytes_per_token(s: Shape, path: str, dtype_bytes: int) -> float:
    """Bytes of training memory per token of a micro-batch, beyond the resident state.

    old: every layer's activations; full logits (model dtype), their fp32 log-softmax, and in
    backward the gradients of both. new: each layer's input (the checkpoint), one layer's
    activations and their gradients while it is recomputed, the final hidden state.
    """
    layer = layer_activation_elements(s) * dtype_bytes
    if path == "old":
        logits = s.vocab * (dtype_bytes + 4 + 4 + dtype_bytes)
        if dtype_bytes != 4:
            logits += s.vocab * 4  # the fp32 copy of the logits
        return s.layers * layer + logits
    return s.layers * s.hidden * dtype_bytes + 2 * layer + 2 * s.hidden * dtype_bytes


def fixed_bytes(s: Shape, path: str, world: int) -> float:
    """Per GPU, not per token: ZeRO-3 state (bf16 weights, fp32 gradients, fp32 master and AdamW
    moments: 18 bytes a parameter over the ranks), the gathered output layer and its gradient
    (bf16), and for the new path the fp32 chunk tensors of `rstar2cli.lm_scoring`."""
    state = s.num_params * 18 / world
    gathered = 2 * s.vocab * s.hidden * 2
    return state + gathered + (chunk_bytes(s) if path == "new" else 0)


def chunk_bytes(s: Shape) -> float:
    """The new path's output-layer chunk: logits, their exp and two gradients, fp32."""
    from rstar2cli.lm_scoring import CHUNK_TOKENS

    return 4 * CHUNK_TOKENS * s.vocab * 4


def fits_table(world: int = 32) -> list[dict[str, Any]]:
    rows = []
    for gpu_gib in (80, 192):
        usable = 0.9 * gpu_gib * GIB  # NOTE: 10% for the CUDA context, NCCL and fragmentation
        for path in ("old", "new"):
            per_token = activation_bytes_per_token(QWEN3_14B, path, dtype_bytes=2)
            max_tokens = max(0, int((usable - fixed_bytes(QWEN3_14B, path, world)) / per_token))
            rows.append(
                {
                    "gpu_gib": gpu_gib,
                    "path": path,
                    "fixed_gib": fixed_bytes(QWEN3_14B, path, world) / GIB,
                    "mb_per_token": per_token / 2**20,
                    "max_tokens_per_micro_batch": max_tokens,
                    "trajectories_8k": max_tokens // (8192 + 2048),
                    "trajectories_12k": max_tokens // (12288 + 2048),
                    "recipe_20480_fits": max_tokens >= 20480,
                }
            )
    return rows


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="Also write the results to this file.")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per path (1: steady timings on a shared box, where spinning "
        "OpenMP threads make two-thread runs slower and noisy).",
    )
    ap.add_argument("--worker", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        path, mode = args.worker
        print(json.dumps(worker(path=path, mode=mode, model_dir=args.model)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        num_params = build_model(Path(tmp))
        res: dict[str, Any] = {p: run_path(p, Path(tmp), args.threads) for p in ("old", "new")}
    shape = BENCH.__class__(**{**BENCH.__dict__, "num_params": float(num_params)})
    res["memory_ratio"] = res["old"]["bytes_per_token"] / res["new"]["bytes_per_token"]
    res["time_ratio"] = res["new"]["step_cpu_s"] / res["old"]["step_cpu_s"]
    res["time_ratio_wall"] = res["new"]["step_s"] / res["old"]["step_s"]
    for p in ("old", "new"):
        chunk = chunk_bytes(shape) / SEQ_TOKENS if p == "new" else 0.0
        res[p]["predicted_bytes_per_token"] = activation_bytes_per_token(shape, p, 4) + chunk
    res["model"] = {
        **shape.__dict__,
        "seq_tokens": SEQ_TOKENS,
        "micro_batch_tokens": SEQ_TOKENS,
        "num_threads": args.threads,
    }
    res["qwen3_14b_32_ranks"] = fits_table()
    report(res)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2) + "\n")


def report(res: dict[str, Any]) -> None:
    m = res["model"]
    print(
        f"Part 1: {m['num_params'] / 1e6:.1f}M-parameter Qwen3-architecture model, vocab "
        f"{m['vocab']}, {m['seq_tokens']}-token trajectories, one per micro-batch, fp32 on CPU, "
        f"{m['num_threads']} thread(s)"
    )
    print(
        f"{'path':<5} {'peak RSS MB':>12} {'state MB':>9} {'KB/token':>9} {'predicted':>10} "
        f"{'step s':>7} {'CPU s':>7}"
    )
    for p in ("old", "new"):
        r = res[p]
        print(
            f"{p:<5} {r['peak_rss_mb']:>12.0f} {r['state_rss_mb']:>9.0f} "
            f"{r['bytes_per_token'] / 1024:>9.1f} {r['predicted_bytes_per_token'] / 1024:>10.1f} "
            f"{r['step_s']:>7.1f} {r['step_cpu_s']:>7.1f}"
        )
    print(
        f"memory per token old/new: {res['memory_ratio']:.2f}x (target >= 3)   "
        f"step CPU time new/old: {res['time_ratio']:.2f}x (target <= 1.3; wall "
        f"{res['time_ratio_wall']:.2f}x)"
    )
    print("\nPart 2: Qwen3-14B, ZeRO-3 on 32 ranks, bf16: the longest micro-batch that fits")
    print(
        f"{'GPU':>7} {'path':<5} {'fixed GiB':>9} {'MB/token':>9} {'max tokens':>11} "
        f"{'8K traj.':>8} {'12K traj.':>9} {'20480 fits':>10}"
    )
    for r in res["qwen3_14b_32_ranks"]:
        print(
            f"{r['gpu_gib']:>4} GiB {r['path']:<5} {r['fixed_gib']:>9.1f} {r['mb_per_token']:>9.2f} "
            f"{r['max_tokens_per_micro_batch']:>11} {r['trajectories_8k']:>8} "
            f"{r['trajectories_12k']:>9} {str(r['recipe_20480_fits']):>10}"
        )


if __name__ == "__main__":
    main()
