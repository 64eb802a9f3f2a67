"""The agent + environment turn loop, written once for every runner.

``env.reset`` -> ``agent.update_from_env`` -> the model answers ``agent.chat_completions`` ->
``agent.update_from_model`` -> ``env.step`` -> ``agent.update_from_env`` -> ... until a rule ends
the episode. ``TurnLoop`` is that loop as a step machine: ``start()``, then ``turn(reply)`` for
each model reply, each returning why the episode ended (or None while it goes on), and
``close()``. ``run_turns(loop, respond)`` drives it where our code calls the model (the episode
runner, rLLM's ``AgentExecutionEngine``, the agent + environment workflows); ms-swift's
multi-turn scheduler, where ms-swift calls the model, calls the steps itself.

The rules, in the order they win:

1. ``error``: the agent or the environment raised. The loop records it (``error``,
   ``traceback``) and the exception goes on to the driver, which retries or reports it.
2. ``timeout``: ``timeout`` seconds after the loop was made, a model call or an environment call
   still running is cut (``cut`` names it; the call's thread, if any, is abandoned).
3. ``max_response_length``: the driver says the reply used up the episode's response budget
   (``Reply.out_of_budget``), or ends the episode before a call with
   ``TerminationEvent(MAX_RESPONSE_LENGTH)`` when no budget is left. Budget beats ``env_done``:
   a reply cut for room is flagged even when the environment then said done.
4. ``env_done``: the environment said done.
5. ``max_turns``: ``max_steps`` turns were played.
6. ``timeout``: a turn that could not be cut (an environment call on the event loop) ended past it.

An episode that times out or fails scores 0 (``reward``). Before a model call the driver may end the episode by raising ``TerminationEvent`` (a first
prompt over ``max_prompt_length``, no response budget left): the loop ends with its reason.

The loop lives on the agents' floor because rLLM's agent + environment workflows
(``training.agents.workflow``) drive it as well as the runners above them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator

from training.errors import TerminationEvent
from training.log import logger
from training.types import Action, Step, TerminationReason

EnvCall = Callable[..., Awaitable[Any]]


async def call_inline(fn: Callable, *args: Any) -> Any:
    """Run an environment call on the event loop itself (an environment that is not thread safe)."""
    return fn(*args)


@dataclass
class Reply:
    """The model's answer to one turn, as a driver hands it to ``TurnLoop.turn``.

    ``out_of_budget``: the reply stopped because the episode's response budget ran out (not merely
    a per-turn cap). ``output``: the driver's own record of the call (token ids, ``ModelOutput``),
    given to ``TurnLoop.record`` with the step the agent made of the reply."""

    text: str
    out_of_budget: bool = False
    output: Any = None


class TurnLoop:
    """One episode of ``agent`` in ``env``.

    ``max_steps``: turns at most (None: no limit). ``timeout``: seconds for the whole episode from
    now (None: no limit). ``call_env(fn, *args)``: how environment calls run (inline by default;
    a driver with a thread pool runs them there, where a hung call can be abandoned).
    ``hand_action``: give ``env.step`` the agent's ``Action`` itself (rLLM's workflows do, and its
    environments unwrap it) instead of its ``action`` field. ``owns_env``: ``close()`` closes the
    environment (a workflow keeps its environment across episodes, so it does not).
    """

    def __init__(
        self,
        agent: Any,
        env: Any,
        *,
        max_steps: int | None = None,
        timeout: float | None = None,
        call_env: EnvCall = call_inline,
        hand_action: bool = False,
        owns_env: bool = True,
    ) -> None:
        self.agent, self.env = agent, env
        self.max_steps, self.timeout = max_steps, timeout
        self.call_env, self.hand_action, self.owns_env = call_env, hand_action, owns_env
        self.started = time.monotonic()
        self.turns = 0
        self.generation_seconds: float | None = None  # the last model call's
        self.total_reward = 0.0
        self.info: dict = {}
        self.reason: TerminationReason | None = None
        self.cut: str | None = None  # "model" or "env": the call the timeout cut while it ran
        self.error: str | None = None
        self.traceback = ""

    # -- the steps ---------------------------------------------------------------------------

    async def start(self, reset: Callable[[], tuple[Any, dict]] | None = None) -> None:
        """Reset the agent and the environment (``reset``, where the driver resets it its own way)
        and hand the agent the first observation."""
        with self.failures():
            self.agent.reset()
            observation, info = await self._timed(self.call_env(reset or self.env.reset), "env")
            if self.reason is not None:
                return
            self.info = info or {}
            self.agent.update_from_env(observation, 0.0, False, self.agent_info(self.info))

    @property
    def messages(self) -> list[dict]:
        """The conversation the model answers next."""
        return self.agent.chat_completions

    async def ask(self, respond: Callable[[list[dict]], Awaitable[Reply]]) -> Reply | None:
        """The model's reply to the conversation, or None when the episode ended instead: the turn
        limit was already reached, the driver raised ``TerminationEvent``, or the timeout cut the call."""
        if self.max_steps is not None and self.turns >= self.max_steps:
            self.end(TerminationReason.MAX_TURNS)
            return None
        try:
            started = time.perf_counter()
            reply = await self._timed(respond(self.messages), "model")
            self.generation_seconds = time.perf_counter() - started
            return reply
        except TerminationEvent as event:
            self.end(event.reason)
            return None

    async def turn(self, reply: Reply) -> TerminationReason | None:
        """The agent takes the reply, the environment answers its action, the agent takes the
        answer; returns why the episode ended, or None when it goes on."""
        with self.failures():
            self.turns += 1
            action = self.agent.update_from_model(reply.text)
            acted: Step | None = self.agent.get_current_state()
            if acted is not None:
                self.record(acted, reply)
            if not self.hand_action and isinstance(action, Action):
                action = action.action
            started = time.perf_counter()
            answer = await self._timed(self.call_env(self.env.step, action), "env")
            env_seconds = time.perf_counter() - started
            if self.reason is not None:  # the step was cut at the timeout
                return self.reason
            observation, reward, done, info = answer
            if acted is not None:
                acted.next_observation = observation
            self.total_reward += float(reward)
            self.info = info or {}
            self.agent.update_from_env(observation, reward, done, self.agent_info(self.info))
            if acted is not None:  # the turn's times (the episode store keeps them), after the agent's update set its info
                acted.info = {**(acted.info or {}), "generation_seconds": self.generation_seconds, "env_seconds": env_seconds}
            self.observed(acted, reward, done, self.info)
        if reply.out_of_budget:
            return self.end(TerminationReason.MAX_RESPONSE_LENGTH)
        if done:
            return self.end(TerminationReason.ENV_DONE)
        if self.max_steps is not None and self.turns >= self.max_steps:
            return self.end(TerminationReason.MAX_TURNS)
        if self.time_left() == 0.0:
            return self.end(TerminationReason.TIMEOUT)
        return None

    def end(self, reason: TerminationReason) -> TerminationReason:
        """End the episode with ``reason`` (the first reason given stays)."""
        if self.reason is None:
            self.reason = reason
        return self.reason

    @contextlib.contextmanager
    def failures(self) -> Iterator[None]:
        """A context in which an exception of agent or environment code is recorded as the loop's
        error (``reason`` error, ``error``, ``traceback``) and then goes on to the caller."""
        try:
            yield
        except TerminationEvent:
            raise
        except Exception as exc:
            self.end(TerminationReason.ERROR)
            self.error = f"{type(exc).__name__}: {exc}"
            self.traceback = "".join(traceback.format_exception(exc))
            raise

    def close(self) -> None:
        """Close the environment the loop owns; a ``close()`` that raises does not change the episode."""
        if not self.owns_env or self.env is None:
            return
        try:
            self.env.close()
        except Exception:
            logger.exception("env.close() raised; ignored")

    # -- what drivers may add ----------------------------------------------------------------

    def record(self, step: Step, reply: Reply) -> None:
        """Keep what the driver knows of the call on the step the agent made of it (token ids)."""

    def agent_info(self, info: dict) -> dict:
        """The ``info`` the agent is given with each observation."""
        return info

    def observed(self, step: Step | None, reward: float, done: bool, info: dict) -> None:
        """Called after the agent took the environment's answer to ``step``; may ``end`` the episode."""

    async def finish(self) -> None:
        """Called once the episode has ended without an error, before the environment is closed."""

    # -- what the episode came to ------------------------------------------------------------

    @property
    def reward(self) -> float:
        """The sum of the environment's rewards; 0 for an episode that timed out or failed."""
        return 0.0 if self.reason in (TerminationReason.TIMEOUT, TerminationReason.ERROR) else self.total_reward

    @property
    def is_correct(self) -> bool:
        """The environment's ``info["is_correct"]`` where it gives one; else only an episode the
        environment ended with a positive reward counts as solved (a shaped reward gathered until
        the turn limit does not)."""
        return bool(self.info.get("is_correct", self.reason == TerminationReason.ENV_DONE and self.reward > 0))

    def time_left(self) -> float | None:
        if self.timeout is None:
            return None
        return max(0.0, self.timeout - (time.monotonic() - self.started))

    # -- inside ------------------------------------------------------------------------------

    async def _timed(self, call: Awaitable[Any], what: str) -> Any:
        """``call`` (of the model or the environment: ``what``), cut when the episode's time is up
        (the loop then ends with ``timeout``)."""
        left = self.time_left()
        if left is None:
            return await call
        deadline = asyncio.timeout(left)
        try:
            async with deadline:
                return await call
        except TimeoutError:
            if not deadline.expired():  # the call's own TimeoutError: an error like any other
                raise
            self.cut = what
            self.end(TerminationReason.TIMEOUT)
            return None

async def run_turns(loop: TurnLoop, respond: Callable[[list[dict]], Awaitable[Reply]],
                    reset: Callable[[], tuple[Any, dict]] | None = None) -> TerminationReason:
    """Play ``loop`` to its end, ``respond(messages)`` calling the model each turn; closes the
    environment the loop owns. ``respond`` may raise ``TerminationEvent`` to end the episode
    before the call (a prompt too long, no response budget left)."""
    try:
        await loop.start(reset)
        while loop.reason is None:
            reply = await loop.ask(respond)
            if reply is not None:
                await loop.turn(reply)
        await loop.finish()
        return loop.reason
    finally:
        loop.close()
