"""An RL stage's rollouts: a step's prompts (whole, or partial rollout's carry plus fresh ones),
the held-out pass, each rolled out on the stage's engines and graded.

Every trajectory's sampling seed is a function of (seed, step), and records come back in item
order whatever order they finished in, so on CPU a resumed run repeats an uninterrupted one.
Partial rollout (rstar2cli/rl/partial.py) instead stops once enough prompt instances are whole,
and returns what it carries into the next step.

What it does not do: start engines or the sandbox (rstar2cli.rl.stage and rollout.driver's
`rollout_session`), check tool health, select or train (rstar2cli.rl.stage, selection.py).
Tested in tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rstar2cli.records import GradedRecord
from rstar2cli.rl.partial import Carry
from rstar2cli.rl.stage_recipe import RlRecipe
from rstar2cli.rollout.jobs import scheduler_config, seed_base


@dataclass
class StageRollouts:
    """What a stage rolls out on: its problems, tokenizer and engines, and the policy version
    each model turn records."""

    recipe: RlRecipe
    problems: list[dict[str, Any]]
    eval_problems: list[dict[str, Any]]
    tokenizer: Any
    engines: list[Any] = field(default_factory=list)
    # updates the engines' weights have had (a resumed run: its checkpoint's step); each
    # model turn records it (rl/correction.py's stale tokens are the ones made before it)
    policy_version: int = 0

    def agent_config(self, seed_base: int, temperature: float) -> Any:
        from rstar2cli.agent.loop import AgentConfig

        r = self.recipe.rollout
        return AgentConfig(
            max_turns=r.max_turns,
            max_response_tokens=r.max_response_tokens,
            temperature=temperature,
            top_p=r.top_p,
            seed=seed_base,
            template=self.recipe.data.template,
            max_tool_output_chars=r.max_tool_output_chars,
            tool_timeout_s=r.tool_timeout_s,
            policy_version=self.policy_version,
        )

    async def step_rollout(
        self, step: int, tools: Any, grader: Any, on_tick: Any
    ) -> tuple[list[GradedRecord], float, Any]:
        """Step `step`'s prompts (the seeded per-epoch order, `num_prompts_per_step` of them),
        each rolled out `num_samples_per_prompt` times: as `rollout`."""
        from rstar2cli.train_utils import batch_indices

        r = self.recipe
        idx = batch_indices(step, len(self.problems), r.rollout.num_prompts_per_step, r.train.seed)
        return await self.rollout(
            problems=[self.problems[i] for i in idx],
            num_samples=r.rollout.num_samples_per_prompt,
            seed=seed_base(r.train.seed, step),
            temperature=r.rollout.temperature,
            tools=tools,
            grader=grader,
            on_tick=on_tick,
        )

    async def evaluate(self, step: int, tools: Any, grader: Any) -> float:
        """Held-out accuracy: one sample per eval problem at the eval temperature."""
        r = self.recipe
        records, _, _ = await self.rollout(
            problems=self.eval_problems,
            num_samples=1,
            seed=seed_base(r.train.seed, step, eval_pass=True),
            temperature=r.eval.temperature,
            tools=tools,
            grader=grader,
        )
        return sum(rec["reward"] for rec in records) / max(len(records), 1)

    async def rollout(
        self,
        problems: list[dict[str, Any]],
        num_samples: int,
        seed: int,
        temperature: float,
        tools: Any,
        grader: Any,
        on_tick: Any = None,
    ) -> tuple[list[GradedRecord], float, Any]:
        """The rollout job on the stage's engines: graded records in item order (reproducible
        whatever order they finished in), the seconds spent grading, and the driver's
        `RolloutStats`."""
        from rstar2cli.rollout.jobs import in_item_order, make_items

        items = make_items(problems, num_samples)
        rows, grade_s, stats = await self.roll_items(
            items=items,
            seed=seed,
            temperature=temperature,
            tools=tools,
            grader=grader,
            on_tick=on_tick,
        )
        return in_item_order(rows, items), grade_s, stats

    async def roll_items(
        self,
        items: list[dict[str, Any]],
        seed: int,
        temperature: float,
        tools: Any,
        grader: Any,
        on_tick: Any = None,
        **partial: Any,
    ) -> tuple[list[GradedRecord], float, Any]:
        """`items` rolled out and graded: (rows in finish order, grading seconds, the driver's
        `RolloutStats`). `partial`: `rollout_and_grade`'s on_record, carried and stop_when."""
        from rstar2cli.rollout.jobs import GradedSink, rollout_and_grade

        sink = GradedSink(grader, flush_every=None)
        stats = await rollout_and_grade(
            engines=self.engines,
            items=items,
            tokenizer=self.tokenizer,
            agent_config=self.agent_config(seed, temperature),
            sched_config=self._sched_config(),
            tools=tools,
            sink=sink,
            on_tick=on_tick,
            **partial,
        )
        return sink.rows, sink.grade_s, stats

    def _sched_config(self) -> Any:
        r = self.recipe.rollout
        return scheduler_config(r, step_tokens=r.step_tokens)

    async def partial_rollout(
        self, step: int, carry: Carry, tools: Any, grader: Any, on_tick: Any
    ) -> tuple[list[GradedRecord], float, Any, dict[str, Any], Carry]:
        """A partial-rollout step (rstar2cli/rl/partial.py): the carried trajectories and fresh
        prompts rolled out until enough prompt instances are whole. Returns the whole instances'
        graded records, the seconds spent grading, the driver's stats and the step's partial
        metrics, and what this step carries into the next (`carry`: what the last one carried)."""
        from rstar2cli.rl.partial import (
            StepInstances,
            end_step,
            fresh_items,
            num_fresh,
            stale_token_share,
        )
        from rstar2cli.train_utils import stream_indices

        r = self.recipe.rollout
        count = num_fresh(r.num_prompts_per_step, r.over_provision, carry)
        idx = stream_indices(carry.cursor, count, len(self.problems), self.recipe.train.seed)
        items = fresh_items([self.problems[i] for i in idx], r.num_samples_per_prompt, step)
        instances = StepInstances(carry, r.num_samples_per_prompt, r.num_prompts_per_step)
        rows, grade_s, stats = await self.roll_items(
            items=items,
            seed=seed_base(self.recipe.train.seed, step),
            temperature=r.temperature,
            tools=tools,
            grader=grader,
            on_tick=on_tick,
            on_record=instances.on_record,
            carried=carry.trajectories,
            stop_when=instances.enough,
        )
        whole, carried = end_step(
            carry=carry,
            num_fresh=count,
            rows=rows,
            instances=instances,
            unfinished=stats.unfinished,
        )
        return (
            whole,
            grade_s,
            stats,
            {
                "num_fresh_prompts": count,
                "num_carried": len(carried.trajectories),
                "stale_token_share": stale_token_share(whole),
            },
            carried,
        )
