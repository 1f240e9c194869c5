"""Group-normalised advantages for GRPO, computed over the rollouts RoC kept.

A(i) = (r_i - mean_g) / (std_g + eps), where g is the problem (group) of rollout i and the mean
and std run over the kept members of g only (after RoC down-sampling, not over the 2G drawn).
Every token of a trajectory gets that trajectory's advantage (outcome reward, no per-token credit).

Choices:
- std is the population std (divide by n, no Bessel correction): a group then has advantages of
  unit RMS, and a group of one gets 0 instead of NaN. Codebases that use the sample std differ
  by a factor sqrt(n / (n - 1)), about 1.03 at G = 16.
- NOTE zero std: when all kept rewards of a group are equal, r - mean is 0 for every member, and
  the advantage is set to exactly 0 (eps only matters for tiny non-zero spreads). Such a group
  carries no gradient; that is why equal-reward groups are dropped before rollouts are trained on.

Does not: drop groups, down-sample, or broadcast to tokens (the loss does that). Pure torch.
Tested in tests/unit/test_advantages.py.
"""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages for a flat batch of rollouts from several groups of any sizes.

    rewards: [N] float; group_ids: [N] int64 in [0, num_groups), e.g. built from group sizes with
    `torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))`. Returns [N].
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards and group_ids must be 1-D of the same shape, got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if rewards.numel() == 0:
        return rewards.clone()
    rewards = rewards.float()  # [N]
    num_groups = int(group_ids.max().item()) + 1
    counts = torch.bincount(group_ids, minlength=num_groups).to(rewards.dtype)  # [num_groups]
    sums = rewards.new_zeros(num_groups).index_add_(0, group_ids, rewards)
    means = sums / counts.clamp(min=1)  # [num_groups]
    centred = rewards - means[group_ids]  # [N]
    sq_sums = rewards.new_zeros(num_groups).index_add_(0, group_ids, centred**2)
    stds = (sq_sums / counts.clamp(min=1)).sqrt()  # [num_groups], population std
    advantages = centred / (stds[group_ids] + eps)  # [N]
    # Exactly zero for groups whose rewards are all equal, whatever float round-off the mean had.
    group_max = rewards.new_full((num_groups,), -torch.inf).scatter_reduce(
        0, group_ids, rewards, "amax"
    )
    group_min = rewards.new_full((num_groups,), torch.inf).scatter_reduce(
        0, group_ids, rewards, "amin"
    )
    flat = (group_max == group_min)[group_ids]  # [N]
    return torch.where(flat, torch.zeros_like(advantages), advantages)
