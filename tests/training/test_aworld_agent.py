"""AWorld's agents: the agent YAML (system prompt, model config, Python tools) as a chat agent with
tool calls, trained on the trl backend; AWorld's own agent YAML, GAIA reward file and GAIA data
(``aworld_examples/``, only the reward file's import line changed); one test per bad input.

Two tests drive the rollout engine with ``ScriptedGenerator``, a stand-in for the model that writes
given replies, so that tool calls happen on cue (a randomly initialised tiny model never writes
one); everything else in them (agent, environment, tools, tokenizer, reward) is real.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

import examples  # noqa: F401  (registers the arithmetic dataset)
from training import Agent, AgentConfig, AgentTrainer
from training.compat.aworld.agents import chat_agent_from, load_agents_from_yaml
from training.config import Config
from training.rollouts.generation import GenerationOutput
from training.rendering import encode
from training.rewards import load_reward
from training.rollouts.episode_runner import EpisodeRunner
from training.rollouts.tiny import build_char_tokenizer
from training.types import TerminationReason

EXAMPLES = Path(__file__).parent / "aworld_examples"
AGENTS_YAML = EXAMPLES / "agents.yaml"
GAIA_REWARD = EXAMPLES / "reward" / "gaia_reward_function.py"
GAIA_TRAIN = EXAMPLES / "gaia_data" / "sample_train.parquet"
GAIA_TEST = EXAMPLES / "gaia_data" / "sample_test.parquet"
TOKENIZER = build_char_tokenizer()


class ScriptedGenerator:
    """Stands in for the model: answers each call with the next scripted text and EOS."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = list(texts)
        self.prompts: list[str] = []

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        self.prompts.append(TOKENIZER.decode(prompt_ids))
        ids = (encode(TOKENIZER, self.texts.pop(0)) + [TOKENIZER.eos_token_id])[:max_new_tokens]
        return GenerationOutput(text=TOKENIZER.decode(ids, skip_special_tokens=True), prompt_ids=list(prompt_ids),
                                completion_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


def calculator_yaml(tmp_path: Path, **fields) -> Path:
    agent = {
        "system_prompt": "Use the tools, then answer in <answer></answer>.",
        "tool_names": ["examples.arithmetic.add", "examples.arithmetic.multiply"],
        **fields,
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"agents": {"calculator": agent}}))
    return path


def run_scripted(agent_path: Path, replies: list[str], task: dict):
    agent = chat_agent_from(str(agent_path))
    reward = load_reward(str(GAIA_REWARD))
    config = Config.build({"data.max_prompt_length": 4000, "data.max_response_length": 1000, "rllm.agent.max_tokens_per_turn": 200})
    generator = ScriptedGenerator(replies)
    engine = EpisodeRunner(agent.to_spec(reward).validate(), generator, TOKENIZER, config, reward)
    [episode] = engine.run([task])
    return episode, generator


def test_aworlds_agent_yaml_loads_with_its_variables(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    agents = load_agents_from_yaml(AGENTS_YAML)
    assert list(agents) == ["researcher", "summarizer"]
    researcher = agents["researcher"]
    assert researcher.system_prompt == "You specialize at researching."
    llm = researcher.conf.llm_config
    assert llm.llm_temperature == 0.1  # ${vars.DEFAULT_TEMPERATURE}, its type kept
    assert llm.fields["llm_base_url"] == "https://api.openai.com/v1" and llm.fields["llm_api_key"] == "sk-test"
    assert researcher.training_keys() == {"actor_rollout_ref.model.path": "gpt-4o", "actor_rollout_ref.rollout.temperature": 0.1}


def test_tool_calls_run_and_their_results_are_masked(tmp_path):
    episode, generator = run_scripted(
        calculator_yaml(tmp_path),
        ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "<answer>5</answer>"],
        {"prompt": "What is 2 + 3?", "ground_truth": "5", "data_source": "arithmetic-add"},
    )
    assert episode.termination_reason == TerminationReason.ENV_DONE and episode.error is None
    assert episode.reward == 1.0 and episode.is_correct  # AWorld's GAIA reward read the answer tag
    # The second call saw the system prompt with the tools, the question, the call and its result.
    assert '"name": "add"' in generator.prompts[0] and "What is 2 + 3?" in generator.prompts[0]
    assert generator.prompts[1].endswith('</tool_call></s>5')
    trained = TOKENIZER.decode([t for t, m in zip(episode.response_ids, episode.response_mask) if m == 1])
    from_env = TOKENIZER.decode([t for t, m in zip(episode.response_ids, episode.response_mask) if m == 0])
    assert trained == '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call></s><answer>5</answer></s>'
    assert from_env == "5"  # the tool's result: environment tokens, never trained on
    steps = episode.trajectories[0].steps
    assert [s.action for s in steps] == [
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "error": None}]}, {"answer": "<answer>5</answer>"},
    ]
    assert steps[0].observation == [{"role": "tool", "name": "add", "content": "5"}]


def test_tool_errors_go_back_to_the_model(tmp_path):
    episode, generator = run_scripted(
        calculator_yaml(tmp_path),
        ['<tool_call>{"name": "divide", "arguments": {}}</tool_call>',
         '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{"name": add}</tool_call>',
         "<answer>3</answer>"],
        {"prompt": "What is 1 + 2?", "ground_truth": "3"},
    )
    assert episode.termination_reason == TerminationReason.ENV_DONE and episode.reward == 1.0
    first, second = (step.observation for step in episode.trajectories[0].steps[:2])
    assert first[0]["content"] == "Error: there is no tool 'divide'; the tools are: add, multiply."
    assert second[0]["content"] == "Error: the arguments of add do not fit: b: missing (its arguments: a, b)"
    assert second[1]["content"].startswith("Error: the tool call is not valid JSON")


def starts_with_a(completions, prompts, **kwargs) -> list[float]:
    """A reward in TRL's batch form, as AWorld's TRL trainer takes them."""
    assert len(prompts) == len(completions) and kwargs["level"] == [1] * len(completions)
    return [1.0 if completion.startswith("a") else 0.0 for completion in completions]


def train_aworld_trl(directory: Path, seed: int = 0, extra: tuple[str, ...] = ()) -> dict:
    """AWorld's agents.yaml trained on TRL for 12 steps from the untrained tiny model (``seed`` seeds the
    trainer), the reward 1 for a reply that starts with "a", in ``directory``: the mean reward of the
    first and the last three steps. bench/learning_seeds.py runs this recipe over many seeds (``extra``,
    ``key=value``, tries others). At a learning rate of 2e-2 one seed in ten had not begun to rise by
    step 12 (bench/results/aworld_trl_seeds_lr2e-2.json); at 3e-2 each rose by 0.73 or more."""
    from learning_recipes import RecordingSink, overrides, reward_rise

    config = {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.temperature": 1.0,
        "actor_rollout_ref.actor.optim.lr": 3e-2, "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4,
        "data.max_response_length": 2, "rllm.agent.max_tokens_per_turn": 2, "trainer.total_training_steps": 12,
        "trainer.logger": [], "trainer.seed": seed, **overrides(extra),
    }
    sink = RecordingSink()
    result = AgentTrainer(agent=str(AGENTS_YAML), train_dataset=[{"prompt": p, "level": 1} for p in "wxyz"],
                          reward_func=starts_with_a, config=config, run_path=str(directory), sinks=[sink],
                          train_engine_name="trl").train()
    return reward_rise(sink, result)


@pytest.mark.slow
def test_aworlds_agent_yaml_trains_on_trl_and_reward_rises(tmp_path, caplog):
    """The recipe learns on every seed of bench/learning_seeds.py (bench/results/aworld_trl_seeds.json)."""
    with caplog.at_level(logging.INFO, logger="training"):
        trained = train_aworld_trl(tmp_path)
    result, sink = trained["result"], trained["sink"]
    assert "training the first, 'researcher'" in caplog.text
    assert "agent researcher sets actor_rollout_ref.model.path='gpt-4o'" in caplog.text  # under the config's tiny-char
    assert result.steps == 12
    assert all(m["termination/error"] == 0 for m in sink.metrics)
    assert trained["after"] > trained["before"] + 0.3, [m["reward"] for m in sink.metrics]
    before = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    messages = sink.episodes[-1]["trajectories"][0]["steps"][0]["chat_completions"]
    assert messages[0] == {"role": "system", "content": "You specialize at researching."}
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert written["agent"]["name"] == "researcher" and "llm_api_key" not in written["agent"]["llm_config"]
    assert written["actor_rollout_ref"]["model"]["path"] == "tiny-char"
    assert written["actor_rollout_ref"]["rollout"]["temperature"] == 1.0


@pytest.mark.slow
def test_aworlds_gaia_reward_file_and_data_train_and_validate(tmp_path, sink):
    reward = load_reward(str(GAIA_REWARD))
    assert reward.name == "gaia_reward_func" and reward.style == "verl"
    row = {"reward_model": {"ground_truth": "egalitarian"}, "data_source": "gaia_dataset"}
    assert reward(row, "<answer>Egalitarian</answer>").reward == 1.0 and reward(row, "<answer>x</answer>").reward == 0.0

    trainer = AgentTrainer(
        agent=str(AGENTS_YAML), train_dataset=str(GAIA_TRAIN), test_dataset=str(GAIA_TEST), reward_func=str(GAIA_REWARD),
        run_path=str(tmp_path), sinks=[sink], train_engine_name="trl",
        config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                "data.max_prompt_length": 1024, "data.max_response_length": 8, "rllm.agent.max_tokens_per_turn": 8,
                "trainer.total_training_steps": 2, "trainer.test_freq": 2, "data.val_batch_size": 4, "trainer.logger": []},
    )
    result = trainer.train()
    assert result.steps == 2
    assert all(m.get("termination/error", 0) == 0 for m in sink.metrics)
    validation = {m["step"]: m for m in sink.metrics if "val/gaia_dataset/reward" in m}
    assert sorted(validation) == [0, 2]  # before training, then at test_freq (the last step)
    assert validation[2]["val/gaia_dataset/pass@1"] == 0.0  # an untrained tiny model does not solve GAIA
    assert sink.episodes and sink.episodes[0]["task"]["reward_model"]["style"] == "GAIA"


def test_agent_objects_as_aworld_code_builds_them(tmp_path):
    agent = Agent(name="calc", desc="calc", system_prompt="Compute.", tool_names=["examples.arithmetic.add"],
                  conf=AgentConfig(llm_temperature=0.7, max_steps=2))
    trainer = AgentTrainer(agent=agent, train_dataset="arithmetic:train", reward_func="math", run_path=str(tmp_path),
                           config={"actor_rollout_ref.model.path": "tiny-char"}, train_engine_name="trl")
    config = trainer.final_config
    assert config.actor_rollout_ref.rollout.temperature == 0.7 and config.rllm.agent.max_steps == 2
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["agent"]["tool_names"] == ["examples.arithmetic.add"]


def test_one_agents_own_fields_as_aworlds_trainers_read_an_agent_yaml(tmp_path):
    """AWorld's verl trainer: ``if isinstance(agent, str): agent = Agent(**load_config(agent))``."""
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"name": "calc", "desc": "calc", "system_prompt": "Compute.",
                                    "tool_names": ["examples.arithmetic.add"],
                                    "conf": {"llm_config": {"llm_temperature": 0.7}, "max_steps": 2}}))
    trainer = AgentTrainer(agent=str(path), train_dataset="arithmetic:train", reward_func="math", run_path=str(tmp_path),
                           config={"actor_rollout_ref.model.path": "tiny-char"}, train_engine_name="trl")
    config = trainer.final_config
    assert config.actor_rollout_ref.rollout.temperature == 0.7 and config.rllm.agent.max_steps == 2
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["agent"]["tool_names"] == ["examples.arithmetic.add"]


def test_an_agent_yaml_of_no_known_form_says_which_forms_there_are(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"agent_name": "calc", "prompt": "Compute."}))
    with pytest.raises(ValueError, match=r"Unknown agent field\(s\) \['agent_name', 'prompt'\].*AWorld's agent YAML \(an 'agents:' "
                                         r"section .*or one agent's own fields: name, desc, system_prompt, conf"):
        AgentTrainer(agent=str(path), train_dataset="arithmetic:train", reward_func="math", run_path=str(tmp_path))


def undocumented(a: int) -> int:
    return a


@pytest.mark.parametrize("fields, message", [
    ({"tool_name": ["examples.arithmetic.add"]}, "agent 'calculator': unknown field(s) 'tool_name' (did you mean 'tool_names'?)"),
    ({"mcp_servers": ["gaia_server"]}, "agent 'calculator': mcp_servers names ['gaia_server'] but there is no mcp_config"),
    ({"tool_names": ["examples.arithmetic.subtract"]}, "agent 'calculator': Cannot load tool 'examples.arithmetic.subtract': module has no attribute 'subtract'"),
    ({"tool_names": [f"{__name__}.undocumented"]}, f"agent 'calculator': tool '{__name__}.undocumented': Cannot generate JSON schema"),
    ({"tool_names": "examples.arithmetic.add"}, "agent 'calculator': tool_names must be a list of tools"),
    ({"llm_config": {"llm_temprature": 0.5}}, "agent 'calculator': llm_config: unknown field(s) 'llm_temprature' (did you mean 'llm_temperature'?)"),
    ({"llm_config": {"llm_temperature": -1}}, "agent 'calculator': llm_config.llm_temperature must be a number of at least 0"),
    ({"config": {"top_kk": 80}}, "agent 'calculator': agent config: unknown field(s) 'top_kk' (did you mean 'top_k'?)"),
    ({"config": {"max_steps": 0}}, "agent 'calculator': agent config max_steps must be a whole number of at least 1"),
    ({"system_prompt": ["a", "b"]}, "agent 'calculator': system_prompt must be text"),
])
def test_bad_agent_yaml_fields_are_refused_named(tmp_path, fields, message):
    with pytest.raises(ValueError) as error:
        AgentTrainer(agent=str(calculator_yaml(tmp_path, **fields)), train_dataset="arithmetic:train", reward_func="math",
                     run_path=str(tmp_path), train_engine_name="trl")
    assert message in str(error.value)


@pytest.mark.parametrize("text, message", [
    ("agents: {}\n", "defines no agents under 'agents:'"),
    ("agents:\n  a: [1, 2]\n", "agent 'a': its fields must be a mapping"),
    ("agents: {a: {}}\nteams: {}\n", "unknown top-level key(s) ['teams']"),
    ("agents: {a: {system_prompt: 'x'\n", "is not valid YAML"),
])
def test_bad_agent_yaml_files_are_refused_named(tmp_path, text, message):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="^agent") as error:
        AgentTrainer(agent=str(path), train_dataset="arithmetic:train", reward_func="math", run_path=str(tmp_path))
    assert message in str(error.value)


def test_a_chat_agent_needs_a_reward(tmp_path):
    with pytest.raises(ValueError, match="^reward_func: the chat agent 'calculator' needs a reward function"):
        AgentTrainer(agent=str(calculator_yaml(tmp_path)), train_dataset="arithmetic:train", run_path=str(tmp_path))


def test_a_dataset_without_the_prompt_is_named_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"the task has no 'question' field \(data.prompt_key\); its fields are \['data_source', 'ground_truth', 'prompt'\]"):
        AgentTrainer(agent=str(calculator_yaml(tmp_path)), train_dataset="arithmetic:train", reward_func="math",
                     run_path=str(tmp_path), config={"data.prompt_key": "question"})


def test_a_reward_that_raises_mid_training_fails_the_chat_agents_run_naming_it(tmp_path):
    from training.rollouts.outcomes import RewardFailed

    def picky(task, response):
        if response:
            raise ValueError("cannot parse the answer")
        return 0.0

    trainer = AgentTrainer(agent=str(AGENTS_YAML), train_dataset=[{"prompt": p} for p in "wxyz"], reward_func=picky,
                           run_path=str(tmp_path), train_engine_name="trl",
                           config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2,
                                   "data.train_batch_size": 2, "data.max_response_length": 2,
                                   "trainer.total_training_steps": 2, "trainer.logger": []})
    with pytest.raises(RewardFailed, match=r"^reward function picky raised ValueError: cannot parse the answer on the row \{'prompt': '\w'\} in step 1"):
        trainer.train()


def test_aworlds_top_k_in_an_agent_config_samples_with_top_k(tmp_path):
    """AWorld's GAIA example: ``AgentConfig(llm_provider="verl", top_k=80)``."""
    agent = Agent(name="gaia_agent", desc="gaia_agent", system_prompt="Gaia agent", conf=AgentConfig(llm_provider="verl", top_k=80))
    trainer = AgentTrainer(agent=agent, train_dataset="arithmetic:train", reward_func="math", run_path=str(tmp_path),
                           config={"actor_rollout_ref.model.path": "tiny-char"}, train_engine_name="trl")
    assert trainer.final_config.actor_rollout_ref.rollout.top_k == 80
