"""Rollouts: run many episodes of an agent at once and record them as token-level Episodes.

Every kind of agent (agent + environment, workflow, run function, single-turn prompt) ends up as
an ``Episode`` whose ``prompt_ids`` + ``response_ids`` are exactly the tokens the model saw and
wrote, with ``response_mask`` 1 on the model's tokens and 0 on text that came from elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import inspect
import statistics
import threading
import time
import traceback
from typing import Any, Callable

from training.config import secrets
from training.agents.base import build_agent, build_env
from training.agents.spec import AgentSpec
from training.config import Config
from training.rollouts.outcomes import reward_component_means
from training.rollouts.generation import GenerationOutput, ModelClient, TokenGenerator, continuation
from training.rendering import encode, render_messages, retokenization_drift
from training.errors import ModelCallError, NoModelCall, TerminationEvent, TrainingFailed
from training.log import logger
from training.agents.sdk.client import in_episode
from training.agents.sdk.run_func import call_arguments, no_model_call_message, result_of
from training.threads import DaemonThreadExecutor
from training.types import AgentConfig, Episode, RewardOutput, Step, TerminationReason, Trajectory
from training.agents.flow import evaluate_episode, run_agent_flow, task_from_row
from training.agents.turn_loop import Reply, TurnLoop, call_inline, run_turns

RewardFn = Callable[[dict, str], RewardOutput]


_episode_loops = threading.local()


def run_on_episode_loop(coro: Any) -> Any:
    """Run ``coro`` on this thread's long-lived event loop, the one every batch of episodes of a run
    uses, as rLLM's engines keep one loop for a run.

    A fresh ``asyncio.run`` per batch broke agent code that keeps async clients: an ``AsyncOpenAI``
    client a flow never closed is closed by its ``__del__`` on whatever loop runs when it is
    collected, so one collected during a later batch tried to close sockets of a loop already
    closed ("Task exception was never retrieved ... RuntimeError: Event loop is closed"). On one
    loop its sockets are still that loop's. ``close_episode_loop`` ends it."""
    runner = getattr(_episode_loops, "runner", None)
    if runner is None:
        runner = _episode_loops.runner = asyncio.Runner()
    return runner.run(coro)


async def _settle(timeout: float = 5.0) -> None:
    gc.collect()  # clients nobody closed schedule their aclose() on this loop now, while it runs
    pending = asyncio.all_tasks() - {asyncio.current_task()}
    if pending:
        await asyncio.wait(pending, timeout=timeout)


def close_episode_loop() -> None:
    """Let what the episodes left behind (unclosed clients) finish on this thread's episode loop,
    then close it. The next ``run_on_episode_loop`` starts a new one."""
    runner = getattr(_episode_loops, "runner", None)
    if runner is None:
        return
    _episode_loops.runner = None
    try:
        runner.run(_settle())
    finally:
        runner.close()


class _GuardedGenerator:
    """Marks the generator's exceptions as ``ModelCallError`` so they are not mistaken for agent bugs."""

    def __init__(self, inner: TokenGenerator) -> None:
        self.inner = inner

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        try:
            return await self.inner.generate(prompt_ids, max_new_tokens)
        except Exception as exc:
            raise ModelCallError(f"Generation failed: {exc!r}") from exc


class EpisodeRunner:
    """Runs episodes of one ``AgentSpec`` (already validated) against a token generator.

    (rLLM's ``RolloutEngine``, the model interface a workflow calls, is ``training.RolloutEngine``;
    this class runs whole episodes and hands each workflow an implementation of it.)

    Rewards: agent+env episodes earn the sum of the environment's rewards (``reward_fn`` is not
    used for them). Workflows and run functions supply their own reward; where they give none,
    ``reward_fn(task, last_response)`` decides. Single-turn tasks are always scored by ``reward_fn``.

    Episodes that end early: ``max_prompt_length`` (first prompt too long) has no tokens and reward 0;
    ``timeout`` and ``error`` keep the tokens gathered so far and get reward 0.
    """

    def __init__(
        self,
        spec: AgentSpec,
        generator: TokenGenerator,
        tokenizer: Any,
        config: Config,
        reward_fn: RewardFn | None = None,
        endpoint: Any = None,
        is_validation: bool = False,
    ) -> None:
        """``endpoint``: the run's ``training.rollouts.chat_endpoint.ChatEndpoint``, through which rLLM-style
        ``fn(**task)`` run functions and AgentFlows reach the model; without one, ``run_episodes``
        serves one for its own duration. ``is_validation`` is what an AgentFlow's
        ``config.is_validation`` says."""
        if spec.kind == "single_turn" and reward_fn is None:
            raise ValueError("A single-turn task needs a reward function to score the model's answer; pass reward_fn.")
        self.spec = spec
        self.generator = _GuardedGenerator(generator)
        self._session = getattr(generator, "session", contextlib.nullcontext)
        self.tokenizer = tokenizer
        self.config = config
        self.reward_fn = reward_fn
        self.loop_config = config.rllm.agent
        self.endpoint = endpoint
        self.is_validation = is_validation
        self._executor: DaemonThreadExecutor | None = None

    def run(self, tasks: list[dict], n: int = 1) -> list[Episode]:
        """Synchronous ``run_episodes``, for code that is not already inside an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_on_episode_loop(self.run_episodes(tasks, n))
        raise RuntimeError(
            "EpisodeRunner.run() was called inside a running event loop; use `await engine.run_episodes(...)`."
        )

    async def run_episodes(self, tasks: list[dict], n: int = 1) -> list[Episode]:
        """``n`` episodes per task, all run concurrently (at most ``rllm.agent.n_parallel_tasks`` at
        a time), returned group-major: task 0 x n, then task 1 x n, and so on."""
        parallel = self.config.rllm.n_parallel_tasks
        semaphore = asyncio.Semaphore(parallel)

        async def limited(task: dict) -> Episode:
            async with semaphore:
                with self._session():
                    return await self._run_episode(task)

        # Blocking user code runs in threads nobody waits for (see DaemonThreadExecutor); workflows
        # get the same executor as rLLM's ``executor`` (``Workflow.run_in_executor``).
        self._executor = DaemonThreadExecutor()
        try:
            with self._chat_endpoint():
                return list(await asyncio.gather(*(limited(task) for task in tasks for _ in range(n))))
        finally:
            self._executor.shutdown(wait=False)

    async def _in_thread(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``asyncio.to_thread`` on the runner's executor: the call sees the caller's context variables
        (the episode's endpoint URL), and a call that never returns does not hold up the run."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    @contextlib.contextmanager
    def _chat_endpoint(self):
        """Serve the OpenAI-compatible endpoint for these episodes when the run has none open."""
        if not self.spec.uses_endpoint or self.endpoint is not None:
            yield
            return
        from training.rollouts.chat_endpoint import ChatEndpoint  # brings in starlette: imported on first use

        with ChatEndpoint(tokenizer=self.tokenizer) as self.endpoint:
            try:
                yield
            finally:
                self.endpoint = None

    async def _run_episode(self, task: dict) -> Episode:
        """One episode with retries on agent/env errors and the per-attempt timeout."""
        cfg = self.loop_config
        retries = self.config.rllm.retries
        for attempt in range(1, retries + 2):
            started = time.perf_counter()
            episode = Episode(task=task)
            client = ModelClient(self.generator, self.tokenizer, cfg.max_tokens_per_turn, self.config.data.max_response_length)
            deadline = asyncio.timeout(cfg.trajectory_timeout)
            failure: Exception | None = None
            try:
                async with deadline:
                    episode = await self._attempt(episode, task, client)
            except (ModelCallError, TrainingFailed):  # a broken model or reward: retrying cannot help
                raise
            except Exception as exc:  # user code (agent, env, workflow, reward) can raise anything
                if isinstance(exc, TimeoutError) and deadline.expired():
                    logger.warning("Episode timed out after %.1f s", cfg.trajectory_timeout)
                    self._end_early(episode, client, TerminationReason.TIMEOUT)
                else:
                    failure = exc
            if failure is not None:
                message = _one_line(failure)
                if attempt <= retries:
                    logger.warning("Episode attempt %d failed (%s); retrying", attempt, message)
                    continue
                logger.warning("Episode failed after %d attempt(s): %s", attempt, message)
                if isinstance(failure, _WorkflowFailed):  # keep what the workflow collected
                    episode, trace = failure.episode, failure.traceback
                else:
                    trace = "".join(traceback.format_exception(failure))
                self._end_early(episode, client, TerminationReason.ERROR)
                episode.error = message
                episode.info["traceback"] = trace
            episode.info["attempts"] = attempt
            episode.metrics = {
                **episode.metrics,
                "turns": float(episode.metrics.get("turns", len(client.steps))),
                "response_length": float(sum(episode.response_mask)),
                "episode_time": time.perf_counter() - started,
            }
            checked = self._retokenization(episode, task) if failure is None else None
            if checked is not None:
                episode.info["retokenization"] = checked
            return episode
        raise AssertionError("unreachable: the last attempt always returns")

    def _retokenization(self, episode: Episode, task: dict) -> dict[str, Any] | None:
        """Whether rendering the finished conversation again (its last model call's messages and reply)
        gives back the ids generated: ``{"drift": bool, "position": first differing position or None}``
        (``training.rendering.retokenization_drift``); None where it was not checked (no response, no
        conversation recorded, no chat template for a conversation, a template that fails on it).
        One render and one encoding per episode."""
        trained = [t for t in episode.trajectories if any(step.response_ids for step in t.steps)]
        steps = (trained[0] if trained else episode.trajectories[-1]).steps if episode.trajectories else []
        if not episode.response_ids or not steps or not steps[-1].chat_completions:
            return None
        last = steps[-1]
        prompt = task.get(self.config.data.prompt_key) if isinstance(task, dict) else None
        plain = self.spec.kind == "single_turn" and isinstance(prompt, str)  # as the prompt went to the model
        if not plain and not getattr(self.tokenizer, "chat_template", None):
            return None  # no template to render the conversation with
        messages = list(last.chat_completions)
        # An agent's step may hold its reply already (rLLM's agents append it before the step is made).
        if not (messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant"):
            messages.append({"role": "assistant", "content": last.model_response})
        try:
            position = retokenization_drift(self.tokenizer, messages, episode.prompt_ids + episode.response_ids,
                                            template=not plain)
        except Exception as exc:  # noqa: BLE001 (a model's chat template is its own code; the check is advisory)
            logger.debug("retokenization check skipped: %s", _one_line(exc))
            return None
        return {"drift": position is not None, "position": position}

    async def _attempt(self, episode: Episode, task: dict, client: ModelClient) -> Episode:
        kind = self.spec.kind
        if kind == "agent_env":
            if await self._run_agent_env(episode, task) == TerminationReason.TIMEOUT:
                self._end_early(episode, client, TerminationReason.TIMEOUT)
            return episode
        if kind == "workflow":
            return await self._run_workflow(episode, task, client)
        if kind == "run_func":
            return self._finish_client_episode(episode, task, client, await self._call_run_func(task, client))
        if kind == "agent_flow":
            return self._finish_client_episode(episode, task, client, await self._run_agent_flow(episode, task, client))
        await self._run_single_turn(episode, task)
        return episode

    # -- agent + environment ------------------------------------------------------------------

    async def _run_agent_env(self, episode: Episode, task: dict) -> TerminationReason:
        """The agent + environment episode, played by the one turn loop (``training.agents.turn_loop``).
        Generation continues from the episode's own token ids rather than a re-tokenised
        conversation, so each turn's logprobs hold for exactly the tokens trained on."""
        spec, cfg = self.spec, self.loop_config
        agent = build_agent(spec.agent_class, spec.agent_args)
        env = build_env(spec.env_class, task, spec.env_args)  # from here on the loop closes it
        call_env = self._in_thread if spec.env_class.is_multithread_safe() else call_inline
        loop = _TokenTurnLoop(agent, env, max_steps=cfg.max_steps, timeout=cfg.trajectory_timeout, call_env=call_env)
        try:
            reason = await run_turns(loop, _TokenTurns(self, episode).respond)
        finally:  # what an episode cut short by an error or the runner's deadline keeps
            episode.trajectories = [agent.trajectory]
            episode.metrics["turns"] = float(loop.turns)
        episode.termination_reason = reason
        if reason == TerminationReason.MAX_PROMPT_LENGTH:  # no generation, reward 0
            episode.prompt_ids = []
        episode.trajectories[0].reward = loop.total_reward
        episode.is_correct = loop.is_correct
        return reason

    def _new_context(self, previous: tuple[str, GenerationOutput, list[dict]], messages: list[dict], text: str) -> str:
        """The text added to the conversation since the model's last reply (the environment's turn).

        Found after the previous prompt and the reply (``continuation``); else after the rendering
        of the conversation up to and including the reply; else the new messages rendered alone.
        """
        prompt_text, output, messages_at_reply = previous
        added = continuation(self.tokenizer, prompt_text, output, text)
        if added is not None:
            return added
        before = render_messages(self.tokenizer, messages_at_reply, add_generation_prompt=False)
        if text.startswith(before):
            return text[len(before) :]
        logger.warning("The conversation was rewritten between turns; using only the new messages as context")
        return render_messages(self.tokenizer, messages[len(messages_at_reply) :])

    # -- workflows and run functions ----------------------------------------------------------

    async def _run_workflow(self, episode: Episode, task: dict, client: ModelClient) -> Episode:
        """rLLM's workflow life: built with ``(rollout_engine=, executor=, **workflow_args)``, run with
        its termination handling. An error episode is raised as ``_WorkflowFailed`` so that it is
        retried and reported like any other failed episode."""
        workflow = self.spec.workflow_class(rollout_engine=client, executor=self._executor, **secrets.resolve(self.spec.workflow_args))
        result = await workflow.run_with_termination_handling(task, episode.id)
        reason = result.termination_reason
        if reason == TerminationReason.ERROR:
            result.id, result.task = episode.id, task
            _attach_call_tokens(result.trajectories, client.steps)
            raise _WorkflowFailed(result)
        episode = self._finish_client_episode(episode, task, client, result)
        if reason in (TerminationReason.TIMEOUT, TerminationReason.MAX_PROMPT_LENGTH):
            self._end_early(episode, client, reason)
        return episode

    async def _call_run_func(self, task: dict, client: ModelClient) -> Any:
        """Async functions run on the loop; plain ones in a worker thread (they call ``client.chat_sync``)."""
        func = self.spec.agent_run_func
        if self.spec.run_func_style == "kwargs":
            return await self._call_sdk_run_func(func, task, client)
        if inspect.iscoroutinefunction(func):
            return await func(task, client)
        client.bind(asyncio.get_running_loop())
        result = await self._in_thread(func, task, client)
        return await result if inspect.isawaitable(result) else result

    async def _call_sdk_run_func(self, func: Callable, task: dict, client: ModelClient) -> Any:
        """rLLM's ``fn(**task)``: its calls to the episode's endpoint session are recorded by ``client``."""
        with (
            self.endpoint.session(client, asyncio.get_running_loop()) as session,
            in_episode(session.base_url, client.steps),
        ):
            kwargs = call_arguments(func, task, session.base_url)
            try:
                if inspect.iscoroutinefunction(func):
                    result = await func(**kwargs)
                else:  # in a thread, which inherits the episode's URL for get_chat_client()
                    result = await self._in_thread(func, **kwargs)
                    result = await result if inspect.isawaitable(result) else result
            except Exception:
                if session.model_failure is not None:  # the function only saw the endpoint's error 500
                    raise ModelCallError(f"Generation failed: {session.model_failure!r}") from session.model_failure
                raise
            finally:
                await _close_client(kwargs.get("client") if "client" not in task else None)
        if session.model_failure is not None:
            raise ModelCallError(f"Generation failed: {session.model_failure!r}") from session.model_failure
        if not client.steps:
            raise NoModelCall(no_model_call_message(func))
        return result_of(result, client.steps)

    async def _run_agent_flow(self, episode: Episode, task: dict, client: ModelClient) -> Episode:
        """rLLM's AgentFlow: ``flow(Task, AgentConfig)`` with ``config.base_url`` the episode's
        endpoint session, then its evaluator. Trajectories the flow left without steps (it returned
        None) get the recorded calls; the others' steps get their calls' tokens afterwards
        (``_attach_call_tokens``, matched by the reply's text, as rLLM's trace enrichment does
        by position)."""
        loop = asyncio.get_running_loop()
        rollout_cfg = self.config.actor_rollout_ref.rollout
        val = rollout_cfg.val_kwargs
        sampling = {"temperature": val.temperature, "top_p": val.top_p} if self.is_validation else {
            "temperature": rollout_cfg.temperature, "top_p": rollout_cfg.top_p}
        flow_task = task_from_row(task, episode.id)
        with self.endpoint.session(client, loop) as session:
            model = self.config.actor_rollout_ref.model.path or getattr(self.endpoint, "model_name", "policy")
            config = AgentConfig(base_url=session.base_url, model=model,
                                 session_uid=episode.id, is_validation=self.is_validation, sampling_params=sampling)
            try:
                result = await run_agent_flow(self.spec.agent_flow, flow_task, config, executor=self._executor)
            except Exception:
                if session.model_failure is not None:  # the flow only saw the endpoint's error 500
                    raise ModelCallError(f"Generation failed: {session.model_failure!r}") from session.model_failure
                raise
        if session.model_failure is not None:  # a flow that caught the error (rLLM's math flow does)
            raise ModelCallError(f"Generation failed: {session.model_failure!r}") from session.model_failure
        if not client.steps:
            raise NoModelCall(
                f"agent_flow {self.spec.label.removeprefix('agent_flow ')} returned without calling the model, so the "
                "episode has nothing to train on. Call the model through config.base_url (AsyncOpenAI(base_url=config.base_url))."
            )
        result.session_id = result.session_id or episode.id
        if result.trajectories and not any(t.steps for t in result.trajectories):
            result.trajectories[0].steps = list(client.steps)
        # rLLM's trajectories start without a reward (None) and take the evaluator's unless it set
        # their own; ours default to 0.0, so a 0.0 the flow left is read as "not set".
        for trajectory in result.trajectories:
            if not trajectory.reward:
                trajectory.reward = None
        try:
            await loop.run_in_executor(self._executor, evaluate_episode, self.spec.evaluator, flow_task, result)
        finally:
            for trajectory in result.trajectories:
                if trajectory.reward is None:
                    trajectory.reward = 0.0
        return result

    def _finish_client_episode(self, episode: Episode, task: dict, client: ModelClient, result: Any) -> Episode:
        """Turn what a workflow or run function returned into a complete Episode.

        Steps that carry no token ids get those of the model call that produced them (from their
        ``model_output``, or the recorded call with the same text). A trajectory whose reward was
        left at 0 while its steps were rewarded (rLLM's solver-judge sets step rewards only) gets
        the sum of its step rewards.
        """
        if isinstance(result, Episode):
            result.id = episode.id if not result.id else result.id
            episode = result
            episode.task = task if episode.task is None else episode.task
            if not episode.trajectories:
                episode.trajectories = [Trajectory(steps=list(client.steps))]
            _attach_call_tokens(episode.trajectories, client.steps)
            for trajectory in episode.trajectories:
                if not trajectory.reward and any(step.reward for step in trajectory.steps):
                    trajectory.reward = float(sum(step.reward for step in trajectory.steps))
            needs_reward = not episode.is_correct and not any(t.reward for t in episode.trajectories)
        else:
            episode.trajectories = [Trajectory(steps=list(client.steps))]
            needs_reward = result is None
            if result is not None:
                scored = _as_reward_output(result, "agent_run_func")
                episode.trajectories[0].reward, episode.is_correct = scored.reward, scored.is_correct
                episode.info["reward_components"] = dict(scored.metadata or {})
        if needs_reward and self.reward_fn is not None:
            scored = self._score(task, client.last_response)
            episode.info["reward_components"] = dict(scored.metadata or {})
            episode.trajectories[-1].reward, episode.is_correct = scored.reward, scored.is_correct
        if episode.termination_reason is None:
            episode.termination_reason = TerminationReason.ENV_DONE
        if not episode.prompt_ids:
            trained = [t for t in episode.trajectories if any(step.response_ids for step in t.steps)]
            self._tokens_from_steps(episode, trained[0].steps if trained else client.steps, quiet=len(trained) > 1)
        if len(episode.prompt_ids) > self.config.data.max_prompt_length:
            self._end_early(episode, client, TerminationReason.MAX_PROMPT_LENGTH)
        return episode

    def _tokens_from_steps(self, episode: Episode, steps: list[Step], quiet: bool = False) -> None:
        """Token view of recorded model calls: the first prompt, then for each later call the part
        of its prompt that extends the conversation so far (mask 0) and its completion (mask 1).

        A call that does not extend the conversation ends the view there (a workflow that starts a
        new conversation; the trainer learns from it as a sequence of its own, see
        ``training.algorithms.episode_rows``). The response is cut at ``data.max_response_length``.
        """
        if not steps:
            return
        episode.prompt_ids = list(steps[0].prompt_ids)
        episode.response_ids, episode.response_mask, episode.response_logprobs = [], [], []
        context = list(episode.prompt_ids)
        for index, step in enumerate(steps):
            extension = list(step.prompt_ids[len(context) :])
            if index and step.prompt_ids[: len(context)] != context:
                if not quiet:
                    logger.warning(
                        "Model call %d does not continue the earlier conversation; it is trained as a sequence of its own",
                        index + 1,
                    )
                break
            _append(episode, extension, 0)
            _append(episode, step.response_ids, 1, step.logprobs)
            context += extension + list(step.response_ids)
        limit = self.config.data.max_response_length
        if len(episode.response_ids) > limit:
            episode.info["truncated"] = True
            del episode.response_ids[limit:], episode.response_mask[limit:], episode.response_logprobs[limit:]

    # -- single turn ---------------------------------------------------------------------------

    async def _run_single_turn(self, episode: Episode, task: dict) -> None:
        key = self.config.data.prompt_key
        if key not in task:
            raise KeyError(f"Task has no {key!r} field (data.prompt_key); its fields are {sorted(task)}.")
        prompt = task[key]
        # As in TRL: a plain string goes to the model as it is; chat messages go through the template.
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = prompt if isinstance(prompt, str) else render_messages(self.tokenizer, messages)
        ids = encode(self.tokenizer, text)
        episode.trajectories = [Trajectory()]
        episode.metrics["turns"] = 0.0
        if len(ids) > self.config.data.max_prompt_length:
            episode.termination_reason = TerminationReason.MAX_PROMPT_LENGTH
            return
        output = await self.generator.generate(ids, self.config.data.max_response_length)
        episode.prompt_ids = ids
        _append(episode, output.completion_ids, 1, output.logprobs)
        episode.metrics["turns"] = 1.0
        scored = self._score(task, output.text)
        episode.trajectories[0] = Trajectory(
            steps=[
                Step(
                    chat_completions=messages,
                    model_response=output.text,
                    reward=scored.reward,
                    done=True,
                    prompt_ids=ids,
                    response_ids=list(output.completion_ids),
                    logprobs=list(output.logprobs),
                )
            ],
            reward=scored.reward,
        )
        episode.is_correct = scored.is_correct
        episode.info["reward_components"] = dict(scored.metadata or {})
        stopped = output.finish_reason == "stop"
        episode.termination_reason = TerminationReason.ENV_DONE if stopped else TerminationReason.MAX_RESPONSE_LENGTH

    # -- shared --------------------------------------------------------------------------------

    def _score(self, task: dict, response: str) -> RewardOutput:
        return _as_reward_output(self.reward_fn(task, response), "reward_fn")

    def _end_early(self, episode: Episode, client: ModelClient, reason: TerminationReason) -> None:
        """Mark an episode that did not finish normally: reward 0, tokens kept (none for a long prompt)."""
        if self.spec.kind in ("workflow", "run_func", "agent_flow"):
            if not episode.trajectories:
                episode.trajectories = [Trajectory(steps=list(client.steps))]
            if not episode.prompt_ids:
                self._tokens_from_steps(episode, client.steps)
        if reason == TerminationReason.MAX_PROMPT_LENGTH:
            episode.prompt_ids, episode.response_ids, episode.response_mask, episode.response_logprobs = [], [], [], []
        for trajectory in episode.trajectories:
            trajectory.reward = 0.0
        episode.is_correct = False
        episode.termination_reason = reason


class _TokenTurnLoop(TurnLoop):
    """The turn loop keeping each call's exact token ids on the step the agent made of it."""

    def record(self, step: Step, reply: Reply) -> None:
        context, output = reply.output
        step.prompt_ids, step.response_ids = context, list(output.completion_ids)
        step.logprobs = list(output.logprobs)


class _TokenTurns:
    """The model's side of an agent + environment episode in tokens: the first prompt is the
    episode's ``prompt_ids``; every later token goes to its response, mask 1 where the model wrote
    it, 0 where the environment did. Ends the episode before a call whose first prompt passes
    ``data.max_prompt_length`` or that has no room left of ``data.max_response_length``."""

    def __init__(self, runner: "EpisodeRunner", episode: Episode) -> None:
        self.runner, self.episode = runner, episode
        self.previous: tuple[str, GenerationOutput, list[dict]] | None = None

    async def respond(self, conversation: list[dict]) -> Reply:
        runner, episode, data = self.runner, self.episode, self.runner.config.data
        messages = [dict(m) for m in conversation]
        text = render_messages(runner.tokenizer, messages)
        if self.previous is None:
            episode.prompt_ids = encode(runner.tokenizer, text)
            if len(episode.prompt_ids) > data.max_prompt_length:
                raise TerminationEvent(TerminationReason.MAX_PROMPT_LENGTH)
            new_ids: list[int] = []
        else:
            new_ids = encode(runner.tokenizer, runner._new_context(self.previous, messages, text))
        room = data.max_response_length - len(episode.response_ids) - len(new_ids)
        if room <= 0:
            raise TerminationEvent(TerminationReason.MAX_RESPONSE_LENGTH)
        _append(episode, new_ids, 0)
        context = episode.prompt_ids + episode.response_ids
        limit = min(runner.loop_config.max_tokens_per_turn, room)
        output = await runner.generator.generate(context, limit)
        _append(episode, output.completion_ids, 1, output.logprobs)
        self.previous = (text, output, messages)
        out_of_budget = limit == room and output.finish_reason == "length"
        return Reply(output.text, out_of_budget=out_of_budget, output=(context, output))


class _WorkflowFailed(Exception):
    """A workflow episode that ended with an error: the error's text and traceback, and the episode
    with the trajectories collected before it."""

    def __init__(self, episode: Episode) -> None:
        details = episode.info.get("error") or {}
        super().__init__(f"{details.get('error_type', 'Error')}: {details.get('error_message', '')}")
        self.episode = episode
        self.traceback = details.get("traceback", "")


def _attach_call_tokens(trajectories: list[Trajectory], calls: list[Step]) -> None:
    """Give each step without token ids those of its model call: its ``model_output``'s, else the
    first unused recorded call whose text is the step's ``model_response``."""
    claimed = {id(step.model_output) for t in trajectories for step in t.steps if step.model_output is not None}
    unused = [call for call in calls if id(call.model_output) not in claimed]
    for trajectory in trajectories:
        for step in trajectory.steps:
            output = step.model_output
            if step.response_ids:
                continue
            if output is not None and output.completion_ids:
                step.prompt_ids, step.response_ids = list(output.prompt_ids or []), list(output.completion_ids)
                step.logprobs = list(output.logprobs or [0.0] * len(output.completion_ids))
                continue
            match = next((call for call in unused if call.model_response == step.model_response), None)
            if match is not None:
                unused.remove(match)
                step.prompt_ids, step.response_ids, step.logprobs = match.prompt_ids, match.response_ids, match.logprobs


def _append(episode: Episode, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
    episode.response_ids.extend(ids)
    episode.response_mask.extend([mask] * len(ids))
    episode.response_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


async def _close_client(client: Any) -> None:
    """Close an ``openai`` client the engine made for a run function (sync or async)."""
    if client is None:
        return
    closing = client.close()
    if inspect.isawaitable(closing):
        await closing


def _as_reward_output(value: Any, source: str) -> RewardOutput:
    if isinstance(value, RewardOutput):
        return value
    if isinstance(value, (int, float)):
        return RewardOutput(reward=float(value), is_correct=value > 0)
    raise TypeError(f"{source} returned {type(value).__name__}; return a float or a RewardOutput.")


def _one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, _WorkflowFailed) else f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def summarize_episodes(episodes: list[Episode]) -> dict[str, float]:
    """Batch metrics: means of reward, turns, model tokens and time; solve, error and termination rates."""
    count = len(episodes)
    rewards = [e.reward for e in episodes]

    def mean(values: list[float]) -> float:
        return float(sum(values) / count) if count else 0.0

    summary = {
        "reward": mean(rewards),
        "reward_std": float(statistics.pstdev(rewards)) if count else 0.0,
        "solve_rate": mean([float(e.is_correct) for e in episodes]),
        "turns": mean([e.metrics.get("turns", 0.0) for e in episodes]),
        "response_length": mean([float(sum(e.response_mask)) for e in episodes]),
        "episode_time": mean([e.metrics.get("episode_time", 0.0) for e in episodes]),
    }
    for reason in TerminationReason:
        summary[f"termination/{reason.value}"] = mean([float(e.termination_reason == reason) for e in episodes])
    summary["error_rate"] = summary[f"termination/{TerminationReason.ERROR.value}"]
    summary.update(reward_component_means([e.info.get("reward_components") for e in episodes]))
    # What workflows report per episode (rLLM's <name>_acc, solver_acc, ...): their means.
    for key in sorted({k for e in episodes for k in e.metrics} - set(summary)):
        values = [float(e.metrics[key]) for e in episodes if isinstance(e.metrics.get(key), (int, float))]
        if values:
            summary[key] = sum(values) / len(values)
    return summary

