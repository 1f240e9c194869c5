"""Partial rollout in the simulator (`model.simulate`): over-provision prompts, end a step once
enough groups are done, carry the unfinished samples into the next step.

A GRPO step needs `num_prompts` whole groups. Here each step starts `over_provision` more prompt
groups than that (the carried ones count against the extra). Once `num_prompts` groups have every
sample finished it sends no more requests, waits for the requests and tool calls in flight (with
the incremental scheduler a request makes at most `step_tokens`), and carries the rest: their
contexts are prefilled again in the next step (the weights changed, so no cache survives), where
they go on under the new policy. This is what `rl-stage` does with `rollout.over_provision`
(rstar2cli/rl/partial.py); `drain=False` instead cuts the requests in flight mid-request,
keeping their tokens. A carried sample is partly one step (or more) off-policy:
`off_policy_share` is the share of the decoded tokens of a step's finished groups that an earlier
step's policy produced, and it is reported beside the step time, since a shorter step bought this
way trains on older tokens. Groups that finish fastest are the easy ones, so each step also leans
towards easier prompts than the data (not measured here).

What it does not do: the training side (which groups a trainer takes, importance weights for
the old tokens); this is a simulation for benchmarks/scheduler/bench.py part (b)
(benchmarks/scheduler/cluster.py). Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace

from benchmarks.sim.model import simulate
from benchmarks.sim.result import SimResult
from benchmarks.sim.workload import Cost, SimTraj, make_workload
from rstar2cli.scheduler.scheduler import SchedulerConfig


@dataclass
class PartialStep:
    makespan_s: float  # until `num_prompts` groups were done
    num_groups_done: int
    num_carried: int  # samples cut and carried into the next step
    off_policy_share: float  # of the decoded tokens of this step's done groups
    migration_overhead_share: float


def simulate_partial(
    *,
    num_prompts: int,
    num_samples: int,
    max_response: int,
    seed: int,
    num_steps: int,
    over_provision: float,
    config: SchedulerConfig,
    num_engines: int,
    capacity_tokens: int,
    cost: Cost,
    max_num_seqs: int = 256,
    drain: bool = True,
) -> list[PartialStep]:
    """`num_steps` steps back to back, each on fresh prompts (workload seed `seed` + step) and
    what the previous step carried. `drain` (rl-stage's way): a stopping step waits for the
    requests and tool calls in flight; False: it cuts them mid-request (`simulate`)."""
    in_flight = math.ceil(num_prompts * (1 + over_provision))
    carried: list[SimTraj] = []
    steps = []
    for step in range(num_steps):
        num_new = max(in_flight - len({t.group for t in carried}), 0)
        fresh = [
            replace(t, group=(step, t.group))
            for t in make_workload(
                num_prompts=num_new,
                num_samples=num_samples,
                max_response=max_response,
                seed=seed + step,
            )
        ]
        work = carried + fresh
        r = simulate(
            work,
            config,
            num_engines=num_engines,
            capacity_tokens=capacity_tokens,
            max_response=max_response,
            cost=cost,
            max_num_seqs=max_num_seqs,
            stop_after_groups=num_prompts,
            drain=drain,
        )
        steps.append(_step(work, r))
        carried = r.carried
    return steps


def _step(work: list[SimTraj], r: SimResult) -> PartialStep:
    """A step's numbers: the decoded tokens of its done groups, split into this step's and the
    earlier steps'. A group is done when all of its samples in `work` finished (samples that
    finished in an earlier step are not in `work`; their tokens are not counted here)."""
    left: dict[Hashable, int] = {}
    for t, done in zip(work, r.done, strict=True):
        left[t.group] = left.get(t.group, 0) + (0 if done else 1)
    old = new = 0
    for t, decoded in zip(work, r.decoded_tokens, strict=True):
        if left[t.group] == 0:
            old, new = old + t.carried_tokens, new + decoded
    return PartialStep(
        makespan_s=r.makespan_s,
        num_groups_done=r.num_groups_done,
        num_carried=len(r.carried),
        off_policy_share=old / max(old + new, 1),
        migration_overhead_share=r.migration_overhead_share,
    )
