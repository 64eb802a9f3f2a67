"""rLLM's helpers that its SDK examples import: DatasetRegistry and math_reward_fn."""

import pytest

import examples  # noqa: F401  (registers the built-in datasets)
from training.data import DatasetRegistry, load_dataset
from training.rewards import math_reward_fn


@pytest.fixture(autouse=True)
def own_dataset_registry(monkeypatch):
    """Datasets these tests register under rLLM's names (countdown, ...) are gone after each test."""
    monkeypatch.setattr(DatasetRegistry, "_splits", dict(DatasetRegistry._splits))


def test_registered_splits_load_by_name_and_split_and_as_name_colon_split():
    DatasetRegistry.register_dataset("sdk_helpers_demo", [{"question": "1+1", "ground_truth": "2"}], "train")
    DatasetRegistry.register_dataset("sdk_helpers_demo", [{"question": "2+2", "ground_truth": "4"}] * 2, "test")
    assert DatasetRegistry.load_dataset("sdk_helpers_demo", "train")[0]["question"] == "1+1"
    assert len(load_dataset("sdk_helpers_demo:test")) == 2
    assert DatasetRegistry.get_dataset_splits("sdk_helpers_demo") == ["test", "train"]
    assert DatasetRegistry.dataset_exists("sdk_helpers_demo", "test")


def test_unknown_names_and_splits_load_as_none_as_in_rllm():
    assert DatasetRegistry.load_dataset("no_such_dataset", "train") is None
    assert not DatasetRegistry.dataset_exists("no_such_dataset")
    DatasetRegistry.register_dataset("sdk_helpers_one_split", [{"q": 1}], "train")
    assert DatasetRegistry.load_dataset("sdk_helpers_one_split") is None  # rLLM's default split is "default"


def test_built_in_datasets_load_through_the_registry():
    assert len(DatasetRegistry.load_dataset("countdown", "train")) > 0
    assert "countdown" in DatasetRegistry.get_dataset_names()


def test_bad_rows_are_refused_naming_the_dataset_and_split():
    with pytest.raises(ValueError, match="DatasetRegistry 'sdk_helpers_bad' split 'train': row 0 is a str"):
        DatasetRegistry.register_dataset("sdk_helpers_bad", ["not a dict"], "train")


def test_math_reward_fn_takes_the_task_and_the_response():
    assert math_reward_fn({"ground_truth": "7"}, "so it is \\boxed{7}").reward == 1.0
    assert not math_reward_fn({"ground_truth": "7"}, "8").is_correct
