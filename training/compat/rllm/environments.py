"""Ready-made environments with rLLM's names: a question answered over several turns or one.

``SingleTurnEnvironment`` is what rLLM's math and code examples pair with their agents::

    AgentTrainer(agent_class=MathAgent, env_class=SingleTurnEnvironment,
                 env_args={"reward_fn": math_reward_fn}, ...)

``reward_fn`` may be a function (``fn(task, response)`` as rLLM writes them, or verl's
``fn(data_source, solution_str, ground_truth, extra_info)``), a built-in reward name or an import
path; it returns a float or a ``RewardOutput``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from training.agents.base import BaseEnv, split_settings
from training.rewards import RewardFunction, load_reward


class MultiTurnEnvironment(BaseEnv):
    """The task is the observation; each answer is scored by ``get_reward_and_next_obs``; the
    episode ends after ``max_turns`` answers. ``info`` of each step is the task."""

    def __init__(self, task: dict | None = None, max_turns: int = 3, **kwargs: Any) -> None:
        self.task = task
        self.max_turns = max_turns
        self.current_turn = 0
        self.done = False
        self.history: list[Any] = []

    def reset(self, task: dict | None = None) -> tuple[Any, dict]:
        if task is not None:
            self.task = task
        self.done = False
        self.current_turn = 0
        self.history = []
        return self.task, {}

    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        if self.task is None:
            raise ValueError(f"{type(self).__name__} has no task: give task= or reset(task=...) first.")
        self.history.append(action)
        reward, next_observation = self.get_reward_and_next_obs(self.task, action)
        self.current_turn += 1
        if self.current_turn >= self.max_turns:
            self.done = True
            return {}, reward, True, self.task
        return next_observation, reward, self.done, self.task

    @abstractmethod
    def get_reward_and_next_obs(self, task: dict, action: Any) -> tuple[float, Any]:
        """Score ``action`` on ``task``; return ``(reward, next observation)``."""

    @staticmethod
    def from_dict(info: dict) -> "MultiTurnEnvironment":
        raise NotImplementedError("MultiTurnEnvironment is abstract; subclass it and give it a from_dict.")


class SingleTurnEnvironment(MultiTurnEnvironment):
    """One answer per episode, scored by ``reward_fn(task, answer)``.

    Without a reward function every answer scores 0; that is refused when the environment is
    built, because training on a reward that never varies teaches nothing.
    """

    def __init__(self, task: dict | None = None, reward_fn: Any = None, **kwargs: Any) -> None:
        super().__init__(task=task, max_turns=1, **kwargs)
        if reward_fn is None:
            raise ValueError(
                "SingleTurnEnvironment needs a reward function: pass env_args={'reward_fn': fn} "
                "(a function, a built-in reward name or an import path)."
            )
        self.reward_fn: RewardFunction = load_reward(reward_fn)

    def get_reward_and_next_obs(self, task: dict, action: Any) -> tuple[float, Any]:
        return self.reward_fn(task, action).reward, {}

    @staticmethod
    def from_dict(info: dict) -> "SingleTurnEnvironment":
        """``info`` is the dataset row merged with ``env_args``: ``reward_fn`` comes out of
        ``env_args`` (never the row: ``split_settings``), and the rest (or its ``task`` entry, where
        there is one) is the task."""
        task, settings = split_settings(info, ("reward_fn",))
        return SingleTurnEnvironment(task=task.get("task", task), **settings)
