"""Group-normalised advantages over the kept rollouts."""

from __future__ import annotations

import math

import pytest
import torch

from rstar2cli.rl.advantages import group_advantages


def test_one_balanced_group():
    # [1, 0, 0, 1]: mean 0.5, population std 0.5 -> (r - 0.5) / 0.5 = [1, -1, -1, 1]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(rewards, torch.zeros(4, dtype=torch.long))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)


def test_groups_of_different_sizes_are_normalised_separately():
    # group 0 = [1, 0, 0]: mean 1/3, var (4/9 + 1/9 + 1/9) / 3 = 2/9, std sqrt(2)/3
    #   -> (2/3) / (sqrt(2)/3) = sqrt(2), (-1/3) / (sqrt(2)/3) = -1/sqrt(2)
    # group 1 = [1, 1, 1]: all equal -> 0
    # group 2 = [0]: a single rollout -> 0
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    group_ids = torch.tensor([0, 1, 0, 1, 0, 1, 2])
    adv = group_advantages(rewards, group_ids)
    s2 = math.sqrt(2.0)
    expected = torch.tensor([s2, 0.0, -1 / s2, 0.0, -1 / s2, 0.0, 0.0])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_zero_std_group_is_exactly_zero_even_with_round_off():
    # 0.1 three times: the float mean is not exactly 0.1, the advantage must still be 0, not NaN.
    adv = group_advantages(torch.tensor([0.1, 0.1, 0.1]), torch.zeros(3, dtype=torch.long))
    assert torch.equal(adv, torch.zeros(3))


def test_advantages_sum_to_zero_per_group():
    # [1, 0, 1, 1]: mean 0.75, std sqrt(3)/4 -> [1/sqrt(3), -sqrt(3), 1/sqrt(3), 1/sqrt(3)]
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long))
    r3 = math.sqrt(3.0)
    assert torch.allclose(adv, torch.tensor([1 / r3, -r3, 1 / r3, 1 / r3]), atol=1e-5)
    assert abs(float(adv.sum())) < 1e-5


def test_empty_and_bad_shapes():
    empty = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)
    with pytest.raises(ValueError, match="same shape"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))
