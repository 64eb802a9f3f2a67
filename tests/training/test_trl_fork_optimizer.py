"""A run of the trl backend that starts from another run's checkpoint (a fork: its model path is that
``checkpoint-<n>`` folder) starts with that checkpoint's optimizer state where it fits, with its own
learning rate; where it does not fit (a LoRA fork of a fully fine-tuned checkpoint, any fork of a LoRA
checkpoint) it starts with a fresh optimizer and says why. The tiny model is built from a config: no download."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from training import AgentTrainer
from training.config import Config
from training.rollouts.models import load_policy
from training.backends.trl.optimizer_state import carry_optimizer_state, state_mismatch

PROMPTS = [{"prompt": p} for p in ("x=", "y=")]
SMALL = {"actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2, "data.max_response_length": 2,
         "trainer.logger": [], "trainer.log_episodes": False}


def odd_first_character(task, response):
    """A reward that differs between the tiny model's random answers: gradients, so moments, not all zero."""
    return float(ord(response[0]) % 2) if response else 0.0


class OptimizerStateSink:
    """Keeps what the run says it carried of the optimizer state."""

    def __init__(self):
        self.records: list[dict] = []

    def log_metrics(self, step, metrics):
        pass

    def log_episodes(self, step, episodes):
        pass

    def close(self):
        pass

    def log_optimizer_state(self, record):
        self.records.append(record)


@pytest.fixture
def first_step_optimizer():
    """The optimizer's state dict as its first step starts (before that step changes it)."""
    seen: list[dict] = []

    def keep(optimizer, args, kwargs):
        if not seen:
            seen.append(copy.deepcopy(optimizer.state_dict()))

    handle = register_optimizer_step_pre_hook(keep)
    yield seen
    handle.remove()


@pytest.fixture(scope="module")
def parent_checkpoint(tmp_path_factory):
    """A parent run's checkpoint of step 2, saved by TRL with its optimizer state."""
    path = tmp_path_factory.mktemp("parent")
    config = {**SMALL, "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.actor.optim.lr": 1e-2,
              "trainer.total_training_steps": 2, "trainer.save_freq": 2}
    AgentTrainer(train_dataset=PROMPTS, reward_func=odd_first_character, backend="trl", run_path=str(path), config=config).train()
    return path / "checkpoints" / "checkpoint-2"


def fork(checkpoint, run_path, **extra) -> dict:
    return {**SMALL, "actor_rollout_ref.model.path": str(checkpoint), "actor_rollout_ref.actor.optim.lr": 3e-2,
            "trainer.total_training_steps": 1, "trainer.save_freq": -1, **extra}


def test_a_fork_starts_with_its_parents_optimizer_state_and_its_own_learning_rate(parent_checkpoint, tmp_path,
                                                                                  first_step_optimizer):
    saved = torch.load(parent_checkpoint / "optimizer.pt", weights_only=True)
    assert saved["state"] and saved["param_groups"][0]["lr"] == pytest.approx(1e-2)
    sink = OptimizerStateSink()
    AgentTrainer(train_dataset=PROMPTS, reward_func=odd_first_character, backend="trl", run_path=str(tmp_path),
                 config=fork(parent_checkpoint, tmp_path), sinks=[sink]).train()

    assert sink.records == [{"carried": True, "why": ""}]
    at_first_step = first_step_optimizer[0]
    assert at_first_step["state"].keys() == saved["state"].keys()
    for index, state in saved["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(at_first_step["state"][index][name], state[name]), (index, name)
    assert any(state["exp_avg"].abs().sum() > 0 for state in saved["state"].values())  # the parent learnt something
    # The fork's own learning rate (a constant schedule from its step 1), not the parent's.
    assert [group["lr"] for group in at_first_step["param_groups"]] == pytest.approx([3e-2] * len(saved["param_groups"]))


def test_a_lora_fork_of_a_full_checkpoint_starts_fresh_and_says_why(parent_checkpoint, tmp_path, first_step_optimizer):
    sink = OptimizerStateSink()
    AgentTrainer(train_dataset=PROMPTS, reward_func=odd_first_character, backend="trl", run_path=str(tmp_path),
                 config=fork(parent_checkpoint, tmp_path, **{"actor_rollout_ref.model.lora_rank": 4}), sinks=[sink]).train()

    [record] = sink.records
    assert record["carried"] is False
    assert "parameter tensors" in record["why"] and "LoRA against full fine-tuning" in record["why"], record
    assert first_step_optimizer[0]["state"] == {}  # a fresh optimizer: no moments yet


def test_a_fork_of_a_lora_checkpoint_starts_fresh_and_says_why(tmp_path, first_step_optimizer):
    """Its adapter is merged into the fork's weights and the fork trains a new one of the same shapes:
    the saved moments are not of it."""
    lora = {"actor_rollout_ref.model.lora_rank": 4}
    config = {**SMALL, "actor_rollout_ref.model.path": "tiny-char", "trainer.total_training_steps": 1,
              "trainer.save_freq": 1, **lora}
    AgentTrainer(train_dataset=PROMPTS, reward_func=odd_first_character, backend="trl", run_path=str(tmp_path / "parent"),
                 config=config).train()
    checkpoint = tmp_path / "parent" / "checkpoints" / "checkpoint-1"
    assert (checkpoint / "optimizer.pt").is_file() and (checkpoint / "adapter_config.json").is_file()
    sink = OptimizerStateSink()
    AgentTrainer(train_dataset=PROMPTS, reward_func=odd_first_character, backend="trl", run_path=str(tmp_path / "fork"),
                 config=fork(checkpoint, tmp_path, **lora), sinks=[sink]).train()

    [record] = sink.records
    assert record["carried"] is False and "the checkpoint is a LoRA adapter" in record["why"], record
    assert first_step_optimizer[0]["state"] == {}
    # A fork that trains every weight instead gets them all to train (peft's merge leaves them frozen).
    model, _, _ = load_policy(Config.build(fork(checkpoint, tmp_path)), str(tmp_path / "full"))
    assert all(param.requires_grad for param in model.parameters())


def test_a_state_of_other_shapes_or_another_optimizer_does_not_fit():
    weight = torch.nn.Parameter(torch.zeros(3, 2))
    groups = torch.optim.AdamW([weight]).param_groups
    state = {"step": torch.tensor(2.0), "exp_avg": torch.zeros(3, 2), "exp_avg_sq": torch.zeros(3, 2)}
    fits = {"state": {0: state}, "param_groups": [{"params": [0], "lr": 1.0}]}
    assert state_mismatch(groups, fits) is None
    wrong_shape = {**fits, "state": {0: {**state, "exp_avg": torch.zeros(2, 3)}}}
    assert "exp_avg of parameter 0 has shape (2, 3), this run's parameter (3, 2)" in state_mismatch(groups, wrong_shape)
    sgd = {"state": {0: {"momentum_buffer": torch.zeros(3, 2)}}, "param_groups": [{"params": [0], "momentum": 0.9, "nesterov": False}]}
    assert "another kind" in state_mismatch(groups, sgd)
    assert "holds no optimizer state" in state_mismatch(groups, [1, 2])


class Planted:
    """An object whose unpickling would run code (touch a file): what a parent run's own process could
    write into its checkpoint's optimizer.pt."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_an_optimizer_file_that_holds_more_than_tensors_is_not_loaded(tmp_path):
    weight = torch.nn.Parameter(torch.zeros(3, 2))
    optimizer = torch.optim.AdamW([weight])
    marker = tmp_path / "ran"
    torch.save({"state": {}, "param_groups": [{"params": [0]}], "planted": Planted(marker)}, tmp_path / "optimizer.pt")
    why = carry_optimizer_state(optimizer, tmp_path)
    assert why.startswith("the checkpoint's optimizer.pt could not be read (UnpicklingError"), why
    assert not marker.exists() and optimizer.state_dict()["state"] == {}
    (tmp_path / "optimizer.pt").unlink()
    (tmp_path / "trainer_state.json").write_text("{}")
    assert carry_optimizer_state(optimizer, tmp_path) == "the checkpoint holds no optimizer.pt (saved with the weights only)"
