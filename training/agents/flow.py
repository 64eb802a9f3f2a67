"""rLLM's AgentFlow API (its main branch): ``@rollout`` flows and ``@evaluator`` scorers.

An AgentFlow is called with a ``Task`` and an ``AgentConfig`` whose ``base_url`` is the episode's
OpenAI-compatible endpoint (``training.rollouts.chat_endpoint``); it returns an ``Episode`` (or a
``Trajectory``, or None) whose steps may carry no token ids: the calls made through the endpoint
are recorded with their exact tokens and logprobs and attached to the steps by the episode runner.
The evaluator's ``EvalOutput`` then gives the reward. ``import training as rllm`` offers
``rllm.rollout`` and ``rllm.evaluator`` as rLLM does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from functools import update_wrapper
from typing import Any

from training.types import AgentConfig, Episode, EvalOutput, Task, Trajectory

# rLLM's name for a trajectory its flow left unnamed; the flow's own name replaces it.
DEFAULT_TRAJECTORY_NAME = "default_traj_name"


class AgentFlowFn:
    """What ``@rollout`` makes of a function ``fn(task, config)``: an ``AgentFlow`` with ``run``
    and ``arun`` (sync functions run in a worker thread there, so they do not block the loop)."""

    needs_env = False  # a function flow never asks for a sandbox

    def __init__(self, fn: Callable[[Task, AgentConfig], Any], *, name: str = "solver") -> None:
        self._fn = fn
        self.name = name
        self._is_async = inspect.iscoroutinefunction(fn)
        update_wrapper(self, fn)

    def run(self, task: Task, config: AgentConfig) -> Episode:
        result = asyncio.run(self._fn(task, config)) if self._is_async else self._fn(task, config)
        return coerce_to_episode(result, task, self.name)

    async def arun(self, task: Task, config: AgentConfig) -> Episode:
        if self._is_async:
            result = await self._fn(task, config)
        else:
            result = await asyncio.get_running_loop().run_in_executor(None, self._fn, task, config)
        return coerce_to_episode(result, task, self.name)

    def __call__(self, task: Task, config: AgentConfig) -> Episode:
        return self.run(task, config)

    def __repr__(self) -> str:
        return f"AgentFlowFn({self._fn.__name__!r}, name={self.name!r})"


class EvaluatorFn:
    """What ``@evaluator`` makes of a function ``fn(task, episode)``: an ``Evaluator``. As in
    rLLM, its ``task`` is the dataset row (a dict) and its result may be an ``EvalOutput``, a
    float, a bool or ``(reward, is_correct)``."""

    takes_row = True

    def __init__(self, fn: Callable[[Any, Episode], Any]) -> None:
        self._fn = fn
        update_wrapper(self, fn)

    def evaluate(self, task: Any, episode: Episode) -> EvalOutput:
        return coerce_to_eval_output(self._fn(task, episode))

    def __call__(self, task: Any, episode: Episode) -> EvalOutput:
        return self.evaluate(task, episode)

    def __repr__(self) -> str:
        return f"EvaluatorFn({self._fn.__name__!r})"


def rollout(fn: Callable | None = None, *, name: str = "solver", register: str | None = None) -> Any:
    """rLLM's ``@rllm.rollout`` / ``@rllm.rollout(name=...)``: ``name`` names the trajectory a
    flow returns unnamed (or the empty one built when it returns None)."""
    _refuse_registry(register, "rollout")

    def decorate(function: Callable) -> AgentFlowFn:
        return AgentFlowFn(function, name=name)

    return decorate(fn) if fn is not None else decorate


def evaluator(fn: Callable | None = None, *, register: str | None = None) -> Any:
    """rLLM's ``@rllm.evaluator``."""
    _refuse_registry(register, "evaluator")
    return EvaluatorFn(fn) if fn is not None else EvaluatorFn


def _refuse_registry(register: str | None, what: str) -> None:
    if register is not None:
        raise ValueError(
            f"@{what}(register={register!r}) adds to rLLM's command-line registry (~/.rllm), which this "
            f"trainer does not have; pass the {what} to AgentTrainer directly and drop register=."
        )


def coerce_to_episode(result: Any, task: Any, trajectory_name: str) -> Episode:
    """What a flow returned as an ``Episode``: an Episode as it is (its task filled in), a
    Trajectory wrapped in one, None as one empty trajectory (the recorded calls fill it)."""
    row = getattr(task, "metadata", task)
    if isinstance(result, Episode):
        if result.task is None:
            result.task = row
        return result
    if isinstance(result, Trajectory):
        if result.name in (DEFAULT_TRAJECTORY_NAME, "agent"):
            result.name = trajectory_name
        return Episode(task=row, trajectories=[result])
    if result is None:
        return Episode(task=row, trajectories=[Trajectory(name=trajectory_name)])
    raise TypeError(
        f"the agent flow returned {type(result).__name__}; return an Episode, a Trajectory or None."
    )


def coerce_to_eval_output(result: Any) -> EvalOutput:
    if isinstance(result, EvalOutput):
        return result
    if isinstance(result, bool):
        return EvalOutput(reward=float(result), is_correct=result)
    if isinstance(result, (int, float)):
        return EvalOutput(reward=float(result), is_correct=float(result) > 0)
    if isinstance(result, tuple) and len(result) == 2:
        return EvalOutput(reward=float(result[0]), is_correct=bool(result[1]))
    raise TypeError(
        f"the evaluator returned {type(result).__name__}; return an EvalOutput, a float, a bool or (reward, is_correct)."
    )


def is_agent_flow(value: Any) -> bool:
    return callable(getattr(value, "arun", None)) or callable(getattr(value, "run", None))


def check_agent_flow(agent_flow: Any, evaluator: Any) -> None:
    """Raise ValueError, saying what to pass, unless both are usable."""
    if not is_agent_flow(agent_flow):
        raise ValueError(
            f"agent_flow must be an AgentFlow (a function decorated with @rollout, or an object with "
            f"run(task, config) or async arun(task, config)), got {type(agent_flow).__name__}."
        )
    if evaluator is None:
        raise ValueError(
            "agent_flow needs an evaluator to give each episode its reward: pass evaluator= (a function "
            "decorated with @evaluator, or an object with evaluate(task, episode))."
        )
    if not callable(getattr(evaluator, "evaluate", None)):
        raise ValueError(
            f"evaluator must have evaluate(task, episode) (decorate a function with @evaluator), got {type(evaluator).__name__}."
        )


def task_from_row(row: dict, fallback_id: str) -> Task:
    """A dataset row as rLLM's trainer hands it to a flow: the row is ``metadata``, its
    ``instruction`` or ``question`` the instruction, its ``id`` / ``task_id`` the id."""
    instruction = row.get("instruction") or row.get("question") or ""
    task_id = str(row.get("id") or row.get("task_id") or fallback_id)
    return Task(id=task_id, instruction=str(instruction), metadata=dict(row))


async def run_agent_flow(agent_flow: Any, task: Task, config: AgentConfig, executor: Executor | None = None) -> Episode:
    """rLLM's ``run_agent_flow``: ``arun`` where the flow has an async one, else ``run`` in ``executor``."""
    arun = getattr(agent_flow, "arun", None)
    if arun is not None and inspect.iscoroutinefunction(arun):
        result = await arun(task, config)
    else:
        result = await asyncio.get_running_loop().run_in_executor(executor, agent_flow.run, task, config)
    name = getattr(agent_flow, "name", None) or DEFAULT_TRAJECTORY_NAME
    return coerce_to_episode(result, task, name)


def evaluate_episode(evaluator: Any, task: Task, episode: Episode) -> EvalOutput:
    """Score ``episode`` and write the result onto it as rLLM's trainer does: trajectories the
    evaluator gave no reward of their own (``reward`` None here) get the episode's reward and its
    signals; ``is_correct`` and the signals (and numeric metadata) go to the episode.

    The evaluator receives the row (a dict) when it is an ``@evaluator`` function or declares its
    first parameter ``dict`` / ``task_info`` / ``task_data`` (rLLM's convention), else the Task.
    """
    argument = task.metadata if _takes_row(evaluator) else task
    output = coerce_to_eval_output(evaluator.evaluate(argument, episode))
    signals = {signal.name: float(signal.value) for signal in output.signals}
    for trajectory in episode.trajectories:
        if trajectory.reward is None:
            trajectory.reward = float(output.reward)
        if not trajectory.signals:
            trajectory.signals = dict(signals)
    episode.is_correct = bool(output.is_correct)
    numeric = {k: float(v) for k, v in output.metadata.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    episode.metrics.update({**numeric, **signals})
    return output


def _takes_row(evaluator: Any) -> bool:
    if getattr(evaluator, "takes_row", False):
        return True
    try:
        params = list(inspect.signature(evaluator.evaluate).parameters.values())
    except (TypeError, ValueError):
        return False
    if not params:
        return False
    first = params[0]
    annotation = first.annotation
    is_dict = annotation is dict or (isinstance(annotation, str) and annotation.startswith("dict"))
    return is_dict or first.name in ("task_data", "task_info")
