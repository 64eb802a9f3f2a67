"""The processor registry and backend selection."""

import pytest

from training import AgentTrainer, TrainerProcessor
from training.backends.processor import get_processor_class, processor
from training.trainer import choose_backend


class _Minimal(TrainerProcessor):
    def train(self):
        return "trained"

    def check_agent(self, agent):
        pass

    def check_dataset(self, dataset=None, test_dataset=None):
        pass

    def check_reward(self, reward_func=None):
        pass

    def check_config(self, config=None):
        return config


def test_register_and_unregister():
    AgentTrainer.register_processor("minimal-test", _Minimal)
    try:
        assert "minimal-test" in AgentTrainer.available_processors()
        assert AgentTrainer(agent="x", train_engine_name="minimal-test").train() == "trained"
    finally:
        AgentTrainer.unregister_processor("minimal-test")
    assert "minimal-test" not in AgentTrainer.available_processors()


def test_taken_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        AgentTrainer.register_processor("trl", _Minimal)


def test_decorator_refuses_a_conflicting_duplicate():
    processor("decorated-test")(_Minimal)
    try:
        with pytest.raises(ValueError, match="already registered"):
            processor("decorated-test")(_Minimal)
    finally:
        AgentTrainer.unregister_processor("decorated-test")


def test_only_trainer_processors_can_register():
    with pytest.raises(ValueError, match="not a subclass of TrainerProcessor"):
        AgentTrainer.register_processor("bad", object)


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown training backend 'openrlhf'; known backends: fireworks, swift, tinker, trl, verl"):
        get_processor_class("openrlhf")
    with pytest.raises(ValueError, match="No training processor named 'nope'"):
        AgentTrainer.unregister_processor("nope")


def test_builtin_backends_load_lazily():
    assert get_processor_class("trl").__name__ == "TRLProcessor"


def test_auto_picks_trl_without_gpu(caplog):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; auto would pick verl")
    with caplog.at_level("INFO", logger="training"):
        assert choose_backend("auto") == "trl"
    assert "backend=auto chose trl (no CUDA GPU)" in caplog.text
    assert choose_backend("verl") == "verl"
