"""AWorld's function tools: ``@be_tool`` on a plain function and ``Agent(tool_names=[...])`` naming it.
AWorld's own example (``tests/fixtures/aworld_local_tool_run_decorator.py``, imports changed) trains
here; the tools run as every tool does: arguments checked against the signature first, and a call
that does not fit, or a tool that raises, answered to the model as the tool's result.

The episodes are driven by ``ScriptedGenerator`` (a stand-in for the model that writes given replies,
so that tool calls happen on cue); agent, environment, tools, tokenizer and reward are real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import Field

from test_aworld_agent import TOKENIZER, ScriptedGenerator
from training import AgentTrainer
from training.chat_agent import Agent
from training.config import Config
from training.rewards import load_reward
from training.rollouts.episode_runner import EpisodeRunner
from training.tools import be_tool
from training.types import TerminationReason

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import aworld_local_tool_run_decorator as example  # noqa: E402  (AWorld's example: registers hello_world)


@be_tool(tool_name="scale", desc="Multiply a number by a factor.")
def scale(x: int = Field(..., description="the number to multiply"), factor: int = Field(2, description="the factor")) -> int:
    return x * factor


@be_tool(name="shout")
def shout(text: str) -> str:
    raise RuntimeError(f"{text!r} is too loud")


def run_scripted(agent: Agent, replies: list[str], task: dict):
    reward = load_reward("exact_match")
    config = Config.build({"data.max_prompt_length": 4000, "data.max_response_length": 1000, "rllm.agent.max_tokens_per_turn": 200})
    generator = ScriptedGenerator(replies)
    engine = EpisodeRunner(agent.to_spec(reward).validate(), generator, TOKENIZER, config, reward)
    [episode] = engine.run([task])
    return episode, generator


def test_aworlds_be_tool_example_calls_its_tool():
    agent = example.build_agent()
    # AWorld's rule: "hello_world" also names the async class-based tool of that name, registered by
    # AWorld's other hello-world example (imported below); alone, the agent has the function only.
    assert [tool.name for tool in agent.tools if not tool.name.startswith("async_")] == ["hello_world"]
    episode, generator = run_scripted(
        agent, ['<tool_call>{"name": "hello_world", "arguments": {}}</tool_call>', "hello world!"],
        {"prompt": "use tool return hello world", "ground_truth": "hello world!"},
    )
    assert episode.termination_reason == TerminationReason.ENV_DONE and episode.error is None and episode.reward == 1.0
    assert '"description": "tool use example"' in generator.prompts[0] and '"name": "hello_world"' in generator.prompts[0]
    assert episode.trajectories[0].steps[0].observation == [{"role": "tool", "name": "hello_world", "content": "hello world!"}]


def test_aworlds_be_tool_example_trains(tmp_path, sink):
    trainer = AgentTrainer(agent=example.build_agent(), train_dataset=[{"prompt": "use tool return hello world", "ground_truth": "hello world!"}] * 2,
                           reward_func="exact_match", run_path=str(tmp_path), sinks=[sink], train_engine_name="trl",
                           config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                                   "data.max_prompt_length": 1024, "data.max_response_length": 8, "rllm.agent.max_tokens_per_turn": 8,
                                   "trainer.total_training_steps": 1, "trainer.logger": []})
    assert trainer.train().steps == 1
    assert all(m.get("termination/error", 0) == 0 for m in sink.metrics)


def test_arguments_are_checked_against_the_signature_and_failures_go_back_to_the_model():
    agent = Agent(name="calc", system_prompt="Use the tools.", tool_names=["scale", "shout"])
    episode, generator = run_scripted(agent, [
        '<tool_call>{"name": "scale", "arguments": {"x": "3"}}</tool_call>',
        '<tool_call>{"name": "scale", "arguments": {"x": "three"}}</tool_call>',
        '<tool_call>{"name": "scale", "arguments": {"factor": 3, "y": 1}}</tool_call>',
        '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>',
        "6",
    ], {"prompt": "What is 3 times 2?", "ground_truth": "6"})
    assert episode.termination_reason == TerminationReason.ENV_DONE and episode.error is None and episode.reward == 1.0
    said = [step.observation[0]["content"] for step in episode.trajectories[0].steps[:4]]
    assert said[0] == "6"  # "3" read as the int it is declared to be; factor's Field default
    assert said[1].startswith("Error: the arguments of scale do not fit: x: Input should be a valid integer")
    assert said[1].endswith("got 'three' (its arguments: x, factor (optional))")
    assert said[2] == ("Error: the arguments of scale do not fit: x: missing; y: not an argument of this tool "
                       "(its arguments: x, factor (optional))")
    assert said[3] == "Error: shout raised RuntimeError: 'hi' is too loud"
    assert '"description": "the number to multiply"' in generator.prompts[0]
    assert '"description": "Multiply a number by a factor."' in generator.prompts[0]


def test_a_documented_tool_is_checked_too():
    agent = Agent(name="calc", tool_names=["examples.arithmetic.add"])
    episode, _ = run_scripted(agent, ['<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "3"],
                              {"prompt": "What is 1 + 2?", "ground_truth": "3"})
    said = episode.trajectories[0].steps[0].observation[0]["content"]
    assert said.startswith("Error: the arguments of add do not fit: b: missing"), said


def no_return(x: int):
    return x


def test_be_tool_refuses_what_aworld_refuses():
    with pytest.raises(ValueError, match=r"^be_tool: no_return has no return annotation"):
        be_tool()(no_return)
    with pytest.raises(ValueError, match=r"^be_tool: .*<lambda> needs a name \(tool_name=...\)"):
        be_tool()(lambda: "x")

    def hello_world() -> str:
        return "another"

    with pytest.raises(ValueError, match=r"a tool named 'hello_world' is already registered"):
        be_tool(tool_name="hello_world")(hello_world)


def test_an_unknown_tool_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"tool 'hello' is neither a registered tool \(registered: .*hello_world"):
        Agent(name="a", tool_names=["hello"])


# -- AWorld's class-based tools --------------------------------------------------------------------

import aworld_local_tool_run as class_example  # noqa: E402  (AWorld's example: registers the hello_world tool class)
from training.tools import ActionFactory, ActionModel, ActionResult, ExecutableAction, ParamInfo, TemplateTool  # noqa: E402
from training.tools import ToolAction, ToolActionInfo, ToolFactory  # noqa: E402


def test_aworlds_class_based_tool_example_calls_its_action_named_as_aworld_names_it():
    agent = class_example.build_agent()
    # asyn=True: AWorld's prefix; "hello_world" names AWorld's be_tool example's function too (imported above)
    assert [tool.name for tool in agent.tools] == ["hello_world", "async_hello_world__hello_world"]
    episode, generator = run_scripted(agent, [
        '<tool_call>{"name": "async_hello_world__hello_world", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "async_hello_world__hello_world", "arguments": {"goal": "greet"}}</tool_call>',
        "hello world!",
    ], {"prompt": "use tool return hello world", "ground_truth": "hello world!"})
    assert episode.termination_reason == TerminationReason.ENV_DONE and episode.error is None and episode.reward == 1.0
    assert '"required": ["goal"]' in generator.prompts[0] and '"description": "hello world."' in generator.prompts[0]
    missing, answered = (step.observation[0]["content"] for step in episode.trajectories[0].steps[:2])
    assert missing == "Error: the arguments of async_hello_world__hello_world do not fit: goal: missing (its arguments: goal)"
    assert answered == "hello world!"


def test_aworlds_class_based_tool_example_trains(tmp_path, sink):
    trainer = AgentTrainer(agent=class_example.build_agent(), train_dataset=[{"prompt": "use tool return hello world", "ground_truth": "hello world!"}] * 2,
                           reward_func="exact_match", run_path=str(tmp_path), sinks=[sink], train_engine_name="trl",
                           config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                                   "data.max_prompt_length": 1024, "data.max_response_length": 8, "rllm.agent.max_tokens_per_turn": 8,
                                   "trainer.total_training_steps": 1, "trainer.logger": []})
    assert trainer.train().steps == 1
    assert all(m.get("termination/error", 0) == 0 for m in sink.metrics)


class CounterAction(ToolAction):
    ADD = ToolActionInfo(name="add", desc="Add to the count.", input_params={"n": ParamInfo(name="n", type="int", required=True, desc="how much")})
    RESET = ToolActionInfo(name="reset", desc="Start again.")


@ActionFactory.register(name="add", desc="Add to the count.", tool_name="counter")
class AddAction(ExecutableAction):
    def act(self, action: ActionModel, **kwargs) -> ActionResult:  # a synchronous action
        return ActionResult(content={"added": action.params["n"], "tool": action.tool_name})


@ActionFactory.register(name="reset", desc="Start again.", tool_name="counter")
class ResetAction(ExecutableAction):
    async def async_act(self, action: ActionModel, **kwargs):
        return ActionResult(error="the counter cannot be reset"), None


@ToolFactory.register(name="counter", desc="A counter.", supported_action=CounterAction)
class CounterTool(TemplateTool):
    pass


@ToolFactory.register(name="stateful_browser", desc="A browser.", supported_action=CounterAction)
class BrowserTool(TemplateTool):
    async def do_step(self, action, **kwargs):
        return None


class LonelyAction(ToolAction):
    LOOK = ToolActionInfo(name="look", desc="Look around.")


@ToolFactory.register(name="lonely", desc="No action registered.", supported_action=LonelyAction)
class LonelyTool(TemplateTool):
    pass


def test_each_action_is_a_tool_and_its_result_or_error_is_what_the_model_reads():
    agent = Agent(name="a", tool_names=["counter"])
    tools = {tool.name: tool for tool in agent.tools}
    assert list(tools) == ["counter__add", "counter__reset"]
    assert tools["counter__add"].schema["function"]["parameters"]["properties"]["n"]["type"] == "integer"
    assert tools["counter__add"].call({"n": 2}) == '{"added": 2, "tool": "counter"}'
    with pytest.raises(RuntimeError, match="the counter cannot be reset"):
        tools["counter__reset"].call({})


@pytest.mark.parametrize("tool, message", [
    ("stateful_browser", "AWorld tool 'stateful_browser' (BrowserTool) has its own do_step (BrowserTool): a tool with state of its own "
                         "between calls is not supported. Write each action as an ExecutableAction"),
    ("lonely", "AWorld tool 'lonely' (LonelyTool): action 'look' has no ExecutableAction: register one with "
               "@ActionFactory.register(name='look', tool_name='lonely')"),
])
def test_a_class_based_tool_that_cannot_run_here_is_refused_by_name_saying_what_to_do(tool, message):
    with pytest.raises(ValueError) as error:
        Agent(name="a", tool_names=[tool])
    assert str(error.value) == f"agent 'a': {message}" or str(error.value).startswith(f"agent 'a': {message}")
