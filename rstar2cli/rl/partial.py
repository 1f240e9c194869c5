"""Partial rollout for `rl-stage` (`rollout.over_provision`): a step stops waiting for its longest
trajectories and carries them into the next step.

A GRPO step needs `num_prompts_per_step` whole groups (every sample of a prompt finished). With
over-provision f, each step has ceil(P x (1 + f)) prompt instances in flight: the ones carried in,
topped up with fresh prompts from the data stream. The rollout stops once P instances are whole
(their samples may have finished in earlier steps), waits for the requests and tool calls in
flight (`driver.run_rollout`'s `stop_when`), and the step trains on every whole instance: P, or a
few more that finished while those returned. The rest go on in the next step from where they
stand, under the new weights: their earlier tokens came from an older policy, so a step's
`stale_token_share` (tokens made in earlier steps / all response tokens it trains on) is reported
beside the step time it buys. Fast groups finish first, so a step also leans towards easier
prompts than the data. The PPO ratio's old log-probs are recomputed by the trainer before the
update, as for every sample; the correction (rstar2cli/rl/correction.py) then weighs each stale
token by pi_old / mu, mu the older policy's probability the engine recorded when it sampled it
(token TIS, truncated at `correction.token_is_cap`, on by default), or drops stale tokens from
the loss (`correction.mask_stale`); with the correction off they are not importance-weighted.
benchmarks/sim/partial_rollout.py measures what it buys in simulation.

A carried instance is its finished samples' graded rows plus its unfinished trajectories
(`Trajectory.state`). `Carry` holds them and the fresh-prompt cursor; rl-stage writes it next to
each checkpoint (`carried.json` in its step folder, before the checkpoint itself, so a checkpoint
never lacks it), and a resumed run goes on with exactly what the checkpointed step carried.

What it does not do: the rollout (the driver), grading or training (rstar2cli.rl.stage).
Tested in tests/unit/test_partial_rollout.py and tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2cli.records import GradedRecord, TrajectoryRecord

CARRY_FILE = "carried.json"


@dataclass
class Carry:
    """What one step hands the next: the fresh-prompt cursor and the unwhole instances."""

    cursor: int = 0  # fresh prompts drawn so far: positions in the per-epoch permutation stream
    rows: list[GradedRecord] = field(default_factory=list)  # their finished samples, graded
    trajectories: list[Any] = field(default_factory=list)  # their unfinished ones (Trajectory)

    @property
    def num_instances(self) -> int:
        return len({r["group"] for r in self.rows} | {t.item["group"] for t in self.trajectories})

    def save(self, path: Path) -> None:
        from rstar2cli.fileio import write_json_atomic

        data = {
            "cursor": self.cursor,
            "rows": self.rows,
            "trajectories": [t.state() for t in self.trajectories],
        }
        write_json_atomic(path, data, indent=None)  # one line: token ids are most of it

    @classmethod
    def load(cls, path: Path, tokenizer: Any, agent_config: Any) -> Carry:
        import json

        from rstar2cli.agent.loop import Trajectory
        from rstar2cli.errors import UserError

        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(
                f"{path} is missing: this checkpoint was saved without partial rollout "
                "(rollout.over_provision), or the file was removed; resume with the recipe it "
                "was saved with"
            ) from None
        trajs = [Trajectory.from_state(s, tokenizer, agent_config) for s in data["trajectories"]]
        return cls(int(data["cursor"]), list(data["rows"]), trajs)


class StepInstances:
    """One step's prompt instances: counts finished samples per instance (`on_record`) and says
    when enough are whole (`enough`)."""

    def __init__(self, carry: Carry, num_samples: int, num_prompts: int) -> None:
        self.num_samples, self.num_prompts = num_samples, num_prompts
        self.finished: Counter[str] = Counter(str(r["group"]) for r in carry.rows)
        self.num_whole = sum(1 for n in self.finished.values() if n >= num_samples)

    def on_record(self, record: TrajectoryRecord) -> None:
        group = str(record["group"])
        self.finished[group] += 1
        if self.finished[group] == self.num_samples:
            self.num_whole += 1

    def enough(self) -> bool:
        return self.num_whole >= self.num_prompts

    def is_whole(self, group: str) -> bool:
        return self.finished[group] >= self.num_samples


def num_fresh(num_prompts: int, over_provision: float, carry: Carry) -> int:
    """Fresh prompts a step draws: the instances in flight, less the ones carried in."""
    return max(math.ceil(num_prompts * (1 + over_provision)) - carry.num_instances, 0)


def fresh_items(
    problems: list[dict[str, Any]], num_samples: int, step: int
) -> list[dict[str, Any]]:
    """Rollout items for a step's fresh prompts: each prompt instance named `group` ("step.i"),
    unique across steps, since a prompt may come round again while an earlier instance of it is
    still carried."""
    from rstar2cli.rollout.jobs import make_items

    items = make_items(problems, num_samples)
    for i, item in enumerate(items):  # num_samples items per problem, in problem order
        item["group"] = f"{step}.{i // num_samples}"
    return items


def end_step(
    carry: Carry,
    num_fresh: int,
    rows: list[GradedRecord],
    instances: StepInstances,
    unfinished: list[Any],
) -> tuple[list[GradedRecord], Carry]:
    """After a step's rollout (`rows`: its finished records, graded; `unfinished`: the driver's
    cut trajectories): (the rows of every whole instance, in instance then sample order, what
    the step trains on; the `Carry` for the next step, its rows' tokens and its trajectories'
    tokens so far stale)."""
    rows = carry.rows + rows
    whole = sorted((r for r in rows if instances.is_whole(str(r["group"]))), key=_instance_order)
    # a finished sample of an instance not yet whole waits for the next step: all its tokens
    # are then an older policy's, like a cut trajectory's tokens so far
    rest = [_all_stale(r) for r in rows if not instances.is_whole(str(r["group"]))]
    cut = sorted(unfinished, key=lambda t: _instance_order(t.item))
    for traj in cut:
        traj.stale_tokens = len(traj.layout.response_ids)
    return whole, Carry(carry.cursor + num_fresh, rest, cut)


def _all_stale(row: GradedRecord) -> GradedRecord:
    row = row.copy()
    row["stale_tokens"] = len(row["response_ids"])
    return row


def _instance_order(row: Mapping[str, Any]) -> tuple[int, int, int]:
    """Where a record or an item stands: (step, instance index, sample)."""
    step, index = str(row["group"]).split(".")
    return int(step), int(index), int(row["sample"])


def stale_token_share(rows: list[GradedRecord]) -> float:
    """Response tokens made in earlier steps, as a share of all response tokens in `rows`."""
    total = sum(len(r["response_ids"]) for r in rows)
    return sum(int(r.get("stale_tokens", 0)) for r in rows) / total if total else 0.0
