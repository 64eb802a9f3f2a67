"""AgentTrainer's two calling styles and the error each kind of bad input gets, before training."""

import threading
from typing import Any

import pytest

import examples  # noqa: F401  (registers the example datasets)
from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv
from training import AgentTrainer, ConfigError
from training.agents.base import BaseEnv
from training.agents.spec import AgentSpec

TINY = {"actor_rollout_ref.model.path": "tiny-char", "trainer.logger": []}
FROZENLAKE = {"agent_class": "examples.frozenlake.FrozenLakeAgent", "env_class": "examples.frozenlake.FrozenLakeEnv"}


def build(tmp_path, **kwargs):
    kwargs.setdefault("backend", "trl")
    kwargs.setdefault("run_path", str(tmp_path))
    kwargs.setdefault("config", TINY)
    return AgentTrainer(**kwargs)


def test_rllm_style_with_classes(tmp_path):
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv

    trainer = build(tmp_path, agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv,
                    train_dataset="frozenlake:train", config=["actor_rollout_ref.model.path=tiny-char"])
    spec = trainer.train_processor.agent_spec
    assert spec.kind == "agent_env" and spec.env_class is FrozenLakeEnv
    assert trainer.final_config.actor_rollout_ref.model.path == "tiny-char"
    assert (tmp_path / "config.yaml").read_text().startswith("backend: trl\nagent:\n  kind: agent_env")


def test_aworld_style_with_paths(tmp_path):
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text("agent_class: examples.frozenlake.FrozenLakeAgent\nenv_class: examples.frozenlake.FrozenLakeEnv\n")
    trainer = build(tmp_path, agent=str(agent_file), train_dataset="frozenlake:train",
                    test_dataset="frozenlake:test", train_engine_name="trl")
    assert trainer.train_engine_name == "trl"
    assert len(trainer.train_processor.test_dataset) == 64


def test_workflow_class_given_as_import_path(tmp_path):
    trainer = build(tmp_path, workflow_class="examples.countdown_workflow.CountdownWorkflow",
                    workflow_args={"attempts": 1}, train_dataset="countdown:train")
    assert trainer.train_processor.agent_spec.kind == "workflow"


def test_misspelt_config_key(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean 'trainer.total_training_steps'"):
        build(tmp_path, train_dataset="copy:train", reward_func="char_accuracy",
              config={**TINY, "trainer.total_train_steps": 3})


def test_config_value_of_the_wrong_type(tmp_path):
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.n: expected a whole number"):
        build(tmp_path, train_dataset="copy:train", reward_func="char_accuracy",
              config={**TINY, "actor_rollout_ref.rollout.n": "many"})


def test_dataset_without_the_prompt_column(tmp_path):
    with pytest.raises(ValueError, match=r"train_dataset is missing column\(s\) 'prompt'.*question.*data.prompt_key"):
        build(tmp_path, train_dataset=[{"question": "2+2", "ground_truth": "4"}], reward_func="exact_match")


def test_dataset_without_the_answer_column(tmp_path):
    with pytest.raises(ValueError, match="ground_truth"):
        build(tmp_path, train_dataset=[{"prompt": "2+2="}], reward_func="exact_match")


def test_column_mapping_through_config(tmp_path):
    trainer = build(tmp_path, train_dataset=[{"question": "2+2=", "answer": "4"}], reward_func="exact_match",
                    config={**TINY, "data.prompt_key": "question", "data.answer_key": "answer", "data.train_batch_size": 1})
    assert trainer.train_processor.reward_fn({"answer": "4"}, "4").reward == 1.0


def test_missing_dataset_file(tmp_path):
    with pytest.raises(ValueError, match="train_dataset.*missing.csv"):
        build(tmp_path, train_dataset=str(tmp_path / "missing.csv"), reward_func="exact_match")


def test_agent_class_that_does_not_import(tmp_path):
    with pytest.raises(ValueError, match="Cannot load agent_class 'no_such_package.Agent'.*no_such_package"):
        build(tmp_path, agent_class="no_such_package.Agent", env_class="examples.frozenlake.FrozenLakeEnv",
              train_dataset="frozenlake:train")


def test_agent_class_of_the_wrong_kind(tmp_path):
    with pytest.raises(ValueError, match="agent_class must be a subclass of BaseAgent"):
        build(tmp_path, agent_class="examples.frozenlake.FrozenLakeEnv", env_class="examples.frozenlake.FrozenLakeEnv",
              train_dataset="frozenlake:train")


def test_env_that_cannot_be_built_from_the_dataset(tmp_path):
    with pytest.raises(ValueError, match="train_dataset .*FrozenLakeEnv.from_dict needs 'start_row', which the dataset row does not have .*"
                                         "Add a 'start_row' column"):
        build(tmp_path, **{k: v for k, v in FROZENLAKE.items()}, train_dataset=[{"prompt": "no start cell here"}])


def test_misspelt_agent_args_key_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"agent_class FrozenLakeAgent could not be built with agent_args \(max_stepz\) "
                                         r"and reset: TypeError: .*unexpected keyword argument 'max_stepz'"):
        build(tmp_path, **FROZENLAKE, agent_args={"max_stepz": 3}, train_dataset="frozenlake:train")


class EnvWhoseServerIsDown(FrozenLakeEnv):
    @staticmethod
    def from_dict(info: dict):
        raise ConnectionError("the search server did not start")


def test_construction_errors_name_the_arguments_never_their_values(tmp_path):
    # rLLM's MCP example passes its search API key in env_args; the error is shown on the run page.
    with pytest.raises(ValueError, match=r"env_args \(mcp_server_env\): "
                                         r"ConnectionError: the search server did not start") as error:
        build(tmp_path, agent_class=FROZENLAKE["agent_class"], env_class=EnvWhoseServerIsDown,
              env_args={"mcp_server_env": {"TAVILY_API_KEY": "tvly-secret"}}, train_dataset="frozenlake:train")
    assert "tvly-secret" not in str(error.value)


def test_dataset_smaller_than_one_batch_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text('{"prompt": "x=", "ground_truth": "x"}\n')
    with pytest.raises(ValueError, match=f"train_dataset: {path} has 1 row\\(s\\), fewer than one batch \\(data.train_batch_size=2\\)"):
        build(tmp_path, train_dataset=str(path), reward_func="exact_match", config={**TINY, "data.train_batch_size": 2})


def test_a_reward_an_agent_env_run_would_never_call_is_refused(tmp_path):
    with pytest.raises(ValueError, match="reward_func: .* reward function exact_match would never be called"):
        build(tmp_path, **FROZENLAKE, train_dataset="frozenlake:train", reward_func="exact_match")


def test_reward_that_raises(tmp_path):
    def broken(task, response):
        raise ZeroDivisionError("oops")

    with pytest.raises(ValueError, match="reward function broken raised ZeroDivisionError"):
        build(tmp_path, train_dataset="copy:train", reward_func=broken)


def test_reward_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="exact_match"):  # the error lists the built-in names
        build(tmp_path, train_dataset="copy:train", reward_func="exakt_match")


def test_single_turn_task_needs_a_reward(tmp_path):
    with pytest.raises(ValueError, match="reward_func: a single-turn task needs a reward function"):
        build(tmp_path, train_dataset="copy:train")


def test_agent_given_two_ways(tmp_path):
    with pytest.raises(ValueError, match="either as agent= or as workflow_class"):
        build(tmp_path, agent=AgentSpec(), agent_class="x.Y", train_dataset="copy:train")


def test_unknown_backend(tmp_path):
    with pytest.raises(ValueError, match="Unknown training backend 'openrlhf'; known backends"):
        build(tmp_path, backend="openrlhf", train_dataset="copy:train", reward_func="char_accuracy")


def test_verl_without_gpu_says_to_choose_trl(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="the verl backend needs CUDA GPUs; this worker has none; choose trl"):
        build(tmp_path, backend="verl", train_dataset="copy:train", reward_func="char_accuracy")


def test_model_path_missing(tmp_path):
    trainer = build(tmp_path, train_dataset="copy:train", reward_func="char_accuracy", config={"trainer.logger": []})
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path: no model given"):
        trainer.train()


def test_a_wrong_dataset_and_a_wrong_reward_are_said_together(tmp_path):
    from training.errors import Problems

    with pytest.raises(Problems) as raised:
        build(tmp_path, **FROZENLAKE, train_dataset="copy:train", reward_func="exact_match")
    said = [str(problem) for problem in raised.value.problems]
    assert len(said) == 2 and "start_row" in said[0] and said[1].startswith("reward_func: an agent_class/env_class run")
    assert str(raised.value) == "\n".join(said)  # one a line, for the CLI


def test_one_problem_is_raised_as_itself(tmp_path):
    with pytest.raises(ValueError, match="reward_func: a single-turn task needs a reward function") as raised:
        build(tmp_path, train_dataset="copy:train")
    assert type(raised.value) is ValueError


class AgentThatForgetsItsAction(FrozenLakeAgent):
    def update_from_model(self, response, **kwargs):
        super().update_from_model(response, **kwargs)  # records the step, returns nothing


class AgentThatCannotReadAReply(FrozenLakeAgent):
    def update_from_model(self, response, **kwargs):
        return {"move": response.split()[0]}  # an empty reply has no first word


def test_an_agent_that_returns_no_action_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"AgentThatForgetsItsAction.update_from_model returned None for a model reply: it must "
                                         r"return the action to take .*step\(None\) every turn"):
        build(tmp_path, **{**FROZENLAKE, "agent_class": AgentThatForgetsItsAction}, train_dataset="frozenlake:train")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_agent_that_fails_on_a_reply_a_model_can_write_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"AgentThatCannotReadAReply failed its first turn .*IndexError"):
        build(tmp_path, **{**FROZENLAKE, "agent_class": AgentThatCannotReadAReply}, train_dataset="frozenlake:train")


class StepEnv(BaseEnv):
    """An environment whose first step returns (or raises, or waits on) what the test sets."""

    returned: Any = ("4>", 0.0, False, {})
    release = threading.Event()

    def __init__(self, task: dict) -> None:
        self.task = task

    @staticmethod
    def from_dict(info: dict) -> "StepEnv":
        return StepEnv(dict(info))

    def reset(self):
        return "00>", {}

    def step(self, action):
        if self.returned == "hang":
            StepEnv.release.wait()
        if isinstance(self.returned, Exception):
            raise self.returned
        return self.returned


@pytest.mark.parametrize("returned,problem", [
    (("4>", 0.0, False), r"\('4>', 0.0, False\) on the first row: 3 values, not the 4 of \(observation, reward, done, info\)"),
    (("4>", None, False, {}), r"its reward is None, not a number"),
    (("4>", 0.0, "no", {}), r"its done is 'no', not a bool"),
    (("4>", 0.0, False, "ok"), r"its info is 'ok', not a dict"),
    ({"observation": "4>"}, r"\{'observation': '4>'\} on the first row: a dict, not the 4"),
])
def test_an_env_whose_step_breaks_the_contract_is_refused_at_construction(tmp_path, monkeypatch, returned, problem):
    monkeypatch.setattr(StepEnv, "returned", returned)
    with pytest.raises(ValueError, match=rf"^env_class StepEnv.step returned .*{problem}"):
        build(tmp_path, agent_class=FrozenLakeAgent, env_class=StepEnv, train_dataset="frozenlake:train")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_env_whose_step_raises_is_refused_at_construction_naming_the_action(tmp_path, monkeypatch):
    monkeypatch.setattr(StepEnv, "returned", KeyError("grid"))
    with pytest.raises(ValueError, match=r"^env_class StepEnv.step raised on the first row, given the action .* that agent_class "
                                         r"FrozenLakeAgent.update_from_model returned for an empty model reply .*KeyError: 'grid'"):
        build(tmp_path, agent_class=FrozenLakeAgent, env_class=StepEnv, train_dataset="frozenlake:train")


def test_an_env_whose_step_keeps_to_the_contract_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(StepEnv, "returned", ("4>", 1, True, None))  # an int reward and no info are fine
    build(tmp_path, agent_class=FrozenLakeAgent, env_class=StepEnv, train_dataset="frozenlake:train")


def test_an_env_whose_step_does_not_return_is_skipped_not_waited_on(tmp_path, monkeypatch, caplog):
    import training.backends.base

    monkeypatch.setattr(StepEnv, "returned", "hang")
    monkeypatch.setattr(training.backends.base, "PROBE_STEP_TIMEOUT_S", 0.2)
    try:
        with caplog.at_level("WARNING", logger="training"):
            build(tmp_path, agent_class=FrozenLakeAgent, env_class=StepEnv, train_dataset="frozenlake:train")
    finally:
        StepEnv.release.set()  # the abandoned step returns
    assert "env_class StepEnv.step did not return within 0.2s on the first row" in caplog.text
    assert "its check before training was skipped" in caplog.text
