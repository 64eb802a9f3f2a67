"""The best checkpoints by a metric survive the rotation of the published ones (trl backend, tiny
model built from a config, CPU): ``trainer.metric_for_best_model`` keeps the best
``trainer.keep_best_checkpoints`` beside the newest ``trainer.max_checkpoints``, also across attempts
(the values of earlier attempts' checkpoints are read back from beside them). Other backends refuse
the key by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from standins.ownership import Ownership
from training import AgentTrainer
from training.backends.keys import check_refused
from training.backends.processor import BEST_METRIC_FILE, best_steps
from training.config import Config
from training.errors import ConfigError

EPISODES_PER_STEP = 2
_calls = {"n": 0}


def first_step_pays(task, response):
    """1 for the episodes of the first step, 0 after: the first checkpoint is the best by reward. (The
    check before training calls the reward once, on the first row: that call pays too.)"""
    _calls["n"] += 1
    return 1.0 if _calls["n"] <= EPISODES_PER_STEP + 1 else 0.0


def train(run_path: Path, attempt: int, ownership: Ownership, steps: int):
    config = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": EPISODES_PER_STEP,
              "data.train_batch_size": 1, "data.max_response_length": 2, "trainer.total_training_steps": steps,
              "trainer.save_freq": 1, "trainer.max_checkpoints": 1, "trainer.metric_for_best_model": "reward",
              "trainer.keep_best_checkpoints": 1, "trainer.logger": ["jsonl"], "trainer.val_before_train": False}
    return AgentTrainer(
        train_dataset=[{"prompt": "x="}], reward_func=first_step_pays, backend="trl", run_path=str(run_path), config=config,
        attempt=attempt, write_fence=ownership.fence(attempt), may_write=lambda: ownership.holder == attempt,
    ).train()


def names(folder: Path) -> list[str]:
    return sorted((p.name for p in folder.glob("checkpoint-*")), key=lambda name: int(name.split("-")[1]))


def logged_rewards(run_path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row["reward"] for row in rows if "reward" in row}


@pytest.mark.slow
def test_the_best_checkpoint_by_reward_survives_rotation_across_attempts(tmp_path):
    _calls["n"] = 0
    ownership = Ownership(1)
    first = train(tmp_path, 1, ownership, 3)
    assert first.steps == 3
    rewards = logged_rewards(tmp_path)
    assert rewards[1] == 1.0 and rewards[2] == rewards[3] == 0.0, rewards  # the premise: step 1 is the best
    # trainer.max_checkpoints=1 alone would keep checkpoint-3; the best by reward is kept beside it.
    assert names(tmp_path / "checkpoints") == ["checkpoint-1", "checkpoint-3"]
    kept = json.loads((tmp_path / "checkpoints" / BEST_METRIC_FILE).read_text())
    assert kept == {"metric": "reward", "values": {"1": 1.0, "3": 0.0}}

    ownership.holder = 2  # a later attempt resumes and ranks the earlier attempt's checkpoints from the file
    second = train(tmp_path, 2, ownership, 5)
    assert second.steps == 5
    assert names(tmp_path / "checkpoints") == ["checkpoint-1", "checkpoint-5"]


def test_best_steps_ranks_by_the_metric_in_its_direction():
    values = {1: 0.5, 2: 0.9, 3: 0.1, 4: 0.9}
    assert best_steps(values, 2, greater=True) == [4, 2]  # a tie keeps the newer first
    assert best_steps(values, 1, greater=False) == [3]


@pytest.mark.parametrize("backend", ["verl", "swift", "tinker", "fireworks"])
def test_other_backends_refuse_the_metric_by_name(backend):
    config = Config.build({"trainer.metric_for_best_model": "reward"})
    with pytest.raises(ConfigError, match="trainer.metric_for_best_model"):
        check_refused(backend, config)
    check_refused(backend, Config.build({}))  # left out: nothing to refuse


def test_keep_best_checkpoints_is_at_least_one():
    with pytest.raises(ConfigError, match="trainer.keep_best_checkpoints"):
        Config.build({"trainer.metric_for_best_model": "reward", "trainer.keep_best_checkpoints": 0})


@pytest.mark.slow
def test_a_checkpoint_the_platform_keeps_survives_rotation(tmp_path):
    """``kept_checkpoints`` (on the platform: the steps a project alias names, asked at each rotation)."""
    ownership = Ownership(1)
    config = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": EPISODES_PER_STEP,
              "data.train_batch_size": 1, "data.max_response_length": 2, "trainer.total_training_steps": 3,
              "trainer.save_freq": 1, "trainer.max_checkpoints": 1, "trainer.val_before_train": False}
    AgentTrainer(
        train_dataset=[{"prompt": "x="}], reward_func=first_step_pays, backend="trl", run_path=str(tmp_path), config=config,
        attempt=1, write_fence=ownership.fence(1), may_write=lambda: True, kept_checkpoints=lambda: {1},
    ).train()
    assert names(tmp_path / "checkpoints") == ["checkpoint-1", "checkpoint-3"]
