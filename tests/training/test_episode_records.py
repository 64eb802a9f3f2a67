"""What an episode records for a person to read (the run page's episode viewer shows exactly this):
each turn's prompt as the model read it, its reply and token count, and the environment's answer
to it, in every turn loop (the rollout engine's, rLLM's multi-turn workflow's) and for TRL's own
single-turn generation.

The turn loops run against ``ScriptedGenerator``, a stand-in for the model that answers given
texts, so the recorded turns are known exactly; the single-turn test trains the real tiny model
one step with TRL."""

from __future__ import annotations

import pytest

import examples  # noqa: F401  (registers the examples' datasets)
from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv
from training import AgentTrainer
from training.agents.base import BaseEnv
from training.agents.spec import AgentSpec
from training.compat.aworld.agents import Agent
from training.config import Config
from training.rollouts.episode_runner import EpisodeRunner
from training.rollouts.generation import GenerationOutput
from training.rendering import encode
from training.rewards import load_reward
from training.rollouts.tiny import build_char_tokenizer
from training.agents.workflow import CumulativeWorkflow

TOKENIZER = build_char_tokenizer()


class ScriptedGenerator:
    """Stands in for the model: answers each call with the next scripted text and EOS."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = list(texts)

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        ids = (encode(TOKENIZER, self.texts.pop(0)) + [TOKENIZER.eos_token_id])[:max_new_tokens]
        return GenerationOutput(text=TOKENIZER.decode(ids, skip_special_tokens=True), prompt_ids=list(prompt_ids),
                                completion_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


def run(spec: AgentSpec, replies: list[str], task: dict, reward_fn=None):
    config = Config.build({"rllm.agent.max_steps": 4, "rllm.agent.max_tokens_per_turn": 200,
                           "data.max_prompt_length": 4000, "data.max_response_length": 1000})
    [episode] = EpisodeRunner(spec.validate(), ScriptedGenerator(replies), TOKENIZER, config, reward_fn).run([task])
    return episode


def test_each_turn_records_the_environments_reply_not_the_turns_input():
    # From row 2, column 2: down to 32, then right onto the goal (33).
    spec = AgentSpec(agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv)
    episode = run(spec, ["D", "R"], {"start_row": 2, "start_col": 2})

    first, second = episode.trajectories[0].steps
    # The example agent keeps rLLM's meaning of ``observation``: what it acted on.
    assert first.observation == "22>" and second.observation == "32>"
    assert first.next_observation == "32>" and second.next_observation == "33>"
    assert second.done and episode.termination_reason.value == "env_done"
    recorded = episode.to_dict()["trajectories"][0]["steps"]
    assert [turn["next_observation"] for turn in recorded] == ["32>", "33>"]


class Echo(BaseEnv):
    """Asks "Q?" and answers each action with "heard <move>"; done after two actions."""

    def __init__(self) -> None:
        self.turns = 0

    @staticmethod
    def from_dict(info: dict) -> "Echo":
        return Echo()

    def reset(self, task: dict | None = None):
        self.turns = 0
        return "Q?", {}

    def step(self, action):
        self.turns += 1
        return f"heard {action.action}", 1.0, self.turns == 2, {}  # rLLM's workflows hand over the Action


def test_rllms_multi_turn_workflow_records_the_reply_too():
    spec = AgentSpec(workflow_class=CumulativeWorkflow, workflow_args={"agent_cls": FrozenLakeAgent, "env_cls": Echo})
    episode = run(spec, ["a", "b"], {"question": "-"})

    steps = episode.trajectories[0].steps
    assert [step.next_observation for step in steps] == ["heard A", "heard B"]
    assert [step.observation for step in steps] == ["Q?", "heard A"]


def test_a_chat_agents_turns_keep_its_system_prompt_and_the_tool_results():
    agent = Agent(name="calculator", system_prompt="You are a careful calculator.", tool_names=["examples.arithmetic.add"])

    exact = load_reward(lambda task, answer: float(answer.strip() == "5"))
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    episode = run(agent.to_spec(exact), [call, "5"], {"prompt": "What is 2 + 3?"}, exact)

    first, second = episode.trajectories[0].steps
    assert first.chat_completions[0]["role"] == "system"
    assert first.chat_completions[0]["content"].startswith("You are a careful calculator.")
    assert first.chat_completions[1] == {"role": "user", "content": "What is 2 + 3?"}
    [result] = first.next_observation
    assert result["role"] == "tool" and "5" in result["content"]
    assert second.next_observation is None and episode.trajectories[0].reward == 1.0


@pytest.mark.slow
def test_trl_single_turn_episodes_record_the_prompt_and_the_trained_tokens(tmp_path, sink):
    AgentTrainer(
        train_dataset=[{"prompt": "x=", "answer": "a"}, {"prompt": "y=", "answer": "a"}],
        reward_func=lambda task, response: float(response.startswith(task["answer"])), backend="trl",
        run_path=str(tmp_path), sinks=[sink],
        config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                "data.max_response_length": 3, "trainer.total_training_steps": 1, "trainer.logger": []},
    ).train()

    assert sink.episodes
    for episode in sink.episodes:
        [turn] = episode["trajectories"][0]["steps"]
        assert turn["chat_completions"] == [{"role": "user", "content": episode["task"]["prompt"]}]
        assert turn["observation"] is None and turn["next_observation"] is None  # no environment answered
        assert 1 <= len(turn["response_ids"]) <= 3
        assert episode["response_ids"] == turn["response_ids"] and episode["response_mask"] == [1] * len(turn["response_ids"])
        assert episode["task"]["answer"] == "a"  # the dataset row stays the episode's task
