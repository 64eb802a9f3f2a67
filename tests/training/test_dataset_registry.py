"""rLLM's "prepare the dataset once, train later": ``DatasetRegistry`` keeps what it is given on disk,
so a split registered by one process loads in another (by ``(name, split)`` and as ``"name:split"``)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import training.data
from training.data import DatasetRegistry, load_dataset, registry_home

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"question": "2+2?", "ground_truth": "4"}, {"question": "3+4?", "ground_truth": "7"}]


@pytest.fixture
def fresh_process_memory(monkeypatch):
    """This process's registry as a new process starts: nothing registered in memory."""
    monkeypatch.setattr(DatasetRegistry, "_splits", {})
    monkeypatch.setattr(training.data, "_BUILT", {})


def prepare_in_another_process(name: str, split: str, rows: list[dict]) -> None:
    script = f"""
        from training.data import DatasetRegistry
        DatasetRegistry.register_dataset({name!r}, {rows!r}, {split!r})
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, check=True, timeout=300)


def test_a_split_prepared_by_one_process_loads_in_another(fresh_process_memory):
    prepare_in_another_process("prepared_math", "train", ROWS)

    assert (registry_home() / "prepared_math" / "train.parquet").is_file()
    assert DatasetRegistry.dataset_exists("prepared_math", "train")
    assert DatasetRegistry.get_dataset_splits("prepared_math") == ["train"]
    assert DatasetRegistry.load_dataset("prepared_math", "train").get_data() == ROWS
    assert load_dataset("prepared_math:train").to_list() == ROWS
    assert DatasetRegistry.load_dataset("prepared_math", "test") is None


def test_registering_again_replaces_the_split_and_removing_deletes_its_file(fresh_process_memory):
    DatasetRegistry.register_dataset("prepared_math", ROWS, "train")
    DatasetRegistry.register_dataset("prepared_math", ROWS[:1], "test")
    prepare_in_another_process("prepared_math", "train", ROWS[1:])  # another process replaces it
    DatasetRegistry._splits.clear()
    assert DatasetRegistry.load_dataset("prepared_math", "train").get_data() == ROWS[1:]

    assert DatasetRegistry.remove_dataset_split("prepared_math", "train")
    assert not (registry_home() / "prepared_math" / "train.parquet").exists()
    assert DatasetRegistry.get_dataset_splits("prepared_math") == ["test"]
    assert DatasetRegistry.remove_dataset("prepared_math")
    assert "prepared_math" not in DatasetRegistry.get_dataset_names()
    assert not DatasetRegistry.remove_dataset("prepared_math")


def test_a_registered_split_replaces_a_built_in_one_of_the_same_name_and_says_so(fresh_process_memory, monkeypatch, caplog):
    import examples  # noqa: F401  (registers the example datasets, countdown among them)

    monkeypatch.setattr(training.data, "_SHADOWED_SAID", set())
    built_in = load_dataset("countdown:train")
    prepare_in_another_process("countdown", "train", ROWS)
    with caplog.at_level("WARNING", logger="training"):
        assert load_dataset("countdown:train").to_list() == ROWS
        assert load_dataset("countdown:train").to_list() == ROWS
    # Rows stored by an earlier script pass for the built-in ones unless the run says where they came from: once a process.
    [warning] = [r.getMessage() for r in caplog.records if r.name == "training.data"]
    assert "'countdown' split 'train'" in warning and str(registry_home() / "countdown") in warning
    assert "remove_dataset_split('countdown', 'train')" in warning
    assert len(load_dataset("countdown:test")) > 0 and len(built_in) != len(ROWS)  # the other split stays built in
    assert DatasetRegistry.remove_dataset_split("countdown", "train")
    assert len(load_dataset("countdown:train")) == len(built_in)


@pytest.mark.parametrize("name, split", [("../outside", "train"), ("math", "../train"), (".hidden", "train"), ("a:b", "train")])
def test_a_name_that_is_not_a_plain_file_name_is_refused(name, split, fresh_process_memory):
    with pytest.raises(ValueError, match="must be a plain name"):
        DatasetRegistry.register_dataset(name, ROWS, split)
    assert not registry_home().exists() or not any(registry_home().rglob("*.parquet"))
