"""Rewards: how a reward function is loaded and called (``registry``) and the built-in ones (``builtin``)."""

from training.rewards.builtin import (
    char_accuracy,
    code_reward_fn,
    countdown,
    countdown_reward_fn,
    exact_match,
    extract_code_from_model,
    extract_math_answer,
    extract_search_answer,
    f1_reward_fn,
    math_reward,
    math_reward_fn,
    search_reward_fn,
)
from training.rewards.registry import CONVENTIONAL_REWARD_NAMES, RewardFunction, builtin_rewards, load_reward, register_reward, reward_in_file

__all__ = [
    "CONVENTIONAL_REWARD_NAMES",
    "RewardFunction",
    "builtin_rewards",
    "char_accuracy",
    "code_reward_fn",
    "countdown",
    "countdown_reward_fn",
    "exact_match",
    "extract_code_from_model",
    "extract_math_answer",
    "extract_search_answer",
    "f1_reward_fn",
    "load_reward",
    "math_reward",
    "math_reward_fn",
    "register_reward",
    "reward_in_file",
    "search_reward_fn",
]
