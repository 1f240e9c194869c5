"""TRL's GRPOTrainer on the run rl-stage made: the peer side of benchmarks/peer_trl.py.

Reads rl-stage's resolved recipe (OUT/recipe.yaml), takes the same problems in the same per-step
order (`rstar2cli.preflight.prepare_rl_stage`, `train_utils.batch_indices`), and trains the same
model with GRPOTrainer (arguments: settings.grpo_args; protocol, tool and reward: trl_agent.py).
Writes OUT/steps.jsonl (one row per optimizer step: wall seconds, generation seconds, response
tokens with tool output, model tokens, reward, tool calls) and OUT/final (the model with the
checkpoint's own tokenizer files, for `rstar2 eval`).

Generation: transformers' continuous batching (settings.grpo_args; benchmarks/peer_trl.py's
docstring says why not vLLM or plain `generate()`).
Run by benchmarks/peer_trl.py as `python -m benchmarks.peer.trl_side --recipe R --out DIR`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.peer.settings import grpo_args
from benchmarks.peer.trl_agent import (
    RESPONSE_TEMPLATE,
    chat_template,
    make_reward,
    make_tool,
    prompt_messages,
)


def step_rows(recipe: Any) -> list[dict[str, Any]]:
    """The prompts rl-stage draws, step after step, as TRL dataset rows (prompt, answer)."""
    from rstar2cli.preflight import prepare_rl_stage
    from rstar2cli.train_utils import batch_indices

    problems = prepare_rl_stage(recipe).problems
    rows = []
    for step in range(recipe.train.num_steps):
        idx = batch_indices(
            step=step,
            num_examples=len(problems),
            batch_size=recipe.rollout.num_prompts_per_step,
            seed=recipe.train.seed,
        )
        rows += [
            {
                "prompt": prompt_messages(problems[i]["question"], recipe.data.template),
                "answer": str(problems[i]["answer"]),
            }
            for i in idx
        ]
    return rows


class Meter:
    """Per optimizer step: wall seconds, generation seconds, completion token counts, logs."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.generate_s: list[float] = []
        self.response_tokens: list[int] = []
        self.logs: list[dict[str, Any]] = []

    def rows(self, num_rollouts: int) -> list[dict[str, Any]]:
        out = []
        for k in range(len(self.marks) - 1):
            log = self.logs[k] if k < len(self.logs) else {}
            out.append(
                {
                    "step": k + 1,
                    "time_step_s": self.marks[k + 1] - self.marks[k],
                    "time_generate_s": self.generate_s[k] if k < len(self.generate_s) else None,
                    "response_tokens": self.response_tokens[k],
                    "model_tokens": float(log.get("completions/mean_length", 0.0)) * num_rollouts,
                    "num_rollouts": num_rollouts,
                    "reward": log.get("reward"),
                    "tool_calls_per_rollout": log.get("tools/call_frequency"),
                    "tool_failure_share": log.get("tools/failure_frequency"),
                }
            )
        return out


def build_trainer(recipe: Any, out: Path, meter: Meter, sandbox: Any, grader: Any) -> Any:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            meter.marks.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            meter.marks.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                meter.logs.append(dict(logs))

    tokenizer = AutoTokenizer.from_pretrained(recipe.model)
    tokenizer.chat_template = chat_template(recipe.data.template)
    tokenizer.response_template = RESPONSE_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(recipe.model, dtype=torch.float32)
    r = recipe.rollout
    tool = make_tool(run=sandbox.run, timeout_s=r.tool_timeout_s, max_chars=r.max_tool_output_chars)
    reward = make_reward(
        grader=grader,
        eos_token_id=tokenizer.eos_token_id,
        on_batch=lambda ids: meter.response_tokens.append(sum(len(x) for x in ids)),
    )
    config = GRPOConfig(**grpo_args(recipe, str(out / "trainer")))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[cast(Any, reward)],
        args=config,
        train_dataset=Dataset.from_list(step_rows(recipe)),
        processing_class=tokenizer,
        tools=[tool],
        callbacks=[Clock()],
    )
    generate = trainer._generate  # trl 1.16: one call per generation batch, tool loop included

    def timed_generate(prompts: Any) -> Any:
        began = time.perf_counter()
        result = generate(prompts)
        meter.generate_s.append(time.perf_counter() - began)
        return result

    trainer._generate = timed_generate  # type: ignore[method-assign]
    return trainer


def run(recipe_path: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    from rstar2cli.recipe import load_recipe
    from rstar2cli.reward.grader import Grader
    from rstar2cli.rl.stage_recipe import RlRecipe
    from sandboxd.pool import LocalSandbox

    recipe = load_recipe(recipe_path, RlRecipe)
    out.mkdir(parents=True, exist_ok=True)
    meter = Meter()
    sandbox = LocalSandbox(
        num_workers=recipe.sandbox.num_local_workers, timeout_s=recipe.rollout.tool_timeout_s
    )
    rw = recipe.reward
    with Grader(
        num_workers=rw.num_workers,
        timeout_s=rw.timeout_s,
        strict=rw.strict,
        zero_truncated=rw.zero_truncated,
    ) as grader:
        trainer = build_trainer(recipe, out=out, meter=meter, sandbox=sandbox, grader=grader)
        trainer.train()
        asyncio.run_coroutine_threadsafe(sandbox.close(), trainer.async_loop).result()
    num_rollouts = recipe.rollout.num_prompts_per_step * recipe.rollout.num_samples_per_prompt
    with (out / "steps.jsonl").open("w", encoding="utf-8") as f:
        for row in meter.rows(num_rollouts):
            f.write(json.dumps(row) + "\n")
    final = out / "final"
    trainer.model.save_pretrained(final)
    AutoTokenizer.from_pretrained(recipe.model).save_pretrained(final)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", type=Path, required=True, help="rl-stage's OUT/recipe.yaml")
    ap.add_argument("--out", type=Path, required=True, help="run folder")
    args = ap.parse_args()
    run(args.recipe, args.out)


if __name__ == "__main__":
    main()
