"""The RL update on a CPU: the update as it was against the update as it is, on the same step.

One RL step's kept trajectories, as the pretrained quickstart makes them (recipes/pretrained/rl.yaml):
8 prompts x 4 kept samples (G = 4), each prompt the paper's system prompt with its tool block and
an arith question, each response a cold-start transcript of that question (a tool call, the real
tool output masked, an answer; some first make a failing call, some answer without the tool). One
`PolicyTrainer` (DeepSpeed ZeRO-0, fp32, one rank, gloo) on the model given runs the update:
- before: what rl-stage ran until now: a no-grad pass for the old log-probs of every micro-batch,
  then the training pass, one row per sample;
- after: what it runs now: no old pass for the first mini-batch (its training forward is pi_old:
  rstar2cli/rl/trainer.py) and shared-prompt rows (`train.share_prompt_rows`:
  rstar2cli/rl/shared_prompt.py), the same gradients.
Each is timed `--repeats` times, alternating, after one warm-up update each, with `--threads`
torch threads; the table shows the lowest CPU seconds and wall seconds of an update, trained
(model) tokens per second and the ratios. CPU seconds are the work done, steady on a box other
jobs load, where wall time is not.

Measured on 2 cores with 2 threads (`--threads 2 --repeats 2`, lowest of each): before 128.4 s
wall / 236.3 CPU s, after 44.3 s / 86.7 s for 2,936 trained tokens: 2.90x wall, 2.73x CPU.

`--bypass` times instead the same update in 2 mini-batches, pi_old recomputed by the trainer for
the second (what rl-stage runs) against the engine's log-probs as pi_old (correction.bypass):
78.2 s wall / 154.2 CPU s vs 68.6 s / 134.7 s, 1.14x (same settings; with one mini-batch there is
no pass for bypass to skip).

Run (from the repository root, after `make smollm2`; ~12 minutes on 2 cores):
    python -m benchmarks.rl_update_speed --model models/smollm2-135m-instruct --json runs/upd.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import time
from pathlib import Path
from typing import Any

NUM_PROMPTS, NUM_KEPT = 8, 4


def step_samples(tokenizer: Any, seed: int = 0) -> list[Any]:
    """NUM_PROMPTS x NUM_KEPT trajectories: prompt ids, response ids, loss mask, an advantage."""
    from rstar2cli.data.synthetic import make_synthetic
    from rstar2cli.rl.batch import TrainSample
    from rstar2cli.sft.data import render_chat, tokenize_segments
    from rstar2cli.sft.synthetic_transcripts import make_transcripts

    rows, _ = make_synthetic("arith", 100, seed=seed)
    rng = random.Random(seed)
    samples = []
    for row in rows[:NUM_PROMPTS]:
        for k in range(NUM_KEPT):
            chat = make_transcripts(
                [row], error_fraction=0.2, seed=seed * 100 + k, direct_fraction=0.3
            )[0]
            segments = render_chat(chat)  # type: ignore[arg-type]
            prompt, _ = tokenize_segments(segments[:1], tokenizer)
            response, mask = tokenize_segments(segments[1:], tokenizer)
            samples.append(TrainSample(prompt, response, mask, rng.choice([1.0, -1.0])))
    return samples


def timed_update(
    trainer: Any,
    samples: list[Any],
    *,
    share: bool,
    old_pass: bool,
    mini_batches: int = 1,
    bypass: bool = False,
) -> dict[str, float]:
    """One update; `old_pass` adds the no-grad pass over every micro-batch that the update ran
    before (its result is what the first mini-batch's training forward now gives). With
    `mini_batches` > 1 the update itself runs that pass for the later mini-batches unless
    `bypass` (the engine's log-probs are pi_old: correction.bypass)."""
    from rstar2cli.rl.train_recipe import CorrectionConfig
    from rstar2cli.rl.trainer import plan_update

    cfg = trainer.cfg
    cfg.share_prompt_rows = share
    trainer.correction = CorrectionConfig(token_is_cap=None, bypass=bypass)
    plans, tokens = plan_update(
        samples,
        num_mini_batches=mini_batches,
        world=1,
        max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
        seed_key=(0,),
        share_prompt_rows=share,
    )
    cpu0, wall0 = time.process_time(), time.perf_counter()
    trainer.engine.eval()
    if old_pass:
        trainer._no_grad_logprobs(trainer.engine, plans[0], entropy=True)
    trainer.engine.train()
    sums = trainer.update(plans[0], tokens)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "tokens": sums.num_tokens,
        "grad_norm": sums.grad_norms[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--bypass",
        action="store_true",
        help="instead: 2 mini-batches, pi_old recomputed by the trainer vs the engine's (bypass)",
    )
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    torch.set_num_threads(args.threads)
    from rstar2cli.rl.train_recipe import RlTrainConfig
    from rstar2cli.rl.trainer import PolicyTrainer
    from rstar2cli.train_utils import init_distributed

    init_distributed()
    cfg = RlTrainConfig(
        lr=1.0e-6, zero_stage=0, gradient_checkpointing=False, max_tokens_per_micro_batch=8192
    )
    trainer = PolicyTrainer(str(args.model), cfg)
    samples = step_samples(trainer.tokenizer)
    num_prompt = sum(len(s.prompt_ids) for s in samples) / len(samples)
    num_resp = sum(len(s.response_ids) for s in samples) / len(samples)
    print(
        f"{len(samples)} trajectories: prompt {num_prompt:.0f} tokens, response {num_resp:.0f} "
        f"tokens, {sum(s.num_model_tokens for s in samples)} model tokens; {args.threads} thread(s)"
    )
    paths: dict[str, dict[str, Any]] = {
        "before": dict(share=False, old_pass=True),
        "after": dict(share=True, old_pass=False),
    }
    if args.bypass:
        paths = {
            "recompute": dict(share=True, old_pass=False, mini_batches=2),
            "bypass": dict(share=True, old_pass=False, mini_batches=2, bypass=True),
        }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    for how in paths.values():
        timed_update(trainer, samples, **how)  # warm-up
    for _ in range(args.repeats):
        for name, how in paths.items():
            runs[name].append(timed_update(trainer, samples, **how))
            print(f"  {name}: {runs[name][-1]}")
    best = {name: min(r, key=lambda x: x["cpu_s"]) for name, r in runs.items()}
    report = _report(best, baseline=list(paths)[0], ours=list(paths)[1])
    report["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def _report(best: dict[str, dict[str, float]], *, baseline: str, ours: str) -> dict[str, Any]:
    print(f"\n{'update':>8} {'CPU s':>8} {'wall s':>8} {'trained tok/s (CPU)':>20}")
    out: dict[str, Any] = {}
    for name, r in best.items():
        rate = r["tokens"] / r["cpu_s"]
        out[name] = {**r, "trained_tokens_per_cpu_s": rate}
        print(f"{name:>8} {r['cpu_s']:8.1f} {r['wall_s']:8.1f} {rate:20.1f}")
    speedup = best[baseline]["cpu_s"] / best[ours]["cpu_s"]
    wall = best[baseline]["wall_s"] / best[ours]["wall_s"]
    out["speedup_cpu"], out["speedup_wall"] = speedup, wall
    print(f"\ntrained tokens per CPU second: {speedup:.2f}x (wall clock: {wall:.2f}x)")
    return out


if __name__ == "__main__":
    main()
