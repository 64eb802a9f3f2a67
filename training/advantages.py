"""Outcome advantages from one scalar reward per episode, following verl's estimators.

Rewards come as a flat vector laid out group-major: group ``g`` (the episodes sampled for one
prompt) is rows ``g * group_size`` to ``(g + 1) * group_size - 1``.
"""

from __future__ import annotations

from typing import Callable

import torch


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``rewards`` as a (num_groups, group_size) float tensor, after checking the layout."""
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}.")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor (one reward per episode), got shape {tuple(rewards.shape)}.")
    if rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of {group_size}; every prompt must have "
            f"exactly group_size (actor_rollout_ref.rollout.n) episodes."
        )
    return rewards.float().view(-1, group_size)


def _grpo(groups: torch.Tensor, norm_by_std: bool, eps: float) -> torch.Tensor:
    if groups.shape[1] == 1:  # one episode has nothing to be compared with
        return torch.zeros_like(groups)
    centered = groups - groups.mean(dim=1, keepdim=True)
    if not norm_by_std:  # Dr. GRPO
        return centered
    return centered / (groups.std(dim=1, keepdim=True) + eps)  # unbiased std, as verl


def _rloo(groups: torch.Tensor, norm_by_std: bool, eps: float) -> torch.Tensor:
    n = groups.shape[1]
    if n == 1:
        return torch.zeros_like(groups)
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (n - 1)
    return groups - others_mean


def _reinforce_plus_plus(groups: torch.Tensor, norm_by_std: bool, eps: float) -> torch.Tensor:
    # REINFORCE++ uses no group baseline: it whitens over the whole batch.
    flat = groups.flatten()
    if flat.numel() == 1:
        return torch.zeros_like(groups)
    return ((flat - flat.mean()) / (flat.std() + eps)).view_as(groups)


ESTIMATORS: dict[str, Callable[[torch.Tensor, bool, float], torch.Tensor]] = {
    "grpo": _grpo,
    "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_plus_plus,
}


def compute_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: str = "grpo",
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One advantage per episode, same order as ``rewards``.

    ``grpo``: (r - group mean) / (group std + eps), the division only if ``norm_by_std``.
    ``rloo``: r minus the mean of the other episodes of its group.
    ``reinforce_plus_plus``: rewards whitened over the whole batch.
    A group of one episode gets advantage 0 under grpo and rloo: there is no baseline to compare with.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose from {', '.join(ESTIMATORS)}.")
    groups = _grouped(rewards, group_size)
    return ESTIMATORS[estimator](groups, norm_by_std, eps).flatten()


def equal_reward_groups(rewards: torch.Tensor, group_size: int) -> torch.BoolTensor:
    """True for each group whose rewards are all equal: its advantages are zero, so it teaches nothing."""
    groups = _grouped(rewards, group_size)
    return (groups.max(dim=1).values - groups.min(dim=1).values) <= 1e-8
