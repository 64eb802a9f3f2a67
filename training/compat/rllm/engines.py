"""rLLM's inference-only engines: score agents and workflows against a model behind an
OpenAI-compatible server (vLLM, SGLang, OpenAI, or any other), as rLLM's ``run_*.py`` scripts do.

- ``OpenAIEngine``: rLLM's ``RolloutEngine`` over the ``openai`` client's chat completions.
- ``AgentWorkflowEngine``: runs a ``Workflow`` per task (a pool of ``n_parallel_tasks`` workflows
  sharing one rollout engine), retrying error episodes; returns ``Episode``s in task order.
- ``AgentExecutionEngine``: runs an agent against an environment per task, the model reached
  through an ``OpenAIEngine`` (``engine_name="openai"``); returns ``Trajectory``s in task order.
- ``compute_pass_at_k``: rLLM's pass@1 / pass@k summary of such results; ``save_trajectories``
  writes them to a file.

Nothing here trains: the trainer's own rollouts (``training.rollouts.episode_runner``) generate from the policy
in process and record exact token ids; these engines only see what a server answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from training.agents.base import BaseAgent, BaseEnv, build_agent, build_env
from training.agents.turn_loop import Reply, TurnLoop, run_turns
from training.rollouts.generation import split_reasoning
from training.rendering import encode, render_messages
from training.errors import ModelCallError, TerminationEvent
from training.log import logger
from training.types import Episode, ModelOutput, Step, TerminationReason, Trajectory
from training.agents.workflow import RolloutEngine, Workflow

# Parameters the openai client's chat.completions.create() takes by name; any other sampling
# parameter (vLLM's and SGLang's top_k, min_p, repetition_penalty, ...) goes in the request body.
_OPENAI_CHAT_PARAMS = frozenset({
    "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
    "top_logprobs", "seed", "response_format", "tool_choice", "parallel_tool_calls", "user", "reasoning_effort",
    "max_tokens", "max_completion_tokens",
})


class OpenAIEngine(RolloutEngine):
    """rLLM's ``OpenAIEngine`` (``rllm.engine.rollout.openai_engine``), with its arguments.

    ``get_model_response(messages, **sampling)`` asks the server's ``/chat/completions`` and returns
    a ``ModelOutput``. Unlike rLLM, which sends a prompt rendered by ``tokenizer`` to
    ``/completions`` when it is given one, the chat endpoint is used either way: vLLM and SGLang
    render with the model's own chat template (the tokenizer's), and chat-only APIs work too. The
    ``tokenizer`` still does what rLLM uses it for: a prompt longer than ``max_prompt_length`` ends
    the episode (``TerminationEvent(MAX_PROMPT_LENGTH_EXCEEDED)``) unless the call passes
    ``enforce_max_prompt_length=False``, and ``max_tokens`` is cut to what ``max_model_length`` leaves.

    Token ids: the server's own when it returns them (vLLM's ``prompt_token_ids`` and
    ``choices[0].token_ids``), else the tokenizer's encoding of the prompt and reply, else none.
    Reasoning comes from the message's ``reasoning``/``reasoning_content`` field or the reply's
    ``<think>...</think>``. ``api_retries``: the ``openai`` client's retries (connection errors,
    429, 5xx); a call that still fails raises ``ModelCallError`` naming the server.
    """

    def __init__(
        self,
        model: str = "",
        tokenizer: Any = None,
        max_prompt_length: int = 4096,
        max_response_length: int = 4096,
        max_model_length: int | None = None,
        api_retries: int = 3,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        sampling_params: dict | None = None,
        tools: list | None = None,
        accumulate_reasoning: bool = False,
        **kwargs: Any,
    ) -> None:
        from openai import AsyncOpenAI

        if accumulate_reasoning:
            raise ValueError(
                "OpenAIEngine(accumulate_reasoning=True): earlier turns' reasoning cannot be sent back through "
                "the chat endpoint (rLLM refuses it there too); leave accumulate_reasoning out."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        self.max_model_length = (max_model_length if max_model_length is not None else max_prompt_length + max_response_length) - 1
        self.api_retries = api_retries
        self.base_url = base_url
        self.sampling_params = dict(sampling_params or {})
        self.tools = [getattr(tool, "json", tool) for tool in tools or []]  # rLLM's Tool objects or OpenAI dicts
        # Local servers ignore the key, but the client insists on one.
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=api_retries)

    async def get_model_response(self, messages: list[dict], **kwargs: Any) -> ModelOutput:
        for ignored in ("application_id", "validate", "accumulate_reasoning"):
            kwargs.pop(ignored, None)
        enforce_max_prompt_length = kwargs.pop("enforce_max_prompt_length", True)
        tools = kwargs.pop("tools", self.tools)
        sampling = {**self.sampling_params, **kwargs}
        model = sampling.pop("model", None) or self.model or await self._served_model()

        prompt_ids: list[int] = []
        if self.tokenizer is not None:
            prompt_ids = encode(self.tokenizer, render_messages(self.tokenizer, messages))
            if enforce_max_prompt_length and len(prompt_ids) > min(self.max_prompt_length, self.max_model_length):
                raise TerminationEvent(TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED)
        if "max_completion_tokens" not in sampling:
            limit = sampling.pop("max_tokens", sampling.pop("max_new_tokens", self.max_response_length))
            if prompt_ids:
                limit = min(limit, self.max_model_length - len(prompt_ids))
            sampling["max_tokens"] = max(1, int(limit))
        named = {key: value for key, value in sampling.items() if key in _OPENAI_CHAT_PARAMS}
        extra = {key: value for key, value in sampling.items() if key not in _OPENAI_CHAT_PARAMS}
        if tools:
            named["tools"] = tools
        try:
            response = await self.client.chat.completions.create(
                model=model, messages=messages, extra_body=extra or None, **named
            )
        except Exception as exc:
            from openai import APIError

            if isinstance(exc, APIError):
                raise ModelCallError(f"The model server at {self.base_url} failed: {type(exc).__name__}: {exc}") from exc
            raise
        return self._model_output(response, prompt_ids)

    def _model_output(self, response: Any, prompt_ids: list[int]) -> ModelOutput:
        choice = response.choices[0]
        message = choice.message
        extras = {**(response.model_extra or {}), **(choice.model_extra or {}), **(message.model_extra or {})}
        content = message.content or ""
        reasoning = extras.get("reasoning") or extras.get("reasoning_content") or ""
        if not reasoning:
            reasoning, content = split_reasoning(content)
        text = f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning else content
        completion_ids = extras.get("token_ids")
        if extras.get("prompt_token_ids"):
            prompt_ids = list(extras["prompt_token_ids"])
        if completion_ids is None:
            completion_ids = encode(self.tokenizer, message.content or "") if self.tokenizer is not None else []
        logprobs = [entry.logprob for entry in (choice.logprobs.content or [])] if choice.logprobs else []
        usage = response.usage
        return ModelOutput(
            text=text,
            content=content,
            reasoning=reasoning,
            tool_calls=list(message.tool_calls or []),
            prompt_ids=prompt_ids,
            completion_ids=list(completion_ids),
            logprobs=logprobs,
            prompt_length=usage.prompt_tokens if usage else len(prompt_ids),
            completion_length=usage.completion_tokens if usage else len(completion_ids),
            finish_reason=choice.finish_reason,
        )

    async def _served_model(self) -> str:
        """No model named (rLLM's AgentExecutionEngine names none): the first one the server lists."""
        try:
            models = await self.client.models.list()
        except Exception as exc:
            raise ModelCallError(f"No model was named and the server at {self.base_url} did not list its models: {exc}") from exc
        if not models.data:
            raise ModelCallError(f"No model was named and the server at {self.base_url} lists none; pass model=.")
        self.model = models.data[0].id
        return self.model


class AgentWorkflowEngine:
    """rLLM's ``AgentWorkflowEngine`` (``rllm.engine.agent_workflow_engine``), for inference.

    ``n_parallel_tasks`` workflows of ``workflow_cls`` (built with ``rollout_engine``, a shared
    executor and ``workflow_args``) take the tasks in turn; each task runs through
    ``run_with_termination_handling`` and, while it ends with ``error``, again up to
    ``retry_limit`` attempts in all. Then the error is raised (``raise_on_error``) or the error
    episode is kept. ``execute_tasks`` returns the episodes grouped by task id, tasks in the order
    first given (repeated tasks: pass the same id, or give them as separate rows).
    """

    def __init__(
        self,
        workflow_cls: type[Workflow],
        workflow_args: dict | None,
        rollout_engine: RolloutEngine,
        config: Any = None,
        n_parallel_tasks: int = 128,
        retry_limit: int = 3,
        raise_on_error: bool = True,
        episode_logger: Any = None,
        **kwargs: Any,
    ) -> None:
        if not (isinstance(workflow_cls, type) and issubclass(workflow_cls, Workflow)):
            raise TypeError(f"workflow_cls must be a Workflow subclass, not {workflow_cls!r}.")
        if n_parallel_tasks < 1 or retry_limit < 1:
            raise ValueError(f"n_parallel_tasks and retry_limit must be at least 1 (got {n_parallel_tasks}, {retry_limit}).")
        self.workflow_cls = workflow_cls
        self.workflow_args = dict(workflow_args or {})
        self.rollout_engine = rollout_engine
        self.config = config
        self.n_parallel_tasks = n_parallel_tasks
        self.retry_limit = retry_limit
        self.raise_on_error = raise_on_error
        self.episode_logger = episode_logger
        self.kwargs = kwargs
        self.current_step, self.current_epoch, self.current_mode = 0, 0, "train"
        self.executor: ThreadPoolExecutor | None = None
        self.workflow_queue: asyncio.Queue | None = None

    def set_training_step(self, step: int, mode: str = "train", epoch: int = 0) -> None:
        """What ``episode_logger`` files the next results under."""
        self.current_step, self.current_mode, self.current_epoch = step, mode, epoch

    async def initialize_pool(self) -> None:
        if self.workflow_queue is not None:
            return
        self.executor = ThreadPoolExecutor(max_workers=min(self.n_parallel_tasks, 32))
        queue: asyncio.Queue = asyncio.Queue()
        for _ in range(self.n_parallel_tasks):
            workflow = self.workflow_cls(rollout_engine=self.rollout_engine, executor=self.executor, **self.workflow_args)
            if not workflow.is_multithread_safe():
                raise ValueError(f"{self.workflow_cls.__name__} holds an environment that is not multithread safe; "
                                 "its episodes cannot run concurrently.")
            queue.put_nowait(workflow)
        self.workflow_queue = queue

    async def execute_tasks(self, tasks: Any, task_ids: list[str] | None = None, **kwargs: Any) -> list[Episode]:
        tasks = list(tasks)
        if task_ids is None:
            task_ids = [str(uuid.uuid4()) for _ in tasks]
        if len(task_ids) != len(tasks):
            raise ValueError(f"execute_tasks: {len(tasks)} tasks but {len(task_ids)} task_ids.")
        # The queue belongs to the event loop that made it: a new asyncio.run() gets a new pool.
        await self.initialize_pool()
        rollouts: dict[str, int] = defaultdict(int)
        jobs = []
        for task, task_id in zip(tasks, task_ids):
            jobs.append(self.process_task_with_retry(task, task_id, rollouts[task_id], **kwargs))
            rollouts[task_id] += 1
        try:
            finished = await asyncio.gather(*jobs)
        finally:
            self.workflow_queue = None
            self.shutdown()
        order = list(dict.fromkeys(task_ids))
        by_task: dict[str, list[Episode]] = defaultdict(list)
        for task_id, _, episode in finished:
            by_task[task_id].append(episode)
        results = [episode for task_id in order for episode in by_task[task_id]]
        if self.episode_logger is not None:
            self.episode_logger.log_episodes_batch(results, self.current_step, self.current_mode, self.current_epoch)
        return results

    async def process_task_with_retry(self, task: dict, task_id: str, rollout_idx: int, **kwargs: Any) -> tuple[str, int, Episode]:
        workflow = await self.workflow_queue.get()
        try:
            uid = f"{task_id}:{rollout_idx}"
            for attempt in range(1, self.retry_limit + 1):
                episode = await workflow.run_with_termination_handling(task=task, uid=uid, **kwargs)
                episode.info["attempts"] = attempt
                rewards = ", ".join(f"{t.name}: {t.reward:.1f}" for t in episode.trajectories)
                logger.info("[%s] rollout done. Rewards: %s; termination: %s", uid, rewards, episode.termination_reason)
                if episode.termination_reason != TerminationReason.ERROR:
                    return task_id, rollout_idx, episode
                error = episode.info.get("error") or {}
                logger.warning("[%s] attempt %d/%d failed: %s: %s", uid, attempt, self.retry_limit,
                               error.get("error_type"), error.get("error_message"))
            if self.raise_on_error:
                raise RuntimeError(
                    f"[{uid}] rollout failed permanently after {self.retry_limit} attempt(s): "
                    f"{error.get('error_type')}: {error.get('error_message')}\n{error.get('traceback', '')}"
                )
            return task_id, rollout_idx, episode
        finally:
            self.workflow_queue.put_nowait(workflow)

    def shutdown(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None


class AgentExecutionEngine:
    """rLLM's ``AgentExecutionEngine`` (``rllm.engine.agent_execution_engine``), for inference.

    ``execute_tasks(tasks)`` runs, per task, ``env_class.from_dict({**task, **env_args})`` and
    ``agent_class(**agent_args)`` for up to ``max_steps`` turns, at most ``n_parallel_agents``
    at a time, and returns each agent's ``Trajectory`` (``task`` set, ``reward`` the sum of the
    step rewards, ``mc_return`` discounted by ``gamma``) in task order. As in rLLM, a turn may
    write at most what is left of ``max_response_length`` tokens (the model's replies and the
    environment's messages, counted with ``tokenizer``); an episode that runs out ends there
    (``info["termination_reason"] = "TRUNCATION"``), one whose replies alone passed it with reward
    0. ``trajectory_timeout`` bounds each episode's model and environment time: a call still
    running then is cut (``ENV_TIMEOUT`` for an environment step, whose step scores 0; ``TIMEOUT``
    otherwise). An agent or environment that raises stops ``execute_tasks`` with that error,
    naming the task, as in rLLM. The turns are the one turn loop's (``training.agents.turn_loop``).

    Only ``engine_name="openai"`` runs here (``rollout_engine_args``: ``OpenAIEngine``'s, e.g.
    ``base_url`` and ``api_key``; ``sampling_params`` go with every request). The ``verl`` and
    ``tinker`` engines generate from a policy being trained: use ``AgentTrainer(...).evaluate()``
    for that.
    """

    def __init__(
        self,
        engine_name: str = "openai",
        tokenizer: Any = None,
        rollout_engine: Any = None,
        chat_parser: Any = None,
        n_parallel_agents: int = 128,
        trajectory_timeout: float | None = None,
        gamma: float = 0.2,
        api_retries: int = 3,
        retry_limit: int = 3,
        max_steps: int = 5,
        max_response_length: int = 8192,
        max_prompt_length: int = 1024,
        config: Any = None,
        agent_class: type | None = None,
        env_class: type | None = None,
        agent_args: dict | None = None,
        rollout_engine_args: dict | None = None,
        env_args: dict | None = None,
        max_workers: int = 64,
        enforce_max_prompt_length: bool = False,
        overlong_filter: bool = False,
        **kwargs: Any,
    ) -> None:
        if engine_name != "openai":
            raise ValueError(
                f"AgentExecutionEngine(engine_name={engine_name!r}): only 'openai' (a model behind an "
                "OpenAI-compatible server) runs here; to score the policy of a run, use AgentTrainer(...).evaluate()."
            )
        for name, cls, base in (("agent_class", agent_class, BaseAgent), ("env_class", env_class, BaseEnv)):
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise TypeError(f"AgentExecutionEngine: {name} must be a {base.__name__} subclass, not {cls!r}.")
        if not env_class.is_multithread_safe():
            raise ValueError(f"{env_class.__name__}.is_multithread_safe() is False: its episodes cannot run concurrently.")
        self.engine_name = engine_name
        self.tokenizer = tokenizer
        self.config = config
        self.n_parallel_agents = n_parallel_agents
        self.trajectory_timeout = trajectory_timeout or 1e9
        self.gamma = gamma
        self.retry_limit = retry_limit
        self.max_steps = max_steps
        self.max_response_length = max_response_length
        self.max_prompt_length = max_prompt_length
        self.enforce_max_prompt_length = enforce_max_prompt_length
        self.overlong_filter = overlong_filter  # masks training tokens in rLLM; nothing to mask in inference
        self.agent_class, self.env_class = agent_class, env_class
        self.agent_args, self.env_args = dict(agent_args or {}), dict(env_args or {})
        self.max_env_workers = max_workers
        self.sampling_params = dict(kwargs.get("sampling_params") or {})
        self.rollout_engine = OpenAIEngine(
            **(rollout_engine_args or {}),
            api_retries=api_retries,
            tokenizer=tokenizer,
            max_prompt_length=max_prompt_length,
            max_response_length=max_response_length,
        )
        self.executor: ThreadPoolExecutor | None = None

    async def get_model_response(self, prompt: list[dict], application_id: str, **kwargs: Any) -> ModelOutput:
        sampling = {**self.sampling_params, **kwargs}
        return await self.rollout_engine.get_model_response(
            prompt, application_id=application_id, enforce_max_prompt_length=False, **sampling
        )

    async def execute_tasks(self, tasks: Any) -> list[Trajectory]:
        tasks = list(tasks)
        semaphore = asyncio.Semaphore(self.n_parallel_agents)
        self.executor = ThreadPoolExecutor(max_workers=self.max_env_workers)

        async def one(index: int, task: dict) -> Trajectory:
            async with semaphore:
                try:
                    return await self.run_agent_trajectory(index, task)
                except Exception as exc:
                    exc.add_note(f"(while running task {index}: {_short(task)})")
                    raise

        try:
            return list(await asyncio.gather(*(one(i, task) for i, task in enumerate(tasks))))
        finally:
            # Without waiting: an environment step that hangs past its timeout must not hold the caller.
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def run_agent_trajectory(self, index: int, task: dict) -> Trajectory:
        """One episode, rLLM's turn loop ("Text" mode), played by the one turn loop
        (``training.agents.turn_loop``) and reported under rLLM's names."""
        loop = asyncio.get_running_loop()
        env = build_env(self.env_class, task, self.env_args)
        env.idx = index
        agent = build_agent(self.agent_class, self.agent_args)
        agent.trajectory.task = task

        async def call_env(fn: Any, *args: Any) -> Any:
            return await loop.run_in_executor(self.executor, fn, *args)

        def reset() -> tuple[Any, dict]:
            agent.trajectory.task = task  # the loop has just reset the agent: its new trajectory's task
            return env.reset()

        turns = _RllmTurnLoop(self, index, agent, env, max_steps=self.max_steps, timeout=self.trajectory_timeout,
                              call_env=call_env)
        ended = await run_turns(turns, turns.respond, reset)
        reason = _RLLM_NAMES.get(ended, ended.value.upper())
        if reason == "TIMEOUT" and turns.cut == "env":
            reason = "ENV_TIMEOUT"
        current = agent.get_current_state()
        if current is not None and reason in ("TIMEOUT", "ENV_TIMEOUT"):
            current.done = True
            if reason == "ENV_TIMEOUT":
                current.reward = 0.0
        trajectory = agent.trajectory
        trajectory.task = task
        trajectory.info["termination_reason"] = reason
        trajectory.reward = float(sum(step.reward for step in trajectory.steps))
        running = 0.0
        for step in reversed(trajectory.steps):
            running = step.reward + self.gamma * running
            step.mc_return = running
        logger.info("Trajectory %d ended: %s; reward %s", index, reason, trajectory.reward)
        return trajectory

    def _new_message_tokens(self, before: list[dict], after: list[dict]) -> int:
        """Tokens of the messages the environment added after the model's reply (0 without a tokenizer)."""
        if self.tokenizer is None:
            return 0
        added = [m for m in after[len(before) + 1 :] if m.get("role") != "assistant"]
        return sum(len(encode(self.tokenizer, str(m.get("content", "")))) for m in added)

    def shutdown(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None


# rLLM's names of why an episode ended (``info["termination_reason"]``); a timeout that cut an
# environment step is its ENV_TIMEOUT.
_RLLM_NAMES = {
    TerminationReason.ENV_DONE: "ENV_DONE",
    TerminationReason.MAX_TURNS: "MAX_STEPS",
    TerminationReason.MAX_PROMPT_LENGTH: "PROMPT_TRUNCATION",
    TerminationReason.MAX_RESPONSE_LENGTH: "TRUNCATION",
    TerminationReason.TIMEOUT: "TIMEOUT",
}


class _RllmTurnLoop(TurnLoop):
    """The turn loop as rLLM's ``AgentExecutionEngine`` plays it: the agent's ``info`` carries
    ``max_steps`` (and ``cur_tokens``), each step takes the environment's reward and done, and the
    model's replies and the environment's messages share one budget of ``max_response_length``
    tokens (an episode whose replies alone passed it scores 0 on its last step)."""

    def __init__(self, engine: "AgentExecutionEngine", index: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine, self.index = engine, index
        self.used = 0  # response tokens so far: the model's replies and the environment's messages
        self.asked: tuple[list[dict], int] = ([], 0)  # the conversation the model answered, its reply's tokens

    async def respond(self, conversation: list[dict]) -> Reply:
        engine = self.engine
        messages = list(conversation)
        if self.turns == 0 and engine.tokenizer is not None:
            prompt_length = len(encode(engine.tokenizer, render_messages(engine.tokenizer, messages)))
            if prompt_length > engine.max_prompt_length:
                logger.warning("Trajectory %d: the first prompt has %d tokens, more than max_prompt_length %d",
                               self.index, prompt_length, engine.max_prompt_length)
                raise TerminationEvent(TerminationReason.MAX_PROMPT_LENGTH)
        budget = engine.max_response_length if engine.enforce_max_prompt_length else engine.max_response_length - self.used
        output = await engine.get_model_response(messages, application_id=str(self.index), max_tokens=budget)
        self.asked = (messages, output.completion_length or len(output.completion_ids or []))
        return Reply(output.text, output=output)

    def agent_info(self, info: dict) -> dict:
        told = dict(super().agent_info(info), max_steps=self.max_steps)
        if self.turns:
            told["cur_tokens"] = self.used
        return told

    def observed(self, step: Step | None, reward: float, done: bool, info: dict) -> None:
        current = self.agent.get_current_state()
        current.reward, current.done = reward, done
        current.info.update(self.agent_info(info))
        messages, reply_tokens = self.asked
        env_tokens = self.engine._new_message_tokens(messages, self.agent.chat_completions)
        self.used += reply_tokens + env_tokens
        if self.used >= self.engine.max_response_length:
            if self.used - env_tokens > self.engine.max_response_length:
                current.reward = 0.0
            current.done = True
            self.end(TerminationReason.MAX_RESPONSE_LENGTH)

    async def finish(self) -> None:
        if hasattr(self.env, "compute_final_reward"):
            final = await self.call_env(self.env.compute_final_reward)
            current = self.agent.get_current_state()
            if current is not None:
                current.reward = final


class AsyncAgentExecutionEngine(AgentExecutionEngine):
    """rLLM's other name for ``AgentExecutionEngine``."""


def compute_pass_at_k(results: list[Any]) -> dict[str, float]:
    """rLLM's ``rllm.utils.compute_pass_at_k``: results (trajectories or episodes, several per task)
    are grouped by their task; one counts as correct when its reward is above 0. Prints rLLM's
    three lines and returns them: ``total_problems``, ``pass@1`` (correct results / all results)
    and ``pass@k`` (share of tasks with at least one correct result; k = the task's results)."""
    correct: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for result in results:
        task = result.task
        key = json.dumps(task, sort_keys=True, default=str) if isinstance(task, dict) else str(task)
        digest = hashlib.md5(key.encode()).hexdigest()
        correct[digest] += int(result.reward > 0)
        total[digest] += 1
    if not total:
        raise ValueError("compute_pass_at_k: no results to score.")
    summary = {
        "total_problems": len(total),
        "pass@1": sum(correct.values()) / sum(total.values()),
        "pass@k": sum(1 for c in correct.values() if c > 0) / len(total),
    }
    print("Total unique problems:", summary["total_problems"])
    print("Average Pass@1 Accuracy:", summary["pass@1"])
    print("Average Pass@k Accuracy:", summary["pass@k"])
    return summary


def save_trajectories(results: list[Any], save_dir: str = "./trajectories", filename: str = "trajectories.pt") -> str:
    """rLLM's ``save_trajectories`` (``rllm/utils/compute_pass_at_k.py``): ``torch.save`` of the
    results (read back with ``torch.load(path, weights_only=False)``: they are our data classes,
    not tensors) to ``save_dir/filename``; prints and returns the path."""
    import torch

    os.makedirs(save_dir, exist_ok=True)
    path = os.path.join(save_dir, filename)
    torch.save(results, path)
    print(f"Trajectories saved to {path}")
    return path


def _short(task: Any, limit: int = 200) -> str:
    text = repr(task)
    return text if len(text) <= limit else text[:limit] + "..."
