"""rLLM's SDK views of an episode's model calls: ``session()``, ``@trajectory``, ``StepView``, ``TrajectoryView``.

Inside ``with session() as sess:`` every call made with a ``get_chat_client()`` client is
recorded for ``sess.steps``: one ``StepView`` per call, whose ``reward`` and ``action`` the code
sets. A run function may return a list of ``TrajectoryView`` built from them (rLLM's
solver-judge does); each becomes one named trajectory of the episode, trained with its rewards.
Outside a training episode calls are not recorded and ``sess.steps`` stays empty.
"""

from __future__ import annotations

import functools
import inspect
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from training.agents.sdk.client import active_session, current_episode
from training.types import Episode, Step, Trajectory

CALL_ID = "call_id"  # Step.info key: the id of a recorded call, which its StepView carries
SESSION_UIDS = "session_uids"  # Step.info key: the sessions the call was made in


@dataclass
class StepView:
    """One model call: ``input`` ``{"messages": [...]}``, ``output`` the chat completion (OpenAI's
    shape), and the ``reward`` and ``action`` the code assigns."""

    id: str
    input: Any = None
    output: Any = None
    action: Any = None
    reward: float = 0.0
    metadata: dict | None = None


@dataclass
class TrajectoryView:
    """Calls that form one trajectory, with its reward (``input``/``output``: the arguments and
    return value of a ``@trajectory`` function)."""

    name: str = "agent"
    steps: list[StepView] = field(default_factory=list)
    reward: float = 0.0
    input: dict | None = None
    output: Any = None
    metadata: dict | None = None

    @property
    def result(self) -> Any:
        return self.output


class Session:
    """The model calls made inside its ``with`` block (nested sessions see their inner calls too)."""

    def __init__(self, **metadata: Any) -> None:
        self.uid = secrets.token_hex(8)
        self.name = self.uid
        self.metadata = metadata
        self._views: dict[str, StepView] = {}
        self._block: Any = None

    def __enter__(self) -> "Session":
        self._block = active_session(self.uid)
        self._block.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._block.__exit__(*exc_info)

    @property
    def llm_calls(self) -> list[Step]:
        """The recorded calls (our ``Step``, with their token ids) made in this session."""
        episode = current_episode()
        calls = episode.calls if episode is not None else []
        return [step for step in list(calls) if self.uid in step.info.get(SESSION_UIDS, ())]

    @property
    def steps(self) -> list[StepView]:
        """One ``StepView`` per call; the same object each time, so rewards set on it stay."""
        views = []
        for step in self.llm_calls:
            call_id = step.info[CALL_ID]
            if call_id not in self._views:
                self._views[call_id] = _view_of(step, self.metadata)
            views.append(self._views[call_id])
        return views

    def __len__(self) -> int:
        return len(self.llm_calls)


def session(**metadata: Any) -> Session:
    """rLLM's ``session(**metadata)``: track the calls made inside the ``with`` block."""
    if "name" in metadata:
        raise ValueError("session(): name is generated; pass other metadata.")
    return Session(**metadata)


def trajectory(name: str = "agent", **metadata: Any) -> Callable[[Callable], Callable]:
    """rLLM's ``@trajectory(name)``: the decorated function returns a ``TrajectoryView`` of the
    calls it made (reward 0 until the code sets it), its return value in ``output``."""

    def decorator(func: Callable) -> Callable:
        signature = inspect.signature(func)

        def view(sess: Session, args: tuple, kwargs: dict, result: Any) -> TrajectoryView:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return TrajectoryView(name=name, steps=sess.steps, input=dict(bound.arguments), output=result,
                                  metadata=metadata or None)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> TrajectoryView:
                with session(trajectory_name=name, **metadata) as sess:
                    result = await func(*args, **kwargs)
                return view(sess, args, kwargs, result)

            return run_async

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> TrajectoryView:
            with session(trajectory_name=name, **metadata) as sess:
                result = func(*args, **kwargs)
            return view(sess, args, kwargs, result)

        return run

    return decorator


def episode_from_views(views: list[TrajectoryView], calls: list[Step]) -> Episode:
    """The episode a run function's ``list[TrajectoryView]`` describes: one trajectory per view
    with the recorded calls (token ids included) it names, their rewards and actions. A trajectory
    whose own reward was left at 0 while its steps were rewarded earns the sum of its steps'."""
    if not views:
        raise ValueError("agent_run_func returned an empty list; return a reward or at least one TrajectoryView.")
    by_id = {step.info.get(CALL_ID): step for step in calls}
    trajectories = []
    for view in views:
        steps = []
        for step_view in view.steps:
            step = by_id.get(step_view.id)
            if step is None:
                raise ValueError(
                    f"TrajectoryView {view.name!r} holds step {step_view.id!r}, which is no model call of this "
                    "episode; build trajectories from session().steps or @trajectory."
                )
            step.reward, step.action = float(step_view.reward), step_view.action
            steps.append(step)
        reward = float(view.reward) or float(sum(step.reward for step in steps))
        trajectories.append(Trajectory(name=view.name, steps=steps, reward=reward))
    # As rLLM counts it: solved when the last trajectory (the judge's, in solver-judge) earns >= 1.
    return Episode(trajectories=trajectories, is_correct=trajectories[-1].reward >= 1.0)


def _view_of(step: Step, metadata: dict) -> StepView:
    message = {"role": "assistant", "content": step.model_response}
    output = {
        "choices": [{"index": 0, "message": message, "token_ids": list(step.response_ids)}],
        "prompt_token_ids": list(step.prompt_ids),
    }
    return StepView(id=step.info[CALL_ID], input={"messages": step.chat_completions}, output=output,
                    metadata=dict(metadata) or None)
