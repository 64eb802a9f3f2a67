"""rLLM's ``ToolEnvironment``, written here with rLLM v0.2.1.post1's behaviour:
``from rllm.environments.tools.tool_env import ToolEnvironment`` -> ``from training import ToolEnvironment``.

It pairs with ``training.ToolAgent``: each action is a list of OpenAI-style tool calls; the calls
run (concurrently, each in a thread) and their outputs come back as ``{"tool_outputs": {id: text}}``;
a call of ``finish`` (what the agent sends for a reply without a tool call), a plain string, or
the ``max_steps``-th step ends the episode, and ``reward_fn(task, answer)`` scores the answer.

(The AWorld-style chat agents have an environment of their own, ``training.compat.aworld.agents.ToolEnvironment``,
for tools given as plain functions.)
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from training.agents.base import BaseEnv, split_settings
from training.rewards import load_reward
from training.compat.rllm.tools import MultiTool, Tool, ToolOutput


class ToolEnvironment(BaseEnv):
    """One task for a tool agent. ``tools`` (registered names such as ``"python"``) or ``tool_map``
    (name -> ``Tool`` class); ``reward_fn`` scores the final answer (rLLM's ``(task_info, action)``
    signature, verl's, a built-in name or an import path); ``max_steps`` ends the episode.

    Unlike rLLM, which warns and scores every answer 0, a missing ``reward_fn`` is refused: nothing
    could be learnt. A malformed call, an unknown tool or a tool that raises is answered with an
    error the model reads, not an episode error: calling tools well is part of what is learnt.
    """

    def __init__(self, task: dict | None = None, tools: list[str] | None = None,
                 tool_map: dict[str, type[Tool]] | None = None, reward_fn: Any = None, max_steps: int = 10) -> None:
        if reward_fn is None:
            raise ValueError("ToolEnvironment needs a reward function: pass env_args={'reward_fn': fn} "
                             "(a function, a built-in reward name or an import path).")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"ToolEnvironment max_steps must be a whole number of at least 1, got {max_steps!r}.")
        self.tools = MultiTool(tools=tools, tool_map=tool_map) if (tools is not None or tool_map is not None) else MultiTool(tools=[])
        self.task = task
        self.reward_fn = load_reward(reward_fn)
        self.max_steps = max_steps
        self.step_count = 0

    def reset(self) -> tuple[Any, dict]:
        self.step_count = 0
        return self.task, {}

    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        calls = [] if action is None else [action] if isinstance(action, dict) else action
        self.step_count += 1
        finish = next((c for c in calls if isinstance(c, dict) and c.get("function", {}).get("name") == "finish"), None) \
            if isinstance(calls, list) else None
        if isinstance(calls, str) or finish is not None or self.step_count >= self.max_steps:
            if isinstance(calls, str):
                answer = calls
            elif finish is not None:
                arguments = _arguments(finish)
                answer = arguments.get("response", "") if isinstance(arguments, dict) else str(arguments)
            else:  # out of steps in the middle of tool calls: the calls are the answer, as rLLM scores them
                answer = str(calls)
            scored = self.reward_fn(self.task if self.task is not None else {}, answer)
            return {}, scored.reward, True, {"response": calls, "metadata": scored.metadata, "is_correct": scored.is_correct}
        return {"tool_outputs": self._run_calls(calls)}, 0.0, False, {"response": calls, "metadata": {}}

    def _run_calls(self, calls: list[dict]) -> dict[str, str]:
        with ThreadPoolExecutor(max_workers=max(1, min(len(calls), 8))) as pool:
            outputs = list(pool.map(self._run_call, calls))
        return {str(call.get("id", index)): text for index, (call, text) in enumerate(zip(calls, outputs))}

    def _run_call(self, call: Any) -> str:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return ToolOutput(name="", error='a tool call needs {"function": {"name": ..., "arguments": ...}}').to_string()
        arguments = _arguments(call)
        if not isinstance(arguments, dict):
            return ToolOutput(name=function["name"], error="the arguments of a tool call must be a JSON object").to_string()
        tool = self.tools.tool_map.get(function["name"])
        if tool is None:
            return self.tools.forward(tool_name=function["name"]).to_string()  # names the tools there are
        return tool.run(arguments).to_string()

    @staticmethod
    def from_dict(env_args: dict) -> "ToolEnvironment":
        """``env_args`` is the dataset row merged with the environment's arguments: ``tools``,
        ``tool_map``, ``reward_fn`` and ``max_steps`` come out of the arguments (never the row:
        ``split_settings``); the rest is the task."""
        task, settings = split_settings(env_args, ("tools", "tool_map", "reward_fn", "max_steps"))
        return ToolEnvironment(task=task, **settings)


def _arguments(call: dict) -> Any:
    arguments = call.get("function", {}).get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments
