"""Advantages are verl's: every estimator offered matches verl's trainer on the same batch to 1e-6,
and the layout (reward on the last token, environment tokens masked) is verl's."""

import numpy as np
import pytest
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos

from training.algorithms.advantages import NEEDS, check_estimator, compute_advantages, equal_reward_groups, offered_estimators
from training.config import ADV_ESTIMATORS, POLICY_LOSS_MODES, Config
from training.errors import ConfigError

GROUP = 4


def algorithm(estimator: str, norm: bool = True, gamma: float = 1.0):
    return Config.build({
        "algorithm.adv_estimator": estimator, "algorithm.norm_adv_by_std_in_grpo": norm, "algorithm.gamma": gamma,
    }).algorithm


def batch(seed: int = 0, groups: int = 3, tokens: int = 9):
    """Rewards, responses of different lengths, environment tokens inside some (multi-turn)."""
    generator = torch.Generator().manual_seed(seed)
    rows = groups * GROUP
    rewards = torch.rand(rows, generator=generator).round(decimals=1)
    rewards[:GROUP] = 0.5  # one group without signal
    lengths = torch.randint(2, tokens + 1, (rows,), generator=generator)
    sequence = (torch.arange(tokens).unsqueeze(0) < lengths.unsqueeze(1)).float()
    model_tokens = sequence.clone()
    model_tokens[1::3, 1] = 0.0  # an observation span inside the response
    return rewards, model_tokens, sequence


def verl_reference(estimator: str, rewards, model_tokens, sequence, norm: bool, gamma: float):
    """What verl's ray_trainer.compute_advantage does with the same batch, written out."""
    scores = torch.zeros_like(sequence)
    last = sequence.shape[1] - 1 - sequence.flip(dims=[1]).argmax(dim=1)
    scores[torch.arange(len(rewards)), last] = rewards
    index = np.array([f"uid-{i // GROUP}" for i in range(len(rewards))], dtype=object)
    fn = core_algos.get_adv_estimator_fn(estimator)
    if estimator == "grpo":
        return fn(token_level_rewards=scores, response_mask=model_tokens, index=index, norm_adv_by_std_in_grpo=norm)[0]
    config = AlgoConfig(adv_estimator=estimator, gamma=gamma, norm_adv_by_std_in_grpo=norm)
    return fn(token_level_rewards=scores, response_mask=model_tokens, index=index, config=config)[0]


def test_the_config_lists_verls_estimators_and_policy_losses():
    assert set(ADV_ESTIMATORS) == set(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert set(POLICY_LOSS_MODES) == set(core_algos.POLICY_LOSS_REGISTRY)
    assert {"grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg"} <= set(offered_estimators())


@pytest.mark.parametrize("estimator", offered_estimators())
@pytest.mark.parametrize("norm, gamma", [(True, 1.0), (False, 0.9)])
def test_every_offered_estimator_matches_verl_on_the_same_batch(estimator, norm, gamma):
    rewards, model_tokens, sequence = batch(seed=len(estimator))
    ours = compute_advantages(rewards, model_tokens, GROUP, algorithm(estimator, norm, gamma), sequence_mask=sequence)
    theirs = verl_reference(estimator, rewards, model_tokens, sequence, norm, gamma)
    assert ours.shape == sequence.shape
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0), (ours - theirs).abs().max()
    assert torch.all(ours[model_tokens == 0] == 0)  # nothing is taught on environment tokens or padding


def test_reinforce_plus_plus_whitens_over_response_tokens_as_verl_does():
    """The difference that was measured (0.097): whitening over tokens, not over episodes."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float32)
    ours = compute_advantages(rewards, mask, 2, algorithm("reinforce_plus_plus"))
    tokens = torch.cat([torch.full((4,), 1.0), torch.zeros(1), torch.full((2,), 1.0), torch.zeros(3)])
    whitened = (tokens - tokens.mean()) / (tokens.var(unbiased=True) + 1e-8).sqrt()
    assert torch.allclose(ours[mask.bool()], whitened, atol=1e-6)


def test_grpo_advantage_is_one_value_per_episode_on_its_tokens():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    mask = torch.ones(6, 3)
    advantages = compute_advantages(rewards, mask, 3, algorithm("grpo"))
    std = (1 / 3) ** 0.5  # group 0: mean 1/3, unbiased std sqrt(1/3); verl's eps is 1e-6
    expected = torch.tensor([(2 / 3), (-1 / 3), (-1 / 3), 0.0, 0.0, 0.0]) / (std + 1e-6)
    expected[3:] = 0.0
    assert torch.allclose(advantages, expected.unsqueeze(1).expand(6, 3), atol=1e-6)


def test_an_episode_without_tokens_gets_no_reward_and_no_advantage():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    advantages = compute_advantages(torch.tensor([1.0, 0.0]), mask, 2, algorithm("rloo"))
    assert advantages[1].abs().sum() == 0


@pytest.mark.parametrize("estimator", sorted(NEEDS))
def test_estimators_that_need_more_than_rewards_are_refused_by_name(estimator):
    with pytest.raises(ConfigError, match=rf"^algorithm.adv_estimator: {estimator} needs .* which the trl backend does not produce"):
        check_estimator(estimator, "trl")
    with pytest.raises(ValueError, match=estimator):
        compute_advantages(torch.ones(2), torch.ones(2, 1), 2, algorithm(estimator))


def test_an_estimator_outside_verls_registry_is_refused_by_the_config():
    with pytest.raises(ConfigError, match="algorithm.adv_estimator: must be one of grpo, grpo_passk"):
        Config.build({"algorithm.adv_estimator": "ppo"})


def test_rewards_not_divisible_by_group_size():
    with pytest.raises(ValueError, match="5 rewards cannot be split into groups of 2"):
        compute_advantages(torch.ones(5), torch.ones(5, 2), 2, algorithm("grpo"))
    with pytest.raises(ValueError, match="5 rewards cannot be split into groups of 2"):
        equal_reward_groups(torch.ones(5), group_size=2)


def test_bad_shapes_and_group_size():
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages(torch.ones(2, 2), torch.ones(2, 2), 2, algorithm("grpo"))
    with pytest.raises(ValueError, match="at least 1"):
        compute_advantages(torch.ones(2), torch.ones(2, 2), 0, algorithm("grpo"))
    with pytest.raises(ValueError, match="one row per reward"):
        compute_advantages(torch.ones(2), torch.ones(3, 2), 2, algorithm("grpo"))


def test_equal_reward_groups_marks_groups_without_signal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5 + 1e-10])
    assert equal_reward_groups(rewards, group_size=2).tolist() == [True, False, True]
