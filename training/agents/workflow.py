"""Workflows: a whole episode written as code, with rLLM's ``Workflow`` API.

A workflow calls the model as often as it likes through
``await self.rollout_engine.get_model_response(messages)``, which returns a ``ModelOutput`` with
the exact token ids and logprobs of the call, and hands back an ``Episode`` of one or more
trajectories (a solver and a judge, say). Every trajectory is trained with its own reward.

The life of one episode, as in rLLM: the rollout engine builds the workflow with
``(rollout_engine=..., executor=..., **workflow_args)`` and calls ``run_with_termination_handling``.
``run`` may return an ``Episode`` (used as it is), or None, or raise ``TerminationEvent``: then
the trajectories it committed with ``commit`` (and those of its agents) are collected and
``postprocess_episode`` computes rewards and correctness. An exception ends the episode with
termination ``error`` and the error's details in ``episode.info["error"]``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import time
import traceback
from abc import ABC, abstractmethod
from collections import defaultdict
from concurrent.futures import Executor
from typing import Any, Callable

from training.types import Action, Episode, ModelOutput, Step, TerminationReason, Trajectory
from training.errors import ModelCallError, TerminationEvent, TrainingFailed
from training.agents.base import BaseAgent, BaseEnv, _resolve_class
from training.agents.turn_loop import Reply, TurnLoop, run_turns
from training.rendering import encode, render_messages


class RolloutEngine:
    """rLLM's interface for calling the model from a workflow: ``await get_model_response(messages)``.

    ``training.rollouts.episode_runner.EpisodeRunner`` (which runs whole episodes) hands each workflow a
    ``training.rollouts.generation.ModelClient``, an implementation of this interface that records every
    call's tokens for training.
    """

    async def get_model_response(self, messages: list[dict], **kwargs: Any) -> ModelOutput:
        raise NotImplementedError(f"{type(self).__name__} does not implement get_model_response.")

    async def wake_up(self) -> None:
        """Called before a batch of rollouts (rLLM's hook; nothing to do here)."""

    async def sleep(self) -> None:
        """Called after a batch of rollouts (rLLM's hook; nothing to do here)."""


class Workflow(ABC):
    """Base class of workflows, with rLLM's constructor and hooks.

    ``gamma`` > 0 turns step rewards into discounted returns; ``reward_bonus_coeff`` > 0 adds a
    shaping bonus for improvement over the previous step (both in ``adjust_step_rewards``).
    ``self.model`` is the same object as ``self.rollout_engine``; its ``chat``/``complete``
    methods return our ``GenerationOutput`` for code written against them.

    ``trajectories_per_episode``: how many trajectories every episode of the class returns, where
    the class knows (1 for rLLM's one-agent workflows, 3 for two solvers and a judge); None when it
    depends on the run. Backends that train one sequence per episode (verl) refuse a class that
    declares more than one when the trainer is built; an undeclared class is refused at its first
    episode of several sequences, since a workflow is code whose trajectories exist only once it runs.
    """

    trajectories_per_episode: int | None = None

    def __init__(
        self,
        rollout_engine: Any = None,
        executor: Executor | None = None,
        timeout: float = 1e6,
        gamma: float = 0.0,
        reward_bonus_coeff: float = 0.0,
        **kwargs: Any,
    ) -> None:
        self.rollout_engine = rollout_engine
        self.executor = executor
        self.timeout = float(timeout)
        self.gamma = gamma
        self.reward_bonus_coeff = reward_bonus_coeff
        self.kwargs = kwargs
        self.uid: str | None = None
        self.task: Any = None
        self._completed_trajectories: list[Trajectory] = []

    @property
    def model(self) -> Any:
        return self.rollout_engine

    @abstractmethod
    async def run(self, task: dict, uid: str, **kwargs: Any) -> Episode | None:
        """Run one episode of ``task``; ``uid`` names it uniquely."""

    async def run_with_termination_handling(self, task: dict, uid: str, **kwargs: Any) -> Episode:
        """``run`` with termination events, the workflow's ``timeout`` and errors turned into an Episode.

        Errors of the model or of the run's watched reward are not the workflow's: they propagate,
        so the run stops instead of counting them as failed episodes.
        """
        self.uid, self.task = uid, task
        try:
            output = await asyncio.wait_for(self.run(task, uid, **kwargs), timeout=self.timeout)
        except TerminationEvent as event:
            return self.postprocess_episode(self.collect_trajectories(), event.reason)
        except TimeoutError:
            return self.postprocess_episode(self.collect_trajectories(), TerminationReason.TIMEOUT)
        except Exception as exc:
            if _stops_the_run(exc):
                raise
            details = {"error_message": str(exc), "error_type": type(exc).__name__, "traceback": traceback.format_exc()}
            return self.postprocess_episode(self.collect_trajectories(), TerminationReason.ERROR, error=details)
        if isinstance(output, Episode):
            return output  # already post-processed by the workflow, as in rLLM
        return self.postprocess_episode(self.collect_trajectories(), TerminationReason.UNKNOWN)

    # -- trajectories --------------------------------------------------------------------------

    def commit(
        self, name: str | None = None, agent: Any = None, trajectory: Trajectory | None = None, reset: bool = False
    ) -> None:
        """Keep a finished trajectory (an agent's, or one given) for training; ``reset`` resets the agent."""
        if (agent is None) == (trajectory is None):
            raise ValueError("commit() takes either agent= or trajectory=, exactly one of them.")
        kept = agent.trajectory if agent is not None else trajectory
        if name:
            kept.name = name
        if kept.steps:
            self._completed_trajectories.append(copy.deepcopy(kept))
        if agent is not None and reset:
            agent.reset()

    def collect_trajectories(self) -> Episode:
        """The committed trajectories, then those of the workflow's agents not committed yet."""
        episode = Episode(trajectories=list(self._completed_trajectories))
        committed = {t.uid for t in self._completed_trajectories}
        for agent in self._attributes_of_type(_base_agent()):
            trajectory = agent.trajectory
            if trajectory.steps and trajectory.uid not in committed:
                episode.trajectories.append(copy.deepcopy(trajectory))
        return episode

    # -- post-processing hooks (rLLM's) --------------------------------------------------------

    def compute_trajectory_reward(self, trajectory: Trajectory) -> None:
        """The trajectory's reward; by default the sum of its step rewards."""
        trajectory.reward = float(sum(step.reward for step in trajectory.steps))

    def adjust_step_rewards(self, trajectory: Trajectory) -> None:
        """Reward shaping (``reward_bonus_coeff``) and discounting (``gamma``) of step rewards.

        Each step's discounted return is also kept in ``step.mc_return``."""
        steps = trajectory.steps
        if self.reward_bonus_coeff > 0.0:
            raw = [step.reward for step in steps]
            for i in range(1, len(steps)):
                steps[i].reward += self.reward_bonus_coeff * (raw[i] - raw[i - 1])
        if self.gamma > 0.0:
            running = 0.0
            for step in reversed(steps):
                running = step.reward + self.gamma * running
                step.reward = step.mc_return = running

    def assign_episode_correctness(self, episode: Episode) -> None:
        """Correct when the trajectories' rewards add up to more than 0."""
        episode.is_correct = sum(t.reward for t in episode.trajectories) > 0

    def collect_metrics(self, episode: Episode) -> None:
        """``<name>_acc``: the mean reward of the trajectories of each name."""
        by_name: dict[str, list[float]] = defaultdict(list)
        for trajectory in episode.trajectories:
            by_name[trajectory.name].append(trajectory.reward)
        episode.metrics = {f"{name}_acc": sum(values) / len(values) for name, values in by_name.items()}

    def postprocess_episode(
        self, episode: Episode, termination_reason: TerminationReason | None = None, error: dict | None = None
    ) -> Episode:
        """Fill in the episode: id and task, trajectory rewards, step rewards, correctness, metrics."""
        episode.id = self.uid if self.uid is not None else episode.id
        episode.task = self.task
        for trajectory in episode.trajectories:
            # Ended between update_from_env and update_from_model: the last step has no model call.
            if trajectory.steps and not trajectory.steps[-1].chat_completions:
                trajectory.steps.pop()
            self.compute_trajectory_reward(trajectory)
            if len(trajectory.steps) > 1:
                self.adjust_step_rewards(trajectory)
        self.assign_episode_correctness(episode)
        self.collect_metrics(episode)
        if error is not None:
            episode.info["error"] = error
        episode.termination_reason = termination_reason or TerminationReason.UNKNOWN
        return episode

    # -- agents, environments and threads ------------------------------------------------------

    def reset(self, task: dict | None = None, uid: str | None = None) -> None:
        """Start a new episode: remember the task, forget committed trajectories, reset every
        agent and environment held in the workflow's attributes."""
        self.uid, self.task = uid, task
        self._completed_trajectories = []
        for agent in self._attributes_of_type(_base_agent()):
            agent.reset()
            agent.trajectory.task = task
        for env in self._attributes_of_type(_base_env()):
            env.reset(task=task)

    def is_multithread_safe(self) -> bool:
        return all(env.is_multithread_safe() for env in self._attributes_of_type(_base_env()))

    async def run_in_executor(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run blocking ``fn`` in the workflow's thread pool (the loop's default one if it has none)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def _attributes_of_type(self, cls: type) -> list[Any]:
        return [value for name, value in vars(self).items() if not name.startswith("_") and isinstance(value, cls)]


def _base_agent() -> type:
    return BaseAgent


def _base_env() -> type:
    return BaseEnv


def _stops_the_run(exc: BaseException) -> bool:
    return isinstance(exc, (ModelCallError, TrainingFailed))


class SimpleWorkflow(Workflow):
    """rLLM's one-call workflow (``rllm.workflows.simple_workflow.SimpleWorkflow``): the task's
    ``messages``, ``question``, ``prompt`` or ``problem`` (the first present) goes to the model once,
    and ``reward_function(task, Action(reply))`` scores the reply. Ends ``env_done``, or
    ``max_response_length`` when the reply ran out of tokens."""

    TASK_KEYS = ("messages", "question", "prompt", "problem")

    trajectories_per_episode = 1

    def __init__(self, rollout_engine: Any = None, reward_function: Callable | None = None, **kwargs: Any) -> None:
        super().__init__(rollout_engine, **kwargs)
        if reward_function is None:
            raise ValueError("SimpleWorkflow needs workflow_args={'reward_function': fn}, fn(task, action) -> RewardOutput.")
        self.reward_function = reward_function

    async def run(self, task: dict, uid: str, **kwargs: Any) -> Episode | None:
        self.reset(task, uid)
        key = next((k for k in self.TASK_KEYS if task.get(k) is not None), None)
        if key is None:
            raise ValueError(f"SimpleWorkflow: the task has none of {', '.join(self.TASK_KEYS)}; its fields are {sorted(task)}.")
        messages = list(task[key]) if key == "messages" else [{"role": "user", "content": task[key]}]
        output: ModelOutput = await self.rollout_engine.get_model_response(messages, application_id=uid, **kwargs)
        action = Action(action=output.content)
        scored = self.reward_function(task, action)
        reply = {"role": "assistant", "content": output.content, "reasoning": output.reasoning}
        step = Step(chat_completions=messages + [reply], thought=output.reasoning, action=action, reward=scored.reward, model_output=output)
        self.commit(trajectory=Trajectory(steps=[step]))
        ran_out = output.finish_reason == "length"
        raise TerminationEvent(TerminationReason.MAX_RESPONSE_LENGTH if ran_out else TerminationReason.ENV_DONE)


class _WorkflowTurnLoop(TurnLoop):
    """The turn loop keeping each reply's ``ModelOutput`` on the step the agent made of it (so its
    tokens need no matching by text)."""

    def record(self, step: Step, reply: Reply) -> None:
        if step.model_output is None:
            step.model_output = reply.output


class _AgentEnvWorkflow(Workflow):
    """What rLLM's agent-plus-environment workflows share: the agent and environment built from
    ``agent_cls(**agent_args)`` and ``env_cls(**env_args)`` (classes or import paths), environment
    calls in the workflow's executor, and the episode's time spent in the model and the
    environment in ``episode.info["timing"]`` (rLLM's ``TimingTrackingMixin``)."""

    trajectories_per_episode = 1

    def __init__(
        self,
        agent_cls: type | str,
        env_cls: type | str,
        agent_args: dict | None = None,
        env_args: dict | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)

        agent_cls = _resolve_class(agent_cls, BaseAgent, "agent_cls")
        env_cls = _resolve_class(env_cls, BaseEnv, "env_cls")
        self.agent = agent_cls(**dict(agent_args or {}))
        self.env = env_cls(**dict(env_args or {}))
        self._timing = {"llm_time": 0.0, "env_time": 0.0}
        self._started = time.perf_counter()

    def reset(self, task: dict | None = None, uid: str | None = None) -> tuple[Any, dict]:
        """rLLM's: reset the agent and environment for ``task`` and return the environment's
        ``(observation, info)``."""
        super().reset(task, uid)
        self._timing = {"llm_time": 0.0, "env_time": 0.0}
        self._started = time.perf_counter()
        return self.env.reset(task)

    async def _env_call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.run_in_executor(fn, *args, **kwargs)
        finally:
            self._timing["env_time"] += time.perf_counter() - started

    async def _model_call(self, **kwargs: Any) -> ModelOutput:
        """The model's answer to the agent's conversation, kept on the agent's latest step once
        ``update_from_model`` has made it (so its tokens need no matching by text)."""
        started = time.perf_counter()
        try:
            return await self.rollout_engine.get_model_response(self.agent.chat_completions, application_id=self.uid, **kwargs)
        finally:
            self._timing["llm_time"] += time.perf_counter() - started

    async def _play(self, task: dict, uid: str, respond: Callable[[TurnLoop], Any], max_steps: int) -> None:
        """The episode, played by the one turn loop (``training.agents.turn_loop``): the agent's
        action goes to the environment as the ``Action`` itself (rLLM's environments unwrap it),
        the environment stays the workflow's (not closed), and the way it ended is raised as a
        ``TerminationEvent``. ``respond(loop)`` is the model's side of a turn."""
        loop = _WorkflowTurnLoop(self.agent, self.env, max_steps=max_steps, timeout=self.timeout,
                                 call_env=self._env_call, hand_action=True, owns_env=False)
        reason = await run_turns(loop, lambda _messages: respond(loop), reset=functools.partial(self.reset, task=task, uid=uid))
        raise TerminationEvent(reason)

    def postprocess_episode(
        self, episode: Episode, termination_reason: TerminationReason | None = None, error: dict | None = None
    ) -> Episode:
        episode = super().postprocess_episode(episode, termination_reason, error)
        episode.info["timing"] = {**self._timing, "total_time": time.perf_counter() - self._started}
        for trajectory in episode.trajectories:
            trajectory.info["num_steps"] = len(trajectory.steps)
        return episode


class SingleTurnWorkflow(_AgentEnvWorkflow):
    """rLLM's ``rllm.workflows.single_turn_workflow.SingleTurnWorkflow``: one model call per episode.

    The environment's first observation goes to the agent, the agent's conversation to the model,
    the agent's action to the environment, whose reward scores the step. Ends
    ``max_response_length`` when the reply ran out of tokens, else ``env_done`` when the
    environment said done, else ``max_turns``::

        AgentTrainer(workflow_class=SingleTurnWorkflow,
                     workflow_args={"agent_cls": MathAgent, "env_cls": SingleTurnEnvironment,
                                    "env_args": {"reward_fn": math_reward_fn}}, ...)
    """

    async def run(self, task: dict, uid: str, **kwargs: Any) -> Episode | None:
        async def respond(loop: TurnLoop) -> Reply:
            output = await self._model_call(skip_special_tokens=True, **kwargs)
            return Reply(output.text, out_of_budget=output.finish_reason == "length", output=output)

        await self._play(task, uid, respond, max_steps=1)


class CumulativeWorkflow(_AgentEnvWorkflow):
    """rLLM's ``rllm.workflows.cumulative_workflow.CumulativeWorkflow``: up to ``max_steps`` turns
    of one growing conversation, under one response budget for the whole episode.

    Each turn the model answers the agent's whole conversation; what the conversation grew by
    since the first prompt (replies and observations) counts against the rollout engine's
    ``max_response_length`` (``data.max_response_length``), and a turn's reply may use only what is
    left. Ends ``max_response_length`` when nothing is left or a reply ran out of tokens,
    ``env_done`` when the environment said done, ``max_turns`` after ``max_steps`` turns.
    """

    def __init__(self, agent_cls: type | str, env_cls: type | str, agent_args: dict | None = None,
                 env_args: dict | None = None, max_steps: int = 5, **kwargs: Any) -> None:
        super().__init__(agent_cls, env_cls, agent_args, env_args, **kwargs)
        if int(max_steps) < 1:
            raise ValueError(f"CumulativeWorkflow: max_steps must be at least 1, got {max_steps!r}.")
        self.max_steps = int(max_steps)
        self.prompt_length = 0

    def reset(self, task: dict | None = None, uid: str | None = None) -> tuple[Any, dict]:
        self.prompt_length = 0
        return super().reset(task, uid)

    def _prompt_length(self) -> int:
        tokenizer = self.rollout_engine.tokenizer
        return len(encode(tokenizer, render_messages(tokenizer, self.agent.chat_completions)))

    async def run(self, task: dict, uid: str, **kwargs: Any) -> Episode | None:
        budget = getattr(self.rollout_engine, "max_response_length", None)

        async def respond(loop: TurnLoop) -> Reply:
            max_tokens = None
            if budget is not None:
                prompt_length = self._prompt_length()
                if loop.turns == 0:
                    self.prompt_length = prompt_length
                max_tokens = budget - (prompt_length - self.prompt_length)
                if max_tokens <= 0:
                    raise TerminationEvent(TerminationReason.MAX_RESPONSE_LENGTH)
            output = await self._model_call(
                accumulate_reasoning=True, enforce_max_prompt_length=False, max_tokens=max_tokens, **kwargs
            )
            return Reply(output.text, out_of_budget=output.finish_reason == "length", output=output)

        await self._play(task, uid, respond, max_steps=self.max_steps)

