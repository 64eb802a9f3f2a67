"""Advantages from verl's estimator registry, laid out for our backends.

The estimators themselves are verl's (``verl.trainer.ppo.core_algos.get_adv_estimator_fn``), so
every backend computes exactly what verl computes. What is here is the layout: verl takes
token-level rewards ``(B, T)`` with each episode's reward on its last token, a response mask
(1 on the tokens the model wrote, 0 on padding and environment tokens) and an array of group ids;
it is called with the arguments verl's trainer passes (``ray_trainer.compute_advantage``).

Rows are laid out group-major: group ``g`` (the episodes sampled for one prompt) is rows
``g * group_size`` to ``(g + 1) * group_size - 1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from training.errors import ConfigError

if TYPE_CHECKING:
    from training.config import AlgorithmConfig

# verl estimators that need more than one reward per episode and a mask; a backend that does not
# produce what they need refuses them by name.
NEEDS: dict[str, str] = {
    "gae": "a critic (value model)",
    "remax": "a greedy baseline rollout per prompt (reward_baselines)",
    "gdpo": "several reward components per episode (algorithm.gdpo_reward_keys)",
    "optimal_token_baseline": "the sampler's sum of squared token probabilities (sum_pi_squared)",
    "tir_optimal_token_baseline": "the sampler's sum of squared token probabilities (sum_pi_squared)",
}


def verl_estimators() -> list[str]:
    """Every estimator in verl's registry."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    return sorted(ADV_ESTIMATOR_REGISTRY)


def offered_estimators() -> list[str]:
    """The verl estimators that need only rewards and a response mask: every backend offers these."""
    return [name for name in verl_estimators() if name not in NEEDS]


def check_estimator(name: str, backend: str) -> None:
    """Refuse, naming the key, an estimator this backend cannot feed."""
    if name in NEEDS:
        raise ConfigError(
            "algorithm.adv_estimator",
            f"{name} needs {NEEDS[name]}, which the {backend} backend does not produce; use the verl backend "
            f"or one of {', '.join(offered_estimators())}.",
        )


def _checked(rewards: torch.Tensor, response_mask: torch.Tensor | None, group_size: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}.")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor (one reward per episode), got shape {tuple(rewards.shape)}.")
    if rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of {group_size}; every prompt must have "
            f"exactly group_size (actor_rollout_ref.rollout.n) episodes."
        )
    if response_mask is not None and (response_mask.dim() != 2 or response_mask.shape[0] != rewards.numel()):
        raise ValueError(
            f"response_mask must be (episodes, tokens) with one row per reward; got {tuple(response_mask.shape)} "
            f"for {rewards.numel()} rewards."
        )


def token_level_rewards(rewards: torch.Tensor, sequence_mask: torch.Tensor) -> torch.Tensor:
    """Each episode's reward on its last token (as verl's reward managers place it); an episode
    without tokens has nowhere to hold it and gets none."""
    lengths = sequence_mask.long().sum(dim=1)
    placed = torch.zeros(sequence_mask.shape, dtype=torch.float32, device=sequence_mask.device)
    rows = torch.nonzero(lengths > 0).flatten()
    last = sequence_mask.shape[1] - 1 - sequence_mask[rows].long().flip(dims=[1]).argmax(dim=1)
    placed[rows, last] = rewards.float().to(placed.device)[rows]
    return placed


def compute_advantages(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_size: int,
    algorithm: "AlgorithmConfig",
    sequence_mask: torch.Tensor | None = None,
    index: "np.ndarray | None" = None,
) -> torch.Tensor:
    """Token advantages ``(B, T)`` from verl's ``algorithm.adv_estimator``.

    ``rewards``: one per episode, group-major. ``response_mask``: 1 on the tokens the model wrote.
    ``sequence_mask``: every token of the response, environment tokens included (default: the
    response mask); the reward sits on its last token, as in verl's multi-turn agent loop.
    ``index``: one group id per row, as verl's estimators take it, for groups that are not
    consecutive runs of ``group_size`` (then pass ``group_size=1``; see ``training.algorithms.episode_rows``).
    """
    import numpy as np
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    _checked(rewards, response_mask, group_size)
    if algorithm.adv_estimator in NEEDS:
        raise ValueError(f"{algorithm.adv_estimator} needs {NEEDS[algorithm.adv_estimator]}, not only rewards and a mask.")
    mask = response_mask.float()
    scores = token_level_rewards(rewards, response_mask if sequence_mask is None else sequence_mask)
    if index is None:
        index = np.repeat(np.arange(rewards.numel() // group_size), group_size)
    estimator = get_adv_estimator_fn(algorithm.adv_estimator)
    if algorithm.adv_estimator == "grpo":  # verl's trainer calls grpo with the flag rather than the config
        advantages, _ = estimator(
            token_level_rewards=scores, response_mask=mask, index=index,
            norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
        )
    else:
        config = AlgoConfig(
            adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,
            norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
        )
        advantages, _ = estimator(token_level_rewards=scores, response_mask=mask, index=index, config=config)
    return advantages


def equal_reward_groups(rewards: torch.Tensor, group_size: int) -> torch.BoolTensor:
    """True for each group whose rewards are all equal: its advantages are zero, so it teaches nothing."""
    _checked(rewards, None, group_size)
    groups = rewards.float().view(-1, group_size)
    return (groups.max(dim=1).values - groups.min(dim=1).values) <= 1e-8
