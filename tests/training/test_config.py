"""Config: defaults, the three override forms, validation messages, freezing."""

import dataclasses

import pytest

from training.config import Config, valid_keys

from training.errors import ConfigError


def test_defaults_follow_verl_names():
    config = Config.build()
    assert config.data.train_batch_size == 8
    assert config.actor_rollout_ref.rollout.n == 8
    assert "actor_rollout_ref.actor.optim.lr" in valid_keys()
    assert "rllm.agent.max_steps" in valid_keys()


def test_dotted_dict_and_key_value_list_give_the_same_config():
    from_dict = Config.build({"data.train_batch_size": 4, "actor_rollout_ref.actor.optim.lr": 1e-3})
    from_list = Config.build(["data.train_batch_size=4", "actor_rollout_ref.actor.optim.lr=1e-3"])
    assert from_dict == from_list
    assert from_list.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-3)


def test_nested_dict_and_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  total_training_steps: 7\nrllm:\n  agent:\n    max_steps: 3\n")
    config = Config.build(str(path))
    assert config.trainer.total_training_steps == 7
    assert Config.build({"rllm": {"agent": {"max_steps": 3}}}).rllm.agent.max_steps == 3


def test_misspelt_key_names_the_nearest_valid_key():
    with pytest.raises(ConfigError) as error:
        Config.build({"data.train_batchsize": 4})
    assert error.value.key == "data.train_batchsize"
    assert "Did you mean 'data.train_batch_size'" in str(error.value)


@pytest.mark.parametrize(("typed", "meant"), [
    ("trainer.total_epoch", "trainer.total_epochs"),
    ("data.max_respone_length", "data.max_response_length"),
    ("actor_rollout_ref.rollout.temp", "actor_rollout_ref.rollout.temperature"),
    ("rollout.n", "actor_rollout_ref.rollout.n"),  # a right leaf in a wrong section
])
def test_a_near_miss_is_pointed_to_its_key(typed, meant):
    with pytest.raises(ConfigError, match=f"unknown config key. Did you mean '{meant}'\\?"):
        Config.build({typed: 1})


@pytest.mark.parametrize("typed", ["foo.bar", "zzz", "trainer.foo_bar_baz", "algorithm.kl_coef"])
def test_a_key_far_from_every_key_gets_no_suggestion(typed):
    with pytest.raises(ConfigError) as error:
        Config.build({typed: 1})
    assert str(error.value) == f"{typed}: unknown config key."


def test_leaf_without_its_section_is_pointed_to_its_full_key():
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.optim.lr"):
        Config.build(["lr=0.1"])


def test_wrong_type_says_what_was_expected():
    with pytest.raises(ConfigError, match="data.train_batch_size: expected a whole number, got 'eight'"):
        Config.build({"data.train_batch_size": "eight"})


def test_out_of_range_value_says_how_to_fix_it():
    with pytest.raises(ConfigError, match="algorithm.adv_estimator: must be one of grpo, grpo_passk, .* not .ppo."):
        Config.build({"algorithm.adv_estimator": "ppo"})
    with pytest.raises(ConfigError, match="must divide data.train_batch_size"):
        Config.build({"data.train_batch_size": 8, "actor_rollout_ref.actor.ppo_mini_batch_size": 3})


def test_section_given_a_value_is_refused():
    with pytest.raises(ConfigError, match="is a section"):
        Config.build({"data": 3})


def test_override_without_equals_sign_is_refused():
    with pytest.raises(ConfigError, match="not of the form key=value"):
        Config.build(["data.train_batch_size"])


def test_config_is_frozen_after_validation():
    config = Config.build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.data.train_batch_size = 1
    changed = config.replace({"data.train_batch_size": 2})
    assert (config.data.train_batch_size, changed.data.train_batch_size) == (8, 2)


def test_yaml_round_trip():
    config = Config.build({"trainer.logger": ["jsonl"], "trainer.save_freq": 5})
    assert Config.build(config.to_dict()) == config
