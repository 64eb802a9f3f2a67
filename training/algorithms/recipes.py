"""The 2025 recipes under verl's key names, and which backend honours which key.

- DAPO: ``actor_rollout_ref.actor.clip_ratio_high`` (clip-higher, 0.28), ``actor.loss_agg_mode=token-mean``,
  ``algorithm.filter_groups.enable`` and ``reward_model.overlong_buffer`` (soft overlong punishment).
- Dr. GRPO: ``algorithm.norm_adv_by_std_in_grpo=false`` and ``actor.loss_agg_mode=seq-mean-token-sum-norm``.
- GSPO: ``actor.policy_loss.loss_mode=gspo`` (one importance ratio per sequence), with
  ``loss_agg_mode=seq-mean-token-mean`` and narrow clip ranges.

The verl backend passes every key to verl. The trl backend maps them onto TRL's options
(``loss_type``, ``importance_sampling_level``, ``epsilon``/``epsilon_high``, the soft overlong
punishment reward). A backend that cannot honour a key refuses it by name instead of ignoring it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from training.errors import ConfigError

if TYPE_CHECKING:
    from training.config import Config

# The recipe keys and the value that asks for nothing.
RECIPE_KEYS: dict[str, object] = {
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.clip_ratio_low": None,
    "actor_rollout_ref.actor.clip_ratio_high": None,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "reward_model.overlong_buffer.enable": False,
}


def refuse_recipe_keys(config: "Config", backend: str, honoured: set[str] = frozenset()) -> None:
    """Raise ConfigError naming the first recipe key set away from its default that ``backend``
    does not honour."""
    for key, default in RECIPE_KEYS.items():
        value = config.get(key)
        if key not in honoured and value != default:
            raise ConfigError(key, f"{value!r} cannot be honoured by the {backend} backend; remove it or use the verl or trl backend.")


def clip_range(config: "Config") -> tuple[float, float]:
    """(low, high) clip epsilons: clip_ratio_low/high where set, clip_ratio otherwise (as verl)."""
    actor = config.actor_rollout_ref.actor
    low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    high = actor.clip_ratio if actor.clip_ratio_high is None else actor.clip_ratio_high
    return low, high


def overlong_punishment(config: "Config"):
    """TRL's soft overlong punishment (DAPO eq. 13) for ``reward_model.overlong_buffer``, or None when
    off: 0 up to ``max_response_length - len`` tokens, then falling linearly to -1 at the limit;
    weighted by ``penalty_factor`` this is verl's DAPO reward shaping."""
    buffer = config.reward_model.overlong_buffer
    if not buffer.enable:
        return None
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(config.data.max_response_length, buffer.len)


def overlong_penalties(config: "Config", completion_ids: list[list[int]]) -> list[float]:
    """The weighted overlong penalty of each completion (zeros when the buffer is off)."""
    punish = overlong_punishment(config)
    if punish is None:
        return [0.0] * len(completion_ids)
    factor = config.reward_model.overlong_buffer.penalty_factor
    return [factor * p for p in punish(completion_ids)]
