"""One RL stage of GRPO-RoC: the step loop that ties rollout, reward, RoC and the trainer together.

Each step (rStar2-Agent, arXiv 2508.20722, section 3):
  draw prompts (seeded per-epoch order; the data cursor is step x prompts) -> rollout n = 2G per
  prompt with the KV-aware scheduler and the tool -> tool-health gate -> grade (binary reward) ->
  leave out failures that are not the model's (engine_error, sandbox_error: selection.py) ->
  drop equal-reward groups -> RoC down-sampling to G -> group advantages -> old log-probs and the
  PPO-clip update on the trainer ranks -> push the new weights to every engine (a broadcast from
  trainer rank 0 to the engines' workers, or the disk path: rstar2cli/rl/sync.py).
Then, when due: held-out accuracy, one metrics row, a checkpoint (model, optimizer, LR schedule,
RNG, data cursor, step) and the plots. Rerunning on the same OUT resumes from the newest
checkpoint: the engines get the checkpoint's weights before the first rollout, and every random
choice (prompt order, sampling seeds, RoC draws, mini-batch split) is a function of (seed, step),
so on CPU a resumed run repeats an uninterrupted one.

Partial rollout (`rollout.over_provision` > 0, rstar2cli/rl/partial.py): a step stops once
`num_prompts_per_step` prompt instances are whole and carries the rest into the next; the carry
is checkpointed with the step, so a resumed run goes on with it (where a step stops depends on
timing, so such a run is not repeated exactly on resume).

With Ray (`--ray-address`, or several trainer ranks) the run first checks that every node can read
the model and write OUT, and reserves GPUs for engines and ranks (stage_setup.py, which also
starts the ranks, the engines and the weight-sync group); OUT/placement.json records where each
engine and rank landed. What each step rolls out, and how, is stage_rollout.py's.

What it does not do: parse options or recipes (rstar2cli.commands.rl_stage), check inputs or read
the problems and tokenizer (rstar2cli.preflight, which builds `StageInputs`), algorithms (the
cores in roc.py / advantages.py / loss.py, and what a step trains on: selection.py), DeepSpeed
details (trainer.py), outputs (stage_report.py).
Tested in tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2cli.cluster.placement import absolute_path
from rstar2cli.errors import EngineDead, UserError
from rstar2cli.records import GradedRecord
from rstar2cli.rl.batch import TrainSample
from rstar2cli.rl.correction import METRIC_KEYS as CORRECTION_METRICS
from rstar2cli.rl.partial import CARRY_FILE, Carry
from rstar2cli.rl.selection import rollout_metrics, select, update_metrics
from rstar2cli.rl.stage_recipe import RlRecipe
from rstar2cli.rl.stage_rollout import StageRollouts
from rstar2cli.rl.stage_setup import engine_devices, place, start_sync, start_trainers
from rstar2cli.rl.trainer import UpdateSums
from rstar2cli.rollout.jobs import Interrupted, StopSignals

if TYPE_CHECKING:
    from rstar2cli.rl.workers import Trainers


@dataclass
class StageOptions:
    out: Path
    ray_address: str | None = None
    init_checkpoint: Path | None = (
        None  # a previous stage's checkpoints/ to take weights (+ optimizer) from
    )
    reset_optimizer: bool = False
    live: bool = True


class StageRun:
    """State of one `rl-stage` run; `run()` drives it inside one event loop."""

    def __init__(
        self,
        recipe: RlRecipe,
        opts: StageOptions,
        problems: list[dict[str, Any]],
        eval_problems: list[dict[str, Any]],
        tokenizer: Any,
    ):
        self.recipe, self.opts = recipe, opts
        self.tokenizer = tokenizer
        # NOTE: absolute, as Ray actors on other nodes read the model and write checkpoints
        opts.out = Path(opts.out).resolve()
        if opts.init_checkpoint is not None:
            opts.init_checkpoint = Path(opts.init_checkpoint).resolve()
        self.model = absolute_path(recipe.model)
        self.ckpt_dir = opts.out / "checkpoints"
        self.trainers: Trainers  # set by _start_trainers
        self.sync: Any = None
        # engines on the trainer's GPUs (asked for, or one GPU for both: _start_engines)
        self.colocated = recipe.rollout.colocate
        # the engines (set once they start) and the policy version each model turn records
        self.rollouts = StageRollouts(
            recipe=recipe, problems=problems, eval_problems=eval_problems, tokenizer=tokenizer
        )
        self.saved_step = 0  # the newest checkpoint's step: where a rerun resumes
        self.stop = StopSignals()
        self.carry = Carry()  # partial rollout: what the last step carried into the next

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> Path:
        from rstar2cli.agent.tools import make_tool_runner
        from rstar2cli.reward.grader import Grader
        from rstar2cli.rollout.driver import rollout_session

        self.stop.arm()  # Ctrl-C / SIGTERM: stop between awaits; a rerun resumes
        r = self.recipe
        placement = self._place() if self.uses_ray else None
        start, push_first = self._start_trainers(placement)
        self.saved_step = self.rollouts.policy_version = start
        if start:
            self._resume(start)
        try:
            async with rollout_session(
                lambda: self._start_engines(placement),
                make_tool_runner(
                    r.sandbox.urls,
                    timeout_s=r.rollout.tool_timeout_s,
                    num_workers=r.sandbox.num_local_workers,
                    token_file=r.sandbox.token_file,
                ),
            ) as (self.rollouts.engines, tools):
                self.sync = await start_sync(
                    self.trainers,
                    self.rollouts.engines,
                    colocated=self.colocated,
                    out=self.opts.out,
                )
                if push_first:
                    await self._push_weights()
                with (
                    Grader(
                        r.reward.num_workers,
                        r.reward.timeout_s,
                        strict=r.reward.strict,
                        zero_truncated=r.reward.zero_truncated,
                    ) as grader,
                    self._reporter(start) as rep,
                ):
                    if start == 0 and r.eval.every_steps > 0:
                        rep.step(
                            {
                                "step": 0,
                                "eval_accuracy": await self._evaluate(0, tools, grader, rep),
                            }
                        )
                    for step in range(start, r.train.num_steps):
                        await self._step(step, tools, grader, rep)
            self._plot()
            final = self.opts.out / "final"
            self.trainers.save_hf(final)
            return final
        finally:
            self.trainers.close()
            if placement is not None:
                placement.release()

    def _resume(self, start: int) -> None:
        """Say where the run resumes; partial rollout takes back what that step carried."""
        r = self.recipe
        print(f"rl-stage: resuming from step {start} (checkpoint in {self.ckpt_dir})")
        carry_file = self.ckpt_dir / f"step{start}" / CARRY_FILE
        if self.partial:
            self.carry = Carry.load(
                carry_file, self.tokenizer, self.rollouts.agent_config(0, r.rollout.temperature)
            )
        elif carry_file.is_file():
            print(
                f"rl-stage: rollout.over_provision is 0: the samples step {start} carried "
                f"({carry_file}) are dropped; the data goes on from step {start} x "
                "num_prompts_per_step"
            )

    @property
    def partial(self) -> bool:
        return self.recipe.rollout.over_provision > 0

    @property
    def uses_ray(self) -> bool:
        return self.opts.ray_address is not None or self.recipe.train.num_trainer_ranks > 1

    # -- set-up (stage_setup.py) ------------------------------------------------------------

    def _place(self) -> Any:
        readable = [self.model] + [str(p) for p in (self.opts.init_checkpoint,) if p is not None]
        return place(
            self.recipe, ray_address=self.opts.ray_address, readable=readable, out=self.opts.out
        )

    def _start_trainers(self, placement: Any) -> tuple[int, bool]:
        """Build the ranks and load state; returns (first step, weights differ from recipe.model)."""
        self.trainers, start, push_first = start_trainers(
            self.recipe,
            model=self.model,
            ray_address=self.opts.ray_address,
            placement=placement,
            ckpt_dir=self.ckpt_dir,
            init_checkpoint=self.opts.init_checkpoint,
            reset_optimizer=self.opts.reset_optimizer,
        )
        return start, push_first

    def _start_engines(self, placement: Any) -> list[Any]:
        from rstar2cli.engines.build import make_engines

        r = self.recipe
        devices, shared = engine_devices(
            r, model=self.model, trainers=self.trainers, placement=placement
        )
        if shared:
            self.colocated = True
        return make_engines(
            self.model,
            r.rollout.num_engines,
            kind=r.rollout.engine,
            ray_address=(self.opts.ray_address or "local") if self.uses_ray else None,
            kv_cache_tokens=r.rollout.kv_cache_tokens,
            max_model_len=r.rollout.max_prompt_tokens + r.rollout.max_response_tokens,
            seed=r.train.seed,
            tensor_parallel_size=r.rollout.tensor_parallel_size,
            gpu_memory_fraction=r.rollout.gpu_memory_fraction,
            devices=devices,
            colocated=self.colocated,
            placement=placement,
            dtype=r.rollout.dtype,
            speculative=r.rollout.speculative,
        )

    def _reporter(self, start: int) -> Any:
        from rstar2cli.rl.stage_report import StageReporter

        return StageReporter(
            out=self.opts.out,
            log_cfg=self.recipe.log,
            start_step=start,
            num_steps=self.recipe.train.num_steps,
            run_name=self.opts.out.name,
            recipe_dump=self.recipe.model_dump(mode="json"),
            live=self.opts.live,
        )

    # -- one step -----------------------------------------------------------------------------

    async def _step(self, step: int, tools: Any, grader: Any, rep: Any) -> None:
        r = self.recipe
        began = time.perf_counter()
        partial_row: dict[str, Any] = {}
        if self.partial:
            records, grade_s, stats, partial_row, self.carry = await self.rollouts.partial_rollout(
                step, carry=self.carry, tools=tools, grader=grader, on_tick=rep.rollout_tick
            )
        else:
            records, grade_s, stats = await self.rollouts.step_rollout(
                step, tools=tools, grader=grader, on_tick=rep.rollout_tick
            )
        rollout_s = time.perf_counter() - began - grade_s
        self._health_gate(records)
        rep.phase("update")
        t0 = time.perf_counter()
        sel = select(records, r, step)
        row: dict[str, Any] = {
            "step": step + 1,
            **rollout_metrics(records, sel),
            "stale_token_share": 0.0,  # without partial rollout every token is the step's own
            **dict.fromkeys(CORRECTION_METRICS),  # None unless the step trains
            **partial_row,
        }
        if stats.drafts[0]:  # speculative decoding drafted in this step's rollout
            row.update(draft_tokens=stats.drafts[0], draft_acceptance=stats.draft_acceptance)
        trained, update_s, sync_s = await self._train(sel.samples, step, rep, t0)
        row.update(trained)
        if r.eval.every_steps > 0 and (
            (step + 1) % r.eval.every_steps == 0 or step + 1 == r.train.num_steps
        ):
            row["eval_accuracy"] = await self._evaluate(step + 1, tools, grader, rep)
        row.update(
            time_rollout_s=rollout_s,
            time_grade_s=grade_s,
            time_update_s=update_s,
            time_sync_s=sync_s,
            time_step_s=time.perf_counter() - began,
        )
        rep.step(row)
        if (step + 1) % r.checkpoint.every_steps == 0 or step + 1 == r.train.num_steps:
            self._checkpoint(step + 1)

    async def _train(
        self, samples: list[TrainSample], step: int, rep: Any, t0: float
    ) -> tuple[dict[str, Any], float, float]:
        """Update on the step's samples, then push the new weights to the engines: the update's
        and the sync's metrics, and the seconds each took since `t0` (none kept: nothing, 0.0)."""
        if not samples:
            return {}, 0.0, 0.0
        await self.sync.before_update()
        row = update_metrics(self._update(samples, step))
        update_s = time.perf_counter() - t0
        rep.phase("sync")
        t0 = time.perf_counter()
        row.update(await self._push_weights())
        self.rollouts.policy_version = step + 1
        sync_s = time.perf_counter() - t0
        return row, update_s, sync_s

    def _health_gate(self, records: list[GradedRecord]) -> None:
        from rstar2cli.rl.health import check_tool_health

        num_failed = sum(1 for rec in records if rec["finish_reason"] == "engine_error")
        if num_failed > len(records) // 2:
            names = ", ".join(e.name for e in self.rollouts.engines)
            raise UserError(
                f"engine health: {num_failed}/{len(records)} rollouts ended in engine_error on "
                f"{names}; see the engine log above (the step was not trained on)"
            )

        statuses = [c["status"] for rec in records for c in rec["tool_calls"]]
        health = check_tool_health(statuses, self.recipe.sandbox.max_sandbox_error_share)
        if not health.ok:
            raise UserError(health.message(self.recipe.sandbox.urls))

    def _update(self, samples: list[TrainSample], step: int) -> list[UpdateSums]:
        from rstar2cli.rl.trainer import plan_update

        t = self.recipe.train
        plan, tokens = plan_update(
            samples,
            num_mini_batches=t.num_mini_batches,
            world=self.trainers.world,
            max_tokens_per_micro_batch=t.max_tokens_per_micro_batch,
            seed_key=(t.seed, step, 2),
            share_prompt_rows=t.share_prompt_rows,
        )
        return self.trainers.update(plan, tokens)

    async def _push_weights(self) -> dict[str, Any]:
        return await self.sync.push()

    async def _evaluate(self, step: int, tools: Any, grader: Any, rep: Any) -> float:
        rep.phase("eval")
        return await self.rollouts.evaluate(step, tools, grader)

    def _checkpoint(self, step: int) -> None:
        from rstar2cli.train_utils import prune_checkpoints, rng_state

        r = self.recipe
        client = {
            "step": step,
            "data_cursor": step * r.rollout.num_prompts_per_step,
            "rng": rng_state(),
        }
        if self.partial:  # written first: a checkpoint that `latest` names never lacks it
            client["data_cursor"] = self.carry.cursor
            self.carry.save(self.ckpt_dir / f"step{step}" / CARRY_FILE)
        self.trainers.save_checkpoint(self.ckpt_dir, step, client)
        self.saved_step = step
        prune_checkpoints(self.ckpt_dir, r.checkpoint.keep_last)
        self._plot()

    def _plot(self) -> None:
        from rstar2cli.fileio import read_jsonl_if_exists
        from rstar2cli.rl.stage_report import plot_metrics

        if self.recipe.log.plots:
            rows = read_jsonl_if_exists(self.opts.out / "metrics.jsonl")
            plot_metrics(rows, self.opts.out / "curves.png", f"rl-stage {self.opts.out.name}")


@dataclass
class StageInputs:
    """What the pre-flight read (`rstar2cli.preflight.prepare_rl_stage`): the tokenizer and the
    problems (prompts that fit)."""

    tokenizer: Any
    problems: list[dict[str, Any]]
    eval_problems: list[dict[str, Any]]
    num_long: int


def run_stage(recipe: RlRecipe, opts: StageOptions, inputs: StageInputs) -> Path:
    """Train (or resume) one stage into opts.out from `preflight.prepare_rl_stage`'s inputs;
    returns the final HF folder."""
    max_prompt = recipe.rollout.max_prompt_tokens
    if inputs.num_long:
        print(f"rl-stage: skipped {inputs.num_long} problems with prompts over {max_prompt} tokens")
    run = StageRun(
        recipe=recipe,
        opts=opts,
        problems=inputs.problems,
        eval_problems=inputs.eval_problems,
        tokenizer=inputs.tokenizer,
    )
    try:
        return asyncio.run(run.run())
    except BaseException as exc:
        resume = f"rerun the same command to resume from step {run.saved_step}"
        if run.stop.stopped(exc):
            raise Interrupted(f"rl-stage interrupted; {resume}") from None
        if isinstance(exc, EngineDead):  # the step it was rolling out is not trained on
            raise EngineDead(f"{exc}; {resume}") from None
        raise
    finally:
        run.stop.disarm()
