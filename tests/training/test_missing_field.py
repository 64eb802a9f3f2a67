"""An environment whose ``from_dict`` reads a column the dataset lacks: the error names the column,
what the row and env_args had, and the fixes, before training starts."""

import pytest

from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv
from training import AgentTrainer
from training.agents.base import MissingField, build_env


class NeedsSize(FrozenLakeEnv):
    @staticmethod
    def from_dict(info):
        size, seed = int(info["size"]), int(info["seed"])
        return FrozenLakeEnv(start=(seed % size, 0))


class BrokenInside(FrozenLakeEnv):
    @staticmethod
    def from_dict(info):
        return {}["seed"] if info["seed"] else None  # a KeyError of the environment's own code


def test_build_env_names_the_missing_column_and_the_fixes():
    with pytest.raises(MissingField) as caught:
        build_env(NeedsSize, {"seed": 1, "p": 0.8}, {"max_steps": 4})
    message = str(caught.value)
    assert "NeedsSize.from_dict needs 'size'" in message
    assert "its columns: seed, p" in message and "its keys: max_steps" in message
    assert "Add a 'size' column" in message and "column mapping" in message and "env_args" in message


def test_a_key_error_of_the_environments_own_code_stays_a_key_error():
    with pytest.raises(KeyError):
        build_env(BrokenInside, {"seed": 1}, {})


def test_the_trainer_refuses_it_at_construction(tmp_path):
    with pytest.raises(ValueError, match="NeedsSize.from_dict needs 'size'"):
        AgentTrainer(agent_class=FrozenLakeAgent, env_class=NeedsSize, train_dataset=[{"seed": 1, "p": 0.8}], backend="trl",
                     run_path=str(tmp_path), config={"actor_rollout_ref.model.path": "tiny-char", "trainer.total_training_steps": 1})
    assert not (tmp_path / "metrics.jsonl").exists()


def test_given_in_env_args_it_builds():
    env = build_env(NeedsSize, {"seed": 5}, {"size": 4})
    assert isinstance(env, FrozenLakeEnv) and env.start == (1, 0)
