"""The swift backend trains through ms-swift's own GRPO entry point, in its own interpreter.

Nothing is a stand-in here: a real few-step GRPO run of ms-swift on the CPU with the tiny model,
in ``.venv-swift`` (built by ``make swift-env``, which ``make test`` runs first), started from this
environment by ``AgentTrainer(backend="swift")``.
"""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from task_rewards import PROMPTS
from training import AgentTrainer
from training.backends.swift_backend import DEFAULT_PYTHON, environment_problem

pytestmark = pytest.mark.slow
needs_swift_env = pytest.mark.skipif(
    environment_problem(DEFAULT_PYTHON) is not None, reason="no .venv-swift here; `make swift-env` builds it (make test does)"
)
REWARD = str(Path(__file__).with_name("task_rewards.py")) + ":starts_a_to_m"


def config(steps, **extra):
    return {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.actor.optim.lr": 3e-2,
        "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4, "data.max_response_length": 2,
        "trainer.total_training_steps": steps, "trainer.logger": ["jsonl"], **extra,
    }


@needs_swift_env
def test_grpo_in_its_own_environment_changes_weights_and_raises_reward(tmp_path, sink):
    result = AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
                          config=config(6), sinks=[sink]).train()

    assert result.steps == 6 and not result.stopped
    before = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2
    rewards = [m["reward"] for m in sink.metrics]
    assert len(rewards) == 6 and rewards[-1] > rewards[0] + 0.3, rewards
    assert {"loss", "lr", "response_length", "step_time", "grad_norm"} <= set(sink.metrics[-1])
    assert sink.episodes and sink.episodes[0]["trajectories"][0]["steps"][0]["model_response"] is not None
    job = json.loads((tmp_path / "swift" / "job.json").read_text())
    assert job["swift_args"]["rlhf_type"] == "grpo" and job["swift_args"]["num_generations"] == 8


def test_a_missing_environment_is_named_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"swift backend cannot run here: its environment /nowhere/python does not exist"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=REWARD, backend="swift", run_path=str(tmp_path),
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4, "trainer.python": "/nowhere/python"})


@needs_swift_env
def test_multi_turn_agents_are_refused_clearly(tmp_path):
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv

    with pytest.raises(ValueError, match="swift backend trains single-turn tasks.*multi-turn hook is not bridged"):
        AgentTrainer(agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv, train_dataset="frozenlake:train",
                     backend="swift", run_path=str(tmp_path), config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4})


@needs_swift_env
def test_a_reward_object_the_child_cannot_import_is_refused(tmp_path):
    with pytest.raises(ValueError, match="reward_func: the swift backend trains in its own interpreter"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=lambda task, response: 0.0, backend="swift",
                     run_path=str(tmp_path), config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4})
