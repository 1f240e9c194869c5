"""One RL stage of GRPO-RoC: the step loop that ties rollout, reward, RoC and the trainer together.

Each step (rStar2-Agent, arXiv 2508.20722, section 3):
  draw prompts (seeded per-epoch order; the data cursor is step x prompts) -> rollout n = 2G per
  prompt with the KV-aware scheduler and the tool -> tool-health gate -> grade (binary reward) ->
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
the model and write OUT, and reserves GPUs for engines and ranks (rstar2cli/cluster/placement.py;
one-line errors); OUT/placement.json records where each engine and rank landed.

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
from rstar2cli.rl.trainer import UpdateSums
from rstar2cli.rollout.jobs import Interrupted, StopSignals, scheduler_config, seed_base

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
        self.problems, self.eval_problems, self.tokenizer = problems, eval_problems, tokenizer
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
        self.engines: list[Any] = []
        self.saved_step = 0  # the newest checkpoint's step: where a rerun resumes
        self.stop = StopSignals()
        self.carry = Carry()  # partial rollout: what the last step carried into the next
        # updates the engines' weights have had (a resumed run: its checkpoint's step); each
        # model turn records it (rl/correction.py's stale tokens are the ones made before it)
        self.policy_version = 0

    # -- set-up ---------------------------------------------------------------------------

    def _agent_config(self, seed_base: int, temperature: float) -> Any:
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

    def _start_trainers(self, placement: Any) -> tuple[int, bool]:
        """Build the ranks and load state; returns (first step, weights differ from recipe.model)."""
        from rstar2cli.rl.workers import make_trainers
        from rstar2cli.train_utils import set_rng_state

        r = self.recipe
        options = None
        if placement is not None:
            options = [placement.options(bundle) for bundle in placement.plan.trainers]
        self.trainers = make_trainers(
            self.model,
            r.train,
            self.opts.ray_address,
            actor_options=options,
            correction=r.correction,
        )
        client = self.trainers.load_checkpoint(self.ckpt_dir)
        if client is not None:
            set_rng_state(client["rng"])
            return int(client["step"]), True
        if self.opts.init_checkpoint is not None:
            self.trainers.load_checkpoint(
                self.opts.init_checkpoint,
                module_only=self.opts.reset_optimizer,
                with_scheduler=False,
            )
            return 0, True
        return 0, False

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> Path:
        from rstar2cli.agent.loop import make_tool_runner
        from rstar2cli.reward.grader import Grader
        from rstar2cli.rollout.driver import rollout_session

        self.stop.arm()  # Ctrl-C / SIGTERM: stop between awaits; a rerun resumes
        r = self.recipe
        placement = self._place() if self.uses_ray else None
        start, push_first = self._start_trainers(placement)
        self.saved_step = self.policy_version = start
        if start:
            print(f"rl-stage: resuming from step {start} (checkpoint in {self.ckpt_dir})")
            carry_file = self.ckpt_dir / f"step{start}" / CARRY_FILE
            if self.partial:
                self.carry = Carry.load(
                    carry_file, self.tokenizer, self._agent_config(0, r.rollout.temperature)
                )
            elif carry_file.is_file():
                print(
                    f"rl-stage: rollout.over_provision is 0: the samples step {start} carried "
                    f"({carry_file}) are dropped; the data goes on from step {start} x "
                    "num_prompts_per_step"
                )
        try:
            async with rollout_session(
                lambda: self._start_engines(placement),
                make_tool_runner(
                    r.sandbox.urls,
                    timeout_s=r.rollout.tool_timeout_s,
                    num_workers=r.sandbox.num_local_workers,
                    token_file=r.sandbox.token_file,
                ),
            ) as (self.engines, tools):
                await self._start_sync()
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

    @property
    def partial(self) -> bool:
        return self.recipe.rollout.over_provision > 0

    @property
    def uses_ray(self) -> bool:
        return self.opts.ray_address is not None or self.recipe.train.num_trainer_ranks > 1

    def _place(self) -> Any:
        """Join Ray, check that every node sees the paths, reserve the GPUs (one-line errors)."""
        from rstar2cli.cluster.placement import (
            RayPlacement,
            check_paths_on_nodes,
            has_cluster_gpus,
            plan_bundles,
        )
        from rstar2cli.rl.workers import init_ray

        r = self.recipe
        init_ray(self.opts.ray_address, r.rollout.num_engines + r.train.num_trainer_ranks)
        readable = [self.model] + [str(p) for p in (self.opts.init_checkpoint,) if p is not None]
        check_paths_on_nodes(readable, writable=[str(self.opts.out)])
        plan = plan_bundles(
            r.rollout.num_engines,
            r.rollout.tensor_parallel_size,
            r.train.num_trainer_ranks,
            has_cluster_gpus(),
            colocate=r.rollout.colocate,
        )
        return RayPlacement.reserve(plan)

    def _start_engines(self, placement: Any) -> list[Any]:
        from rstar2cli.cluster.placement import colocated_devices, engines_beside_trainer
        from rstar2cli.engines.build import make_engines

        r = self.recipe
        if placement is not None and placement.plan.colocated:
            gpu_ids = [p["gpu_ids"] for p in self.trainers.placements()]
            placement.engine_devices = colocated_devices(placement.plan, gpu_ids)
        devices = None
        if placement is None:
            import torch

            devices, shared = engines_beside_trainer(torch.cuda.device_count(), r.rollout.colocate)
            if shared:
                self._check_shared_gpu()
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
            speculative=r.rollout.speculative,
        )

    def _check_shared_gpu(self) -> None:
        """In-process engines on the trainer's GPU: the trainer's resident state plus the
        engines' shares must fit it (gpu_fit.check_shared_gpu), else one line before any start."""
        import torch

        from rstar2cli.cluster import gpu_fit
        from rstar2cli.cluster.placement import gpu_memory_fraction

        r = self.recipe
        per_engine = [(0,)] * r.rollout.num_engines
        share = gpu_memory_fraction(per_engine, True, r.rollout.gpu_memory_fraction)
        numel = gpu_fit.model_numel(self.model)
        gpu_fit.check_shared_gpu(
            trainer_bytes=gpu_fit.trainer_resident_bytes(numel, r.train.zero_stage, world=1),
            memory_fraction=share * r.rollout.num_engines,
            device_bytes=torch.cuda.get_device_properties(0).total_memory,
        )

    async def _start_sync(self) -> None:
        """The broadcast group (or the disk fallback), and where everything landed (placement.json)."""
        from rstar2cli.fileio import write_json_atomic
        from rstar2cli.rl.sync import WeightSync

        self.sync = WeightSync(self.trainers, self.engines, colocated=self.colocated)
        await self.sync.setup()
        broadcast = {e.name for e in self.sync.broadcast_engines}
        write_json_atomic(
            self.opts.out / "placement.json",
            {
                "engines": [
                    {"name": e.name, "weight_sync": "broadcast" if e.name in broadcast else "disk"}
                    | getattr(e, "placement", {})
                    for e in self.engines
                ],
                "trainer_ranks": self.trainers.placements(),
            },
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

    async def _step(self, step: int, tools: Any, grader: Any, rep: Any) -> None:
        from rstar2cli.train_utils import batch_indices

        r = self.recipe
        began = time.perf_counter()
        partial_row: dict[str, Any] = {}
        if self.partial:
            records, grade_s, stats, partial_row = await self._partial_rollout(
                step, tools, grader, rep.rollout_tick
            )
        else:
            idx = batch_indices(
                step, len(self.problems), r.rollout.num_prompts_per_step, r.train.seed
            )
            records, grade_s, stats = await self._rollout(
                problems=[self.problems[i] for i in idx],
                num_samples=r.rollout.num_samples_per_prompt,
                seed=seed_base(r.train.seed, step),
                temperature=r.rollout.temperature,
                tools=tools,
                grader=grader,
                on_tick=rep.rollout_tick,
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
        if sel.samples:
            await self.sync.before_update()
            row.update(update_metrics(self._update(sel.samples, step)))
            update_s = time.perf_counter() - t0
            rep.phase("sync")
            t0 = time.perf_counter()
            row.update(await self._push_weights())
            self.policy_version = step + 1
            sync_s = time.perf_counter() - t0
        else:
            update_s = sync_s = 0.0
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

    def _health_gate(self, records: list[GradedRecord]) -> None:
        from rstar2cli.rl.health import check_tool_health

        num_failed = sum(1 for rec in records if rec["finish_reason"] == "engine_error")
        if num_failed > len(records) // 2:
            names = ", ".join(e.name for e in self.engines)
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
        r = self.recipe
        records, _, _ = await self._rollout(
            problems=self.eval_problems,
            num_samples=1,
            seed=seed_base(r.train.seed, step, eval_pass=True),
            temperature=r.eval.temperature,
            tools=tools,
            grader=grader,
        )
        return sum(rec["reward"] for rec in records) / max(len(records), 1)

    async def _rollout(
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
        rows, grade_s, stats = await self._roll_items(
            items=items,
            seed=seed,
            temperature=temperature,
            tools=tools,
            grader=grader,
            on_tick=on_tick,
        )
        return in_item_order(rows, items), grade_s, stats

    async def _roll_items(
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
            agent_config=self._agent_config(seed, temperature),
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

    async def _partial_rollout(
        self, step: int, tools: Any, grader: Any, on_tick: Any
    ) -> tuple[list[GradedRecord], float, Any, dict[str, Any]]:
        """A partial-rollout step (rstar2cli/rl/partial.py): the carried trajectories and fresh
        prompts rolled out until enough prompt instances are whole. Returns the whole instances'
        graded records, the seconds spent grading, the driver's stats and the step's partial
        metrics; `self.carry` becomes what this step carries."""
        from rstar2cli.rl.partial import (
            StepInstances,
            end_step,
            fresh_items,
            num_fresh,
            stale_token_share,
        )
        from rstar2cli.train_utils import stream_indices

        r, carry = self.recipe.rollout, self.carry
        count = num_fresh(r.num_prompts_per_step, r.over_provision, carry)
        idx = stream_indices(carry.cursor, count, len(self.problems), self.recipe.train.seed)
        items = fresh_items([self.problems[i] for i in idx], r.num_samples_per_prompt, step)
        instances = StepInstances(carry, r.num_samples_per_prompt, r.num_prompts_per_step)
        rows, grade_s, stats = await self._roll_items(
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
        whole, self.carry = end_step(
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
                "num_carried": len(self.carry.trajectories),
                "stale_token_share": stale_token_share(whole),
            },
        )

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
