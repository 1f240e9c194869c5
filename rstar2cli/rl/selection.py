"""What one RL step trains on, and the numbers it reports: pure functions of the graded rollouts.

`select`: group by problem, leave out the trajectories whose failure is not the model's, drop
equal-reward groups, RoC down-sampling to G, group advantages (rStar2-Agent, arXiv 2508.20722,
section 3); every random draw is a function of (seed, step).

Failures that are not the model's (`infra_failure`): a trajectory that ended in `engine_error`,
or made a tool call answered `sandbox_error` (the daemon unreachable, its HTTP 5xx, no answer in
the client's time, a job process that died: sandboxd.client turns each into that status after
its retries). Graded as they stand, they would get reward 0 and a negative advantage for what
the infrastructure did. They leave their group, which is trained on the rest, or dropped when
fewer than `MIN_GROUP_LEFT` remain; every metrics row counts them. The model's own tool errors
(its code raised, ran out of time or memory inside the job, a call that did not parse) stay, and
count in RoC's p_err against it, as the paper says.
`rollout_metrics` and `update_metrics`: a step's row of metrics.jsonl from the rollouts and from
the trainer ranks' sums.

What it does not do: rollouts, training or I/O (rstar2cli.rl.stage drives those).
Tested in tests/unit/test_rl_batching.py and through tests/integration/test_rl_stage.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar2cli.records import GradedRecord
from rstar2cli.rl.batch import TrainSample
from rstar2cli.rl.health import SANDBOX_ERROR
from rstar2cli.rl.roc import (
    RolloutSummary,
    drop_equal_reward_groups,
    format_penalty,
    roc_downsample,
    tool_error_share,
)
from rstar2cli.rl.stage_recipe import RlRecipe
from rstar2cli.rl.trainer import UpdateSums

# NOTE: fewest trajectories a group keeps after its infrastructure failures leave it: an
# advantage compares a trajectory with the rest of its group, and one alone has nothing to meet
MIN_GROUP_LEFT = 2


@dataclass
class Selection:
    """What one step trains on, and the counts the metrics report."""

    samples: list[TrainSample] = field(default_factory=list)
    kept_summaries: list[RolloutSummary] = field(default_factory=list)
    num_groups: int = 0
    num_dropped_groups: int = 0  # all rewards equal
    num_groups_too_few_left: int = 0  # under MIN_GROUP_LEFT once infrastructure failures left
    num_engine_error_rollouts: int = 0  # left out: ended in engine_error
    num_sandbox_error_rollouts: int = 0  # left out: a tool call answered sandbox_error


def infra_failure(record: GradedRecord) -> str | None:
    """Why the trajectory failed for a reason that is not the model's ("engine_error" or
    "sandbox_error"), or None."""
    if record["finish_reason"] == "engine_error":
        return "engine_error"
    if any(call["status"] == SANDBOX_ERROR for call in record.get("tool_calls", [])):
        return SANDBOX_ERROR
    return None


def _leave_out_infra(groups: list[list[GradedRecord]], out: Selection) -> list[list[GradedRecord]]:
    """Each group without its infrastructure failures (counted in `out`); groups left with
    fewer than MIN_GROUP_LEFT trajectories are dropped (counted too)."""
    kept = []
    for g in groups:
        reasons = [infra_failure(r) for r in g]
        out.num_engine_error_rollouts += reasons.count("engine_error")
        out.num_sandbox_error_rollouts += reasons.count(SANDBOX_ERROR)
        left = [r for r, why in zip(g, reasons, strict=True) if why is None]
        if len(left) >= MIN_GROUP_LEFT:
            kept.append(left)
        else:
            out.num_groups_too_few_left += 1
    return kept


def select(records: list[GradedRecord], recipe: RlRecipe, step: int) -> Selection:
    """Group by problem (by prompt instance under partial rollout), drop equal-reward groups, RoC
    to G, advantages. Pure given (seed, step)."""
    import numpy as np
    import torch

    from rstar2cli.rl.advantages import group_advantages

    groups: dict[str, list[GradedRecord]] = {}
    for r in records:  # partial rollout names each prompt instance ("group")
        groups.setdefault(str(r.get("group", r["id"])), []).append(r)
    out = Selection(num_groups=len(groups))
    group_list = _leave_out_infra(list(groups.values()), out)
    keep: Sequence[int] = range(len(group_list))
    if recipe.roc.drop_equal_groups:
        keep = drop_equal_reward_groups([[r["reward"] for r in g] for g in group_list])
    rng = np.random.default_rng([recipe.train.seed, step, 1])
    out.num_dropped_groups = len(group_list) - len(keep)
    chosen, group_ids = [], []
    for gid, g in enumerate(group_list[i] for i in keep):
        summaries = [RolloutSummary.from_record(r) for r in g]
        idx = list(range(len(g)))
        if recipe.roc.enabled:
            c = recipe.roc
            idx = roc_downsample(
                group=summaries,
                group_size=c.group_size,
                mode=c.mode,
                min_positive=c.min_positive,
                min_negative=c.min_negative,
                rng=rng,
            )
        for i in idx:
            chosen.append(g[i])
            group_ids.append(gid)
            out.kept_summaries.append(summaries[i])
    if not chosen:
        return out
    rewards = torch.tensor([float(r["reward"]) for r in chosen])  # [N]
    adv = group_advantages(rewards, torch.tensor(group_ids, dtype=torch.long))  # [N]
    out.samples = [
        TrainSample(
            r["prompt_ids"],
            r["response_ids"],
            r["loss_mask"],
            float(a),
            rollout_logprobs=r.get("rollout_logprobs"),
            num_stale_tokens=int(r.get("stale_tokens", 0)),
        )
        for r, a in zip(chosen, adv.tolist(), strict=False)
    ]
    return out


def rollout_metrics(records: list[GradedRecord], sel: Selection) -> dict[str, Any]:
    """Per-step numbers from the graded rollouts (all 2G) and what RoC kept."""
    summaries = [RolloutSummary.from_record(r) for r in records]
    by_problem: dict[str, float] = {}
    for r in records:
        by_problem[str(r["id"])] = max(by_problem.get(str(r["id"]), 0.0), float(r["reward"]))
    correct = [r for r in records if r["reward"] > 0]
    n = max(len(records), 1)
    return {
        "reward": sum(r["reward"] for r in records) / n,
        "pass_rate": sum(by_problem.values()) / max(len(by_problem), 1),
        "tool_error_share_correct": tool_error_share(summaries, positive_only=True),
        "tool_error_share_all": tool_error_share(summaries, positive_only=False),
        "tool_error_share_correct_kept": tool_error_share(sel.kept_summaries, positive_only=True),
        "format_penalty": sum(format_penalty(s.num_answer_tags, s.num_turns) for s in summaries)
        / n,
        "response_tokens": sum(len(r["response_ids"]) for r in records) / n,
        "response_tokens_correct": (
            sum(len(r["response_ids"]) for r in correct) / len(correct) if correct else None
        ),
        "tool_calls_per_rollout": sum(len(r["tool_calls"]) for r in records) / n,
        "num_rollouts": len(records),
        "num_groups": sel.num_groups,
        "num_dropped_groups": sel.num_dropped_groups,
        "num_groups_too_few_left": sel.num_groups_too_few_left,
        "num_engine_error_rollouts": sel.num_engine_error_rollouts,
        "num_sandbox_error_rollouts": sel.num_sandbox_error_rollouts,
        "num_kept": len(sel.samples),
        "num_kept_positive": sum(1 for s in sel.kept_summaries if s.is_positive),
        "finish_reasons": dict(Counter(r["finish_reason"] for r in records)),
    }


def update_metrics(sums: list[UpdateSums]) -> dict[str, Any]:
    """Token-weighted means over ranks of the trainer's sums, and the correction's metrics
    (rstar2cli/rl/correction.py) over all ranks' tokens."""
    from rstar2cli.rl.correction import CorrectionSums

    tokens = sum(s.num_tokens for s in sums)
    if tokens == 0:
        return {"num_train_tokens": 0}
    correction = CorrectionSums()
    for s in sums:
        correction.add(s.correction)
    norms = [g for s in sums[:1] for g in s.grad_norms]
    low, high = sum(s.clip_low for s in sums) / tokens, sum(s.clip_high for s in sums) / tokens
    return {
        "num_train_tokens": tokens,
        "loss": sum(s.loss for s in sums) / tokens,
        "clip_frac": low + high,
        "clip_frac_low": low,
        "clip_frac_high": high,
        "approx_kl": sum(s.approx_kl for s in sums) / tokens,
        "kl_ref": sum(s.kl_ref for s in sums) / tokens,  # 0 without a KL term (train.kl_coef)
        "entropy": sum(s.entropy for s in sums) / tokens,
        "grad_norm": norms[-1] if norms else None,
        "lr": sums[0].lr,
        "trainer_peak_mem_gib": max(s.peak_mem_gib for s in sums),
        **correction.metrics(),
    }
