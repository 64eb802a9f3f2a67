"""What a user writes to train an agent: an agent plus an environment, a workflow, or a plain function.

The method names follow rLLM so that rLLM agents and environments carry over unchanged.
"""

from __future__ import annotations

import inspect
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from training.config import secrets
from training.errors import MissingField
from training.types import Action, Step, Trajectory
from training.utils import import_object

class BaseAgent(ABC):
    """An agent turns environment observations into chat messages and model responses into actions.

    As in rLLM only ``reset`` must be written; the rest is needed when the agent runs against an
    environment (``agent_class`` + ``env_class``), not when a workflow drives it.
    """

    @property
    def chat_completions(self) -> list[dict[str, str]]:
        """The conversation so far, as chat messages; the model answers the last one."""
        return []

    @property
    def trajectory(self) -> Trajectory:
        """The steps taken so far in this episode."""
        return Trajectory()

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
        """Take in what the environment returned (after ``reset`` or ``step``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement update_from_env to run against an environment.")

    def update_from_model(self, response: str, **kwargs: Any) -> Action:
        """Take in the model's response and return the action to send to the environment."""
        raise NotImplementedError(f"{type(self).__name__} must implement update_from_model to run against an environment.")

    @abstractmethod
    def reset(self) -> None:
        """Forget the previous episode."""

    def get_current_state(self) -> Step | None:
        """The latest step, or None before the first one."""
        steps = self.trajectory.steps
        return steps[-1] if steps else None


class BaseEnv(ABC):
    """An environment: ``reset`` gives the first observation, ``step`` answers an action."""

    @property
    def idx(self) -> Any:
        """The environment's index in a batch, where one was set (rLLM's)."""
        return getattr(self, "_idx", None)

    @idx.setter
    def idx(self, value: Any) -> None:
        self._idx = value

    @abstractmethod
    def reset(self) -> tuple[Any, dict]:
        """Start an episode; return ``(observation, info)``."""

    @abstractmethod
    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        """Apply an action; return ``(observation, reward, done, info)``."""

    def close(self) -> None:
        """Release whatever the environment holds (processes, sandboxes)."""

    @staticmethod
    @abstractmethod
    def from_dict(info: dict) -> "BaseEnv":
        """Build an environment for one task: a dataset row merged with ``env_args`` (an ``EnvInfo``,
        whose ``split_settings`` tells the row's data from the settings)."""

    @staticmethod
    def is_multithread_safe() -> bool:
        """Whether ``step`` may run in a worker thread while other episodes run."""
        return True


class EnvInfo(dict):
    """What the episode loop hands an environment class's ``from_dict``: rLLM's ``{**task,
    **env_args}``, which also remembers which keys came from ``env_args`` (the caller's code, or an
    administrator's registry entry) rather than from the dataset row.

    A row is data. An environment's settings -- its tools, reward function, server commands and
    their environment, limits -- come only from ``env_args``; a row's key of the same name is one
    more field of the task (``split_settings``). So a dataset someone uploaded can never choose a
    program, a variable of its environment, or an import path."""

    def __init__(self, task: dict, env_args: dict) -> None:
        super().__init__({**task, **env_args})
        self.row = dict(task)
        self.setting_keys = frozenset(env_args)


def build_env(env_class: type, task: dict, env_args: dict) -> "BaseEnv":
    """One environment for one task, as every episode loop builds it (secrets named in ``env_args``
    put in now: ``training.config.secrets``). A ``KeyError`` for a key the row and ``env_args`` both
    lack becomes a ``MissingField`` that names the key, what was there and the fixes."""
    info = EnvInfo(task, secrets.resolve(env_args))
    try:
        return env_class.from_dict(info)
    except KeyError as exc:
        key = exc.args[0] if len(exc.args) == 1 else None
        if not isinstance(key, str) or key in info:
            raise  # a KeyError from deeper in the environment's own code, not a missing field
        columns = ", ".join(map(str, task)) or "none"
        settings = ", ".join(map(str, env_args)) or "none"
        raise MissingField(key,
            f"{env_class.__name__}.from_dict needs {key!r}, which the dataset row does not have (its columns: "
            f"{columns}) and env_args does not give (its keys: {settings}). Add a {key!r} column to the dataset, "
            f"map one of its columns to {key!r} in the dataset's column mapping, or set {key!r} in env_args."
        ) from exc


def build_agent(agent_class: type, agent_args: dict) -> Any:
    """One agent, as every episode loop builds it (secrets named in ``agent_args`` put in now)."""
    return agent_class(**secrets.resolve(agent_args))


def split_settings(info: dict, names: tuple[str, ...]) -> tuple[dict, dict]:
    """``from_dict``'s input as ``(task, settings)``: the settings are the keys of ``names`` that
    came from ``env_args``. From an ``EnvInfo``, a row's key named like a setting stays in the task
    as data; a plain dict (built by the caller's own code, as rLLM's scripts do) is taken whole."""
    given = info.setting_keys if isinstance(info, EnvInfo) else frozenset(info)
    settings = {name: info[name] for name in names if name in info and name in given}
    rest = {key: value for key, value in info.items() if key not in settings}
    if isinstance(info, EnvInfo):  # the row whole (a field env_args shadowed included), then env_args' other keys
        rest = {**info.row, **{key: value for key, value in rest.items() if key in given}}
    return rest, settings


def _resolve_class(value: type | str, base: type, name: str) -> type:
    cls = import_object(value, what=name) if isinstance(value, str) else value
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise ValueError(f"{name} must be a subclass of {base.__name__}, got {cls!r}.")
    return cls
