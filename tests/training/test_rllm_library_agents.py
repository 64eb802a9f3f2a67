"""Our rLLM library agents, environment and tools, turn by turn, without a model: what each
reply becomes, which tool runs, what the model reads back and how the answer is scored."""

from __future__ import annotations

import asyncio
import json

import pytest

from training import (
    CompetitionCodingAgent, MathAgent, MultiTool, RewardOutput, Tool, ToolAgent, ToolEnvironment, ToolOutput,
    tool_registry,
)
from training.rewards import math_reward_fn


class Adder(Tool):
    """A user-defined tool as rLLM's examples write one: a json property and forward."""

    def __init__(self, name: str = "add", description: str = "Add two integers.") -> None:
        super().__init__(name=name, description=description)

    @property
    def json(self):
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}

    def forward(self, a: int, b: int) -> ToolOutput:
        return ToolOutput(name=self.name, output=str(a + b))


class AsyncEcho(Tool):
    def __init__(self, name: str = "echo", description: str = "Echo the text.") -> None:
        super().__init__(name=name, description=description)

    @property
    def json(self):
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}

    async def async_forward(self, text: str) -> ToolOutput:
        await asyncio.sleep(0)
        return ToolOutput(name=self.name, output={"echo": text})


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def play(agent, env, replies):
    agent.reset()
    observation, info = env.reset()
    agent.update_from_env(observation, 0.0, False, info)
    results = []
    for reply in replies:
        action = agent.update_from_model(reply)
        results.append(env.step(action.action))
        agent.update_from_env(*results[-1])
    return results


def test_tool_agent_runs_the_python_tool_and_scores_the_final_answer():
    task = {"question": "What is 6*7?", "ground_truth": "42", "data_source": "math"}
    agent = ToolAgent(system_prompt="You are a math assistant.", tools=["python"])
    env = ToolEnvironment.from_dict({**task, "tools": ["python"], "reward_fn": math_reward_fn})
    assert agent.messages[0]["role"] == "system" and agent.messages[0]["content"].startswith("You are a math assistant.")
    assert '"name": "python"' in agent.messages[0]["content"] and "<tool_call>" in agent.messages[0]["content"]
    assert env.task == task  # the tools, reward and step limit are taken out of the row

    (tool_obs, reward, done, _), (final_obs, final_reward, final_done, info) = play(
        agent, env, ["Let me compute. " + call("python", code="print('side')\n6*7"), "It is \\boxed{42}"])
    [output] = tool_obs["tool_outputs"].values()
    assert (output, reward, done) == ("42", 0.0, False)
    assert [m["role"] for m in agent.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert agent.messages[3]["content"] == "42" and agent.messages[3]["tool_call_id"] in tool_obs["tool_outputs"]
    assert (final_obs, final_reward, final_done, info["is_correct"]) == ({}, 1.0, True, True)
    first, second = agent.trajectory.steps
    assert first.action[0]["function"] == {"name": "python", "arguments": json.dumps({"code": "print('side')\n6*7"})}
    assert second.action[0]["function"]["name"] == "finish" and second.reward == 1.0


def test_a_tool_map_of_user_tools_and_errors_the_model_reads():
    agent = ToolAgent(tool_map={"add": Adder, "echo": AsyncEcho})
    env = ToolEnvironment(task={"question": "2+3?"}, tool_map={"add": Adder, "echo": AsyncEcho},
                          reward_fn=lambda task, answer: RewardOutput(reward=float("5" in answer)), max_steps=3)
    results = play(agent, env, [
        call("add", a=2, b=3) + call("echo", text="hi") + call("missing") + call("add", a=1),
        "<tool_call>not json</tool_call>5",
    ])
    outputs = list(results[0][0]["tool_outputs"].values())
    assert outputs[0] == "5" and json.loads(outputs[1]) == {"echo": "hi"}
    assert outputs[2].startswith("Error: there is no tool 'missing'") and "add, echo" in outputs[2]
    assert outputs[3].startswith("Error: add raised TypeError")
    assert results[1][1:3] == (1.0, True)  # a malformed call is no call: the reply is the answer


def test_the_step_limit_ends_the_episode():
    env = ToolEnvironment(task={"question": "?"}, tools=["python"], reward_fn=math_reward_fn, max_steps=1)
    agent = ToolAgent(tools=["python"])
    [(observation, reward, done, _)] = play(agent, env, [call("python", code="1")])
    assert (observation, reward, done) == ({}, 0.0, True)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="not both"):
        ToolAgent(tools=["python"], tool_map={"add": Adder})
    with pytest.raises(ValueError, match="'nope' is not a registered tool"):
        MultiTool(tools=["nope"])
    with pytest.raises(ValueError, match="parser_name 'r1' is not available"):
        ToolAgent(parser_name="r1")
    with pytest.raises(ValueError, match="needs a reward function"):
        ToolEnvironment(task={}, tools=["python"])
    with pytest.raises(ValueError, match="subclass of training.Tool"):
        MultiTool(tool_map={"x": dict})
    assert "python" in tool_registry
    by_path = MultiTool(tool_map={"add": f"{__name__}.Adder"})  # as a registry entry's JSON names it
    assert by_path.forward(tool_name="add", a=1, b=2).to_string() == "3"


def test_a_tool_from_a_function():
    def multiply(a: int, b: int) -> int:
        """Multiply two numbers.

        Args:
            a: the first number
            b: the second number
        """
        return a * b

    tool = Tool(function=multiply)
    assert tool.name == "multiply" and tool.json["function"]["parameters"]["required"] == ["a", "b"]
    assert tool(a=3, b=4).to_string() == "12"
    assert tool.run({"a": 3}).error is not None


def test_math_agent_splits_reasoning_and_drops_old_reasoning_when_asked():
    agent = MathAgent(accumulate_thinking=False)
    agent.update_from_env({"question": "1+1?"}, 0.0, False, {})
    action = agent.update_from_model("two, I think</think> \\boxed{2}")
    step = agent.get_current_state()
    assert action.action == "\\boxed{2}" and step.thought == "two, I think</think>" and step.observation == "1+1?"
    agent.update_from_env({}, 1.0, True, {"is_correct": True})
    assert step.reward == 1.0 and step.done
    agent.update_from_env("2+2?", 0.0, False, {})
    agent.update_from_model("four</think>4")
    assert agent.chat_completions[1]["content"] == " \\boxed{2}" and agent.chat_completions[3]["content"] == "four</think>4"
    with pytest.raises(ValueError, match="no 'question' field"):
        agent.update_from_env({"prompt": "x"}, 0.0, False, {})


def test_competition_coding_agent_reports_the_failing_tests():
    agent = CompetitionCodingAgent(max_tests=1, public_test_only=True)
    agent.update_from_env({"question": "Read n, print n*2.\nExample input:\n3\n"}, 0.0, False, {})
    agent.update_from_model("print(int(input())*3)")
    tests = [{"input": "3", "expected": "6", "output": "9", "passed": False},
             {"input": "100", "expected": "200", "output": "300", "passed": False}]
    agent.update_from_env({"test_results": tests}, 0.0, False, {})
    feedback = agent.messages[-1]["content"]
    assert "### Test 1 failed" in feedback and "Expected: 6" in feedback and "Actual: 9" in feedback
    assert "Test 2" not in feedback  # only the public test (its input is in the statement)
    agent.update_from_model("print(int(input())*2)")
    agent.update_from_env({"test_results": [{**tests[0], "passed": True}]}, 1.0, True, {})
    assert agent.trajectory.steps[-1].reward == 1.0 and len(agent.trajectory.steps) == 2
