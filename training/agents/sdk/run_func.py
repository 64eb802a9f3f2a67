"""Calling rLLM-style ``fn(**task)`` run functions and reading what they return."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from training.agents.sdk.client import get_chat_client, get_chat_client_async
from training.agents.sdk.session import TrajectoryView, episode_from_views
from training.types import Episode, RewardOutput, Step

# Parameters the trainer fills (when the task has no field of that name): the episode's
# endpoint URL and a ready ``openai`` client bound to it.
PROVIDED = ("base_url", "client")


def call_arguments(func: Callable[..., Any], task: dict, base_url: str) -> dict[str, Any]:
    """``fn(**task)``'s keyword arguments, plus ``base_url`` / ``client`` where ``fn`` names them."""
    kwargs = dict(task)
    wanted = _parameter_names(func)
    if "base_url" in wanted and "base_url" not in task:
        kwargs["base_url"] = base_url
    if "client" in wanted and "client" not in task:
        make = get_chat_client_async if inspect.iscoroutinefunction(func) else get_chat_client
        kwargs["client"] = make(base_url=base_url, api_key="EMPTY")
    return kwargs


def check_task_fields(func: Callable[..., Any], task: dict, what: str = "the first row of train_dataset") -> None:
    """Raise ValueError, naming the fields, when ``fn(**task)`` cannot be called with ``task``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    names = set(task) | ({name for name in PROVIDED if name in signature.parameters})
    try:
        signature.bind(**dict.fromkeys(names))
    except TypeError as exc:
        fields = ", ".join(map(str, task)) or "none"
        raise ValueError(
            f"agent_run_func {getattr(func, '__qualname__', func)!r} is called as fn(**task) (rLLM's form) but "
            f"cannot take the fields of {what} ({fields}): {exc}. Name its parameters after the dataset's "
            "fields and add **kwargs for the rest, or write fn(task, model) to receive the row as one dict."
        ) from exc


def no_model_call_message(func: Callable[..., Any]) -> str:
    name = getattr(func, "__qualname__", repr(func))
    return (
        f"agent_run_func {name} returned without calling the model, so the episode has nothing to train on. "
        "Call the model through the episode's endpoint: training.sdk.get_chat_client() (rLLM's "
        "get_chat_client), a parameter named `client` or `base_url`, or training.sdk.current_base_url()."
    )


def result_of(value: Any, calls: list[Step]) -> RewardOutput | Episode | None:
    """What rLLM's SDK accepts as a run function's result: a float, int or bool reward (solved when
    >= 1, as rLLM counts it), or a list of ``TrajectoryView`` (an episode of named trajectories);
    also a ``RewardOutput``, or None to leave the scoring to ``reward_func``."""
    if value is None or isinstance(value, RewardOutput):
        return value
    if isinstance(value, (bool, int, float)):
        return RewardOutput(reward=float(value), is_correct=float(value) >= 1.0)
    if isinstance(value, list) and all(isinstance(item, TrajectoryView) for item in value):
        return episode_from_views(value, calls)
    raise TypeError(
        f"agent_run_func returned {type(value).__name__}; return a float reward or a list of TrajectoryView "
        "(rLLM's forms), a RewardOutput, or None to score the last answer with reward_func."
    )


def _parameter_names(func: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return set()
