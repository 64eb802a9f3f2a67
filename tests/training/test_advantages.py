import pytest
import torch

from training.advantages import ESTIMATORS, compute_advantages, equal_reward_groups
from training.config import ADV_ESTIMATORS


def test_grpo_normalizes_by_unbiased_group_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    advantages = compute_advantages(rewards, group_size=3)
    # group 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std = (1 / 3) ** 0.5
    expected = torch.tensor([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std, 0.0, 0.0, 0.0])
    assert torch.allclose(advantages, expected, atol=1e-5)


def test_grpo_eps_keeps_equal_groups_finite():
    advantages = compute_advantages(torch.tensor([2.0, 2.0]), group_size=2)
    assert torch.equal(advantages, torch.zeros(2))


def test_grpo_without_std_only_centers():
    advantages = compute_advantages(torch.tensor([3.0, 1.0, 0.0, 4.0]), group_size=2, norm_by_std=False)
    assert torch.allclose(advantages, torch.tensor([1.0, -1.0, -2.0, 2.0]))


def test_rloo_subtracts_mean_of_the_others():
    advantages = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 3.0]), group_size=4, estimator="rloo")
    # 1 - (0+0+3)/3 = 0; 0 - (1+0+3)/3 = -4/3; 3 - (1+0+0)/3 = 8/3
    assert torch.allclose(advantages, torch.tensor([0.0, -4 / 3, -4 / 3, 8 / 3]))


def test_reinforce_plus_plus_whitens_over_the_batch_not_the_group():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    advantages = compute_advantages(rewards, group_size=2, estimator="reinforce_plus_plus", eps=0.0)
    # batch mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3); GRPO would give all zeros here
    std = (1 / 3) ** 0.5
    assert torch.allclose(advantages, torch.tensor([0.5, 0.5, -0.5, -0.5]) / std, atol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_of_one_gets_zero_advantage(estimator):
    advantages = compute_advantages(torch.tensor([1.0, 0.0, 5.0]), group_size=1, estimator=estimator)
    assert torch.equal(advantages, torch.zeros(3))


def test_integer_rewards_are_accepted():
    advantages = compute_advantages(torch.tensor([1, 0]), group_size=2, norm_by_std=False)
    assert advantages.dtype == torch.float32
    assert torch.allclose(advantages, torch.tensor([0.5, -0.5]))


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError, match="'ppo'.*grpo, rloo, reinforce_plus_plus"):
        compute_advantages(torch.tensor([1.0, 0.0]), group_size=2, estimator="ppo")


def test_estimators_match_the_config_choices():
    assert set(ESTIMATORS) == set(ADV_ESTIMATORS)


def test_rewards_not_divisible_by_group_size():
    with pytest.raises(ValueError, match="5 rewards cannot be split into groups of 2"):
        compute_advantages(torch.ones(5), group_size=2)
    with pytest.raises(ValueError, match="5 rewards cannot be split into groups of 2"):
        equal_reward_groups(torch.ones(5), group_size=2)


def test_bad_shape_and_group_size():
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages(torch.ones(2, 2), group_size=2)
    with pytest.raises(ValueError, match="at least 1"):
        compute_advantages(torch.ones(2), group_size=0)


def test_equal_reward_groups_marks_groups_without_signal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5 + 1e-10])
    assert equal_reward_groups(rewards, group_size=2).tolist() == [True, False, True]
