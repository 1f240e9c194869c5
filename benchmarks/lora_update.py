"""The RL update with LoRA against whole weights on one fixed step: compute, trainer state, peak.

benchmarks/lora_vs_full.py runs whole RL stages, so each arm trains on its own rollouts. This one
holds the batch fixed: one step's kept trajectories (benchmarks/rl_update_speed.py's
`step_samples`: 8 prompts x 4 samples of cold-start transcripts), trained by one `PolicyTrainer`
(DeepSpeed ZeRO-0, fp32, one rank, gloo) per arm:
- whole: every weight trains (the recipe as it is);
- lora16, lora64 (`--ranks`): `train.lora` on at that rank, alpha 2 x rank.
Each arm runs in its own process, so its peak resident size is its own. An arm makes one warm-up
update and `--repeats` timed ones; the table keeps the lowest CPU seconds (the work done, steady
when other jobs load the box) and its wall seconds. Per arm it also reports:
- trainer state: the bytes of every parameter, a gradient for each trainable one, and the
  optimizer's state tensors, counted on the real tensors after the updates;
- saved: the activations autograd keeps for the backward pass, at their most in one micro-batch
  (storages counted once, weights not counted), from saved-tensor hooks;
- loaded: the process's resident size once the trainer is built;
- peak: its peak resident size in one more update (the hooked one) after glibc is told to map
  every buffer of 64 KiB or more on its own, and to return the free heap it kept. Resident size
  then leaves out freed heap: peak minus loaded is the update's activations and passing buffers,
  and whatever else the process holds (smaller allocations, the math libraries' own buffers).
- glibc peak: the peak over the warm-up and timed updates with glibc's defaults (the resident size
  a user sees). glibc keeps freed heap memory and raises its mapping threshold as large buffers
  are freed, so this peak also counts memory no tensor holds, more or less by allocation order.
The timed updates run with glibc's defaults; "mapped CPU s" is the hooked update's CPU time, what
mapping every large buffer afresh costs against the "CPU s" column.
Under glibc a LoRA arm's heap still holds memory no tensor holds after the threshold is set; with
jemalloc preloaded (LD_PRELOAD, MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0) both peaks are the
state plus the activations.
`--micro-batch-tokens` and `--gradient-checkpointing` set what bounds the activations. With
activations bounded, the trainer state is the larger share, and that is where LoRA saves.

Run (from the repository root, after `make smollm2`; about 11 minutes on 2 idle cores):
    python -m benchmarks.lora_update --model models/smollm2-135m-instruct \
        --json runs/lora_update.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lora_vs_full import ratio
from benchmarks.rl_update_speed import step_samples
from benchmarks.train_memory import proc_status_kb, trim_and_reset_peak

GIB = 2**30


def trainer_state_gib(engine: Any) -> dict[str, float]:
    """Bytes of the parameters, of a gradient per trainable parameter, and of the optimizer's
    state tensors (DeepSpeed's wrapper, if any, holds the torch optimizer as `.optimizer`)."""
    import torch

    params = list(engine.module.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    opt = engine.optimizer
    opt = getattr(opt, "optimizer", opt)
    state = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    )
    return {
        "weights_gib": weights / GIB,
        "grads_gib": grads / GIB,
        "optimizer_gib": state / GIB,
        "state_gib": (weights + grads + state) / GIB,
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


def _map_large_buffers() -> None:
    """From here on, glibc maps each buffer of 64 KiB or more on its own and unmaps it when freed;
    the free heap it kept goes back to the kernel, and the peak resident size starts again."""
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD; fixed, it stops rising
    trim_and_reset_peak()


def hooked_update(trainer: Any, samples: list[Any]) -> tuple[float, float]:
    """One more update with saved-tensor hooks: the most GiB autograd held for the backward pass of
    one micro-batch (storages count once; parameters, frozen weights an op saves, do not) and the
    update's CPU seconds (the hooks run once per saved tensor, a few thousand Python calls)."""
    import torch

    from benchmarks.rl_update_speed import timed_update

    weights = {p.untyped_storage().data_ptr() for p in trainer.engine.module.parameters()}
    live: dict[int, int] = {}
    most = [0]

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            live[storage.data_ptr()] = storage.nbytes()
        return t

    backward = trainer.engine.backward

    def backward_then_reset(*a: Any, **kw: Any) -> Any:  # one micro-batch's graph ends here
        most[0] = max(most[0], sum(live.values()))
        live.clear()
        return backward(*a, **kw)

    trainer.engine.backward = backward_then_reset
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run = timed_update(trainer, samples, share=True, old_pass=False)
    finally:
        del trainer.engine.backward  # the instance attribute: the method shows again
    return most[0] / GIB, run["cpu_s"]


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    """One arm in this process: build, warm up, time `repeats` updates, measure."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    torch.set_num_threads(args.threads)
    from benchmarks.rl_update_speed import timed_update
    from rstar2cli.lora import LoraConfig
    from rstar2cli.rl.train_recipe import RlTrainConfig
    from rstar2cli.rl.trainer import PolicyTrainer
    from rstar2cli.train_utils import init_distributed, peak_memory_gib

    init_distributed()
    lora = LoraConfig()
    if args.arm_rank:
        lora = LoraConfig(enabled=True, rank=args.arm_rank, alpha=2 * args.arm_rank)
    cfg = RlTrainConfig(
        lr=1.0e-6,
        zero_stage=0,
        gradient_checkpointing=args.gradient_checkpointing,
        max_tokens_per_micro_batch=args.micro_batch_tokens,
        lora=lora,
    )
    trainer = PolicyTrainer(str(args.model), cfg)
    loaded = proc_status_kb("VmRSS") * 1024 / GIB
    samples = step_samples(trainer.tokenizer)
    timed_update(trainer, samples, share=True, old_pass=False)  # warm-up
    runs = [timed_update(trainer, samples, share=True, old_pass=False) for _ in range(args.repeats)]
    best = min(runs, key=lambda r: r["cpu_s"])
    glibc_peak = peak_memory_gib(trainer.engine.device)
    _map_large_buffers()
    saved, mapped_cpu_s = hooked_update(trainer, samples)
    return {
        **best,
        "tokens_per_cpu_s": best["tokens"] / best["cpu_s"],
        **trainer_state_gib(trainer.engine),
        "saved_gib": saved,
        "loaded_gib": loaded,
        "peak_gib": proc_status_kb("VmHWM") * 1024 / GIB,  # since _map_large_buffers
        "glibc_peak_gib": glibc_peak,
        "mapped_cpu_s": mapped_cpu_s,
    }


def print_table(arms: dict[str, dict[str, Any]]) -> None:
    whole = arms["whole"]
    print(
        f"\n{'arm':8s}{'trainable':>12s}{'CPU s':>8s}{'tok/CPU s':>11s}{'x':>7s}"
        f"{'state GiB':>11s}{'x':>7s}{'saved':>7s}{'loaded':>8s}{'peak GiB':>10s}{'x':>7s}"
        f"{'glibc peak':>12s}{'mapped CPU s':>14s}"
    )
    for name, r in arms.items():
        print(
            f"{name:8s}{r['trainable']:12,d}{r['cpu_s']:8.1f}{r['tokens_per_cpu_s']:11.1f}"
            f"{ratio(r['tokens_per_cpu_s'], whole['tokens_per_cpu_s']):>7s}"
            f"{r['state_gib']:11.2f}{ratio(r['state_gib'], whole['state_gib']):>7s}"
            f"{r['saved_gib']:7.2f}{r['loaded_gib']:8.2f}{r['peak_gib']:10.2f}"
            f"{ratio(r['peak_gib'], whole['peak_gib']):>7s}{r['glibc_peak_gib']:12.2f}"
            f"{r['mapped_cpu_s']:14.1f}"
        )


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64], help="LoRA arms' ranks")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--arm-rank", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    if args.arm_rank is not None:  # one arm, in its own process: print its numbers as JSON
        print("ARM " + json.dumps(run_arm(args)), flush=True)
        return
    shared = ["--model", str(args.model), "--threads", str(args.threads)]
    shared += ["--repeats", str(args.repeats), "--micro-batch-tokens", str(args.micro_batch_tokens)]
    if args.gradient_checkpointing:
        shared.append("--gradient-checkpointing")
    arms: dict[str, dict[str, Any]] = {}
    for name, rank in [("whole", 0), *((f"lora{r}", r) for r in args.ranks)]:
        began = time.perf_counter()
        cmd = [sys.executable, "-m", "benchmarks.lora_update", *shared, "--arm-rank", str(rank)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        arms[name] = json.loads(next(x for x in out.splitlines() if x.startswith("ARM "))[4:])
        print(f"  {name}: {arms[name]} ({time.perf_counter() - began:.0f} s)", flush=True)
    print_table(arms)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        summary = {"args": {k: str(v) for k, v in vars(args).items()}, "arms": arms}
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
