"""rLLM's library agents, written here with rLLM v0.2.1.post1's behaviour so that its examples
port by their import lines: ``ToolAgent`` (tools called in the Qwen/Hermes ``<tool_call>`` format),
``MathAgent`` (one question, one answer, reasoning split off at ``</think>``) and
``CompetitionCodingAgent`` (a problem, then test feedback between attempts).

    from rllm.agents import ToolAgent, MathAgent        ->  from training import ToolAgent, MathAgent
    from rllm.agents.code_agent import CompetitionCodingAgent  ->  from training import CompetitionCodingAgent
    from rllm.agents.system_prompts import SEARCH_SYSTEM_PROMPT  ->  from training import SEARCH_SYSTEM_PROMPT
    from rllm.agents.tool_agent import MCPToolAgent  ->  from training import MCPToolAgent
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from training.agents.base import BaseAgent
from training.compat.rllm.tools import MultiTool, Tool
from training.agents.tools import parse_tool_calls, tools_prompt
from training.types import Action, Step, Trajectory

TOOL_SYSTEM_PROMPT = (
    "You are an agent with tools. Think about the task first, say what you are going to do, "
    "then call the tools you need; answer when you have what the task asks for.\n"
)

SEARCH_SYSTEM_PROMPT = (
    "You answer questions with the help of a search tool.\n\n"
    "Search for the facts the question needs, compare what different results say, and answer "
    "from what you found. Write the final answer alone inside \\boxed{}: \\boxed{Paris}, "
    "\\boxed{no}, \\boxed{1969}."
)

# Tool-call formats by rLLM's parser names. Both names that rLLM maps to the Hermes format are here;
# rLLM's "r1" (DeepSeek's special-token format) is not.
TOOL_CALL_FORMATS = ("qwen",)


def _split_thinking(response: str) -> tuple[str | None, str]:
    """(the reasoning up to and including ``</think>``, the answer after it), as rLLM's agents split
    a reply: only when ``</think>`` occurs exactly once."""
    if response.count("</think>") == 1:
        thought, marker, answer = response.partition("</think>")
        return thought + marker, answer.strip()
    return None, response.strip()


def _without_old_thinking(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy where every assistant turn but the last keeps only what follows its ``</think>``."""
    messages = copy.deepcopy(messages)
    for message in messages[:-1]:
        if message["role"] == "assistant":
            _, marker, after = message["content"].partition("</think>")
            if marker:
                message["content"] = after
    return messages


class ToolAgent(BaseAgent):
    """rLLM's tool agent. Its system turn is ``system_prompt`` followed by the tools' description;
    a reply's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks become the action,
    a list of OpenAI-style calls (``{"id", "type": "function", "function": {"name", "arguments"}}``,
    arguments as a JSON string); a reply without a valid call becomes a call of ``finish`` with the
    reply as its ``response``. The environment's ``{"tool_outputs": {call id: text}}`` come back as
    ``tool`` messages; a ``{"question": ...}`` or a string observation as a user message.

    ``tools`` names registered tools (``["python"]``); ``tool_map`` maps names to ``Tool``
    classes of your own (not both). ``parser_name``: ``qwen`` (the Hermes format).
    """

    def __init__(self, system_prompt: str = TOOL_SYSTEM_PROMPT, parser_name: str = "qwen",
                 tools: list[str] | None = None, tool_map: dict[str, type[Tool]] | None = None) -> None:
        _check_parser(type(self).__name__, parser_name)
        self.system_prompt = system_prompt
        self.tools = MultiTool(tools=tools, tool_map=tool_map) if (tools is not None or tool_map is not None) else MultiTool(tools=[])
        self.tools_prompt = tools_prompt(self.tools.json) if self.tools.tool_map else ""
        self.current_observation: Any = None
        self.reset()

    def reset(self) -> None:
        self._trajectory = Trajectory()
        system = "\n\n".join(part for part in (self.system_prompt.rstrip(), self.tools_prompt) if part)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]

    @property
    def chat_completions(self) -> list[dict[str, Any]]:
        return self.messages

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
        self.messages.extend(self._as_messages(observation))
        self.current_observation = observation
        if self._trajectory.steps:
            step = self._trajectory.steps[-1]
            step.reward, step.done, step.info = reward, done, info

    @staticmethod
    def _as_messages(observation: Any) -> list[dict[str, Any]]:
        if isinstance(observation, dict):
            if "question" in observation:
                return [{"role": "user", "content": observation["question"]}]
            if "tool_outputs" in observation:
                return [{"role": "tool", "content": text, "tool_call_id": call_id}
                        for call_id, text in observation["tool_outputs"].items()]
            return []
        if isinstance(observation, str):
            return [{"role": "user", "content": observation}]
        return [{"role": "user", "content": str(observation)}] if observation else []

    def update_from_model(self, response: str, **kwargs: Any) -> Action:
        calls = [
            {"id": str(uuid.uuid4()), "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for call in parse_tool_calls(response) if call.error is None
        ]
        if not calls:  # no (valid) call: the reply is the answer
            calls = [{"id": str(uuid.uuid4()), "type": "function", "function": {"name": "finish", "arguments": {"response": response}}}]
        self.messages.append({"role": "assistant", "content": response})
        self._trajectory.steps.append(Step(
            chat_completions=copy.deepcopy(self.messages), action=calls, model_response=response,
            observation=self.current_observation,
        ))
        return Action(action=calls)


class MCPToolAgent(ToolAgent):
    """rLLM's ``MCPToolAgent``: a ``ToolAgent`` whose tools are an MCP server's, given as the
    ``tool_map`` of a started ``MCPConnectionManager`` (name -> ``MCPTool``; a list of tools, or any
    tool objects with a ``json`` schema, work too). The agent only describes the tools to the model;
    ``MCPEnvironment`` calls them. A tool listed under two names (rLLM's underscore alias of a
    hyphenated name) is described once, under the server's name."""

    def __init__(self, system_prompt: str = TOOL_SYSTEM_PROMPT, parser_name: str = "qwen",
                 tool_map: dict[str, Any] | list[Any] | None = None) -> None:
        _check_parser(type(self).__name__, parser_name)
        tools = list(tool_map.values()) if isinstance(tool_map, dict) else list(tool_map or [])
        if not tools or not all(isinstance(getattr(tool, "json", None), dict) for tool in tools):
            raise ValueError("MCPToolAgent needs tool_map: the MCP server's tools, as MCPConnectionManager(...).tool_map "
                             f"holds them after start() (name -> MCPTool), got {tool_map!r}.")
        schemas: list[dict[str, Any]] = []
        for tool in tools:
            if tool.json not in schemas:
                schemas.append(tool.json)
        self.system_prompt = system_prompt
        self.tool_map = tool_map
        self.tools_prompt = tools_prompt(schemas)
        self.current_observation = None
        self.reset()


def _check_parser(agent: str, parser_name: str) -> None:
    if parser_name not in TOOL_CALL_FORMATS:
        raise ValueError(f"{agent} parser_name {parser_name!r} is not available; tool calls are read in the "
                         f"<tool_call>{{json}}</tool_call> format: use one of {', '.join(TOOL_CALL_FORMATS)}.")


class _ReasoningChatAgent(BaseAgent):
    """A conversation whose earlier replies keep their reasoning only with ``accumulate_thinking``."""

    accumulate_thinking: bool

    def reset(self) -> None:
        self._trajectory = Trajectory()
        self.messages: list[dict[str, Any]] = []

    @property
    def chat_completions(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.messages) if self.accumulate_thinking else _without_old_thinking(self.messages)

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory


class MathAgent(_ReasoningChatAgent):
    """rLLM's math agent: the question (a string, or a dict's ``question``) as a user message, the
    reply as the action, with reasoning before a single ``</think>`` kept apart as ``Step.thought``.
    An empty observation (``None`` or ``{}``) only records the reward on the current step. With
    ``accumulate_thinking=False`` earlier replies are sent back without their reasoning."""

    def __init__(self, accumulate_thinking: bool = True) -> None:
        self.accumulate_thinking = accumulate_thinking
        self.reset()

    def get_current_state(self) -> Step:
        if not self._trajectory.steps:
            raise ValueError("MathAgent has no step yet: update_from_env must give it the question first.")
        return self._trajectory.steps[-1]

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
        if observation is None or observation == {}:  # the reward for the current step
            if self._trajectory.steps:
                step = self._trajectory.steps[-1]
                step.reward, step.done, step.info = reward, done, info
            return
        if isinstance(observation, dict):
            if "question" not in observation:
                raise ValueError(f"MathAgent: the observation has no 'question' field (fields: {sorted(observation)}).")
            question = observation["question"]
        elif isinstance(observation, str):
            question = observation
        else:
            raise ValueError(f"MathAgent: an observation must be a question string or a dict with 'question', got {type(observation).__name__}.")
        self.messages.append({"role": "user", "content": question})
        self._trajectory.steps.append(Step(observation=question))

    def update_from_model(self, response: str, **kwargs: Any) -> Action:
        self.messages.append({"role": "assistant", "content": response})
        step = self.get_current_state()
        step.chat_completions = self.chat_completions
        step.model_response = response
        step.thought, answer = _split_thinking(response)
        step.action = Action(answer)
        return step.action


def _shorten(value: Any, length: int = 300) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= length else text[: length // 2] + "...(truncated) ..." + text[-length // 2:]


class CompetitionCodingAgent(_ReasoningChatAgent):
    """rLLM's competition-coding agent: the problem (``{"question": ...}``) first; later
    observations carry ``test_results`` (dicts with ``input``, ``expected``, ``output``, ``passed``,
    ``error_message``), reported back as the first ``max_tests`` failures, or an ``error``. With
    ``public_test_only`` only tests whose input appears in the problem statement are reported (the
    first two when none does). Earlier replies lose their reasoning unless ``accumulate_thinking``."""

    ALL_PASSED = ("All the test cases pass. Check the solution once more for edge cases, then give your final code.")
    NO_TESTS = ("There are no test cases to report. Check the solution once more for correctness and speed, then "
                "give your final code.")
    SOME_FAILED = ("These test cases still fail. Work out what the failures have in common, fix the code so that "
                   "every case passes, and give the final code.")

    def __init__(self, accumulate_thinking: bool = False, max_tests: int = 2, public_test_only: bool = False) -> None:
        self.accumulate_thinking = accumulate_thinking
        self.max_tests = max_tests
        self.public_test_only = public_test_only
        self.reset()

    def format_test_results(self, test_results: list[dict]) -> str:
        """The feedback the model reads after an attempt."""
        if not self._trajectory.steps:
            return self.NO_TESTS
        if self.public_test_only:
            test_results = self._public(test_results)
            if not test_results:
                return self.NO_TESTS
        lines, failed = [], 0
        for number, test in enumerate(test_results, 1):
            if test.get("passed"):
                continue
            lines.append(f"### Test {number} failed\n  Input: {_shorten(test.get('input'))}\n  Expected: {_shorten(test.get('expected'))}\n")
            if test.get("output") is not None:
                lines.append(f"  Actual: {_shorten(test['output'])}\n\n")
            if test.get("error_message") is not None:
                lines.append(f"  Error message: {_shorten(test['error_message'])}\n")
            failed += 1
            if failed >= self.max_tests:
                break
        if not failed:
            return self.ALL_PASSED
        return "Results on the public test cases:\n" + "".join(lines) + "\n" + self.SOME_FAILED

    def _public(self, test_results: list[dict]) -> list[dict]:
        def squeezed(text: str) -> str:
            return "".join(text.split())

        statement = squeezed(str(self._trajectory.steps[0].observation))
        public = []
        for test in test_results:
            if not isinstance(test, dict) or "input" not in test:
                continue
            given = test["input"]
            parts = [str(p) for p in given] if isinstance(given, list) else str(given).split("\n")
            if all(squeezed(part) in statement for part in parts):
                public.append(test)
        return public or test_results[:2]

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
        if not self._trajectory.steps:
            if not (isinstance(observation, dict) and "question" in observation):
                raise ValueError("CompetitionCodingAgent: the first observation must be a dict with the problem under 'question'.")
            text = str(observation["question"])
        elif isinstance(observation, dict) and "test_results" in observation:
            text = self.format_test_results(observation["test_results"])
        elif isinstance(observation, dict) and "error" in observation:
            text = str(observation["error"])
        else:
            text = str(observation)
        if self._trajectory.steps:
            step = self._trajectory.steps[-1]
            step.reward, step.done, step.info = reward, done, info
        if done:
            return
        self.messages.append({"role": "user", "content": text})
        self._trajectory.steps.append(Step(observation=text))

    def update_from_model(self, response: str, **kwargs: Any) -> Action:
        self.messages.append({"role": "assistant", "content": response})
        step = self._trajectory.steps[-1]
        step.chat_completions = self.chat_completions
        step.model_response = response
        step.thought, answer = _split_thinking(response)
        step.action = Action(answer)
        return step.action
