import json

import datasets
import pytest

from training import data
from training.data import available_datasets, dataset_to_tasks, load_dataset, register_dataset, require_columns

ROWS = [{"prompt": "copy: ab", "ground_truth": "ab"}, {"prompt": "copy: cd", "ground_truth": "cd"}]


@pytest.fixture
def registry(monkeypatch):
    """An empty dataset registry for the test, so registrations do not leak, either way: the splits an
    earlier test of this process registered in it (the rLLM examples' ``aime2024`` and ``hotpotqa``,
    when the tests came in another order) are not listed here."""
    monkeypatch.setattr(data, "_BUILDERS", {})
    monkeypatch.setattr(data, "_BUILT", {})
    monkeypatch.setattr(data.DatasetRegistry, "_splits", {})


def test_none_stays_none():
    assert load_dataset(None) is None


def test_dataset_passes_through():
    dataset = datasets.Dataset.from_list(ROWS)
    assert load_dataset(dataset) is dataset


def test_list_of_dicts():
    assert dataset_to_tasks(load_dataset(ROWS)) == ROWS


def test_list_with_a_non_dict_row():
    with pytest.raises(ValueError, match="train_dataset: row 1 is a str, not a dict"):
        load_dataset([ROWS[0], "copy: cd"])


def test_dataset_dict_takes_the_split():
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])})
    assert len(load_dataset(splits, split="test")) == 1
    with pytest.raises(ValueError, match="val_dataset: the DatasetDict has no split 'validation'; available splits: train, test"):
        load_dataset(splits, split="validation", what="val_dataset")


def test_empty_dataset_is_refused():
    with pytest.raises(ValueError, match="val_dataset: the dataset is empty"):
        load_dataset([], what="val_dataset")


def test_unsupported_type():
    with pytest.raises(ValueError, match="train_dataset: expected .* not int"):
        load_dataset(3)


def test_csv_round_trip(tmp_path):
    path = tmp_path / "tasks.csv"
    path.write_text("prompt,ground_truth\ncopy: ab,ab\ncopy: cd,cd\n")
    assert dataset_to_tasks(load_dataset(str(path))) == ROWS


def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert dataset_to_tasks(load_dataset(path)) == ROWS


def test_json_list_round_trip(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"target": 24, "nums": [4, 6]}]))
    assert dataset_to_tasks(load_dataset(path)) == [{"target": 24, "nums": [4, 6]}]


def test_parquet_round_trip(tmp_path):
    path = tmp_path / "tasks.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    assert dataset_to_tasks(load_dataset(str(path))) == ROWS


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(ValueError, match=f"test_dataset: file {path} does not exist"):
        load_dataset(str(path), what="test_dataset")


def test_malformed_file_is_named(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a"}\n{not json\n')
    with pytest.raises(ValueError, match=f"train_dataset: cannot use {path}: line 2 is not valid JSON"):
        load_dataset(str(path))


@pytest.mark.parametrize("name, text, reason", [
    ("empty.jsonl", "", "the file is empty (0 bytes)"),
    ("blank.jsonl", "\n\n", "it has no rows (only blank lines)"),
    ("header.csv", "prompt,ground_truth\n", "it has a header (prompt, ground_truth) but no rows"),
    ("extra_field.csv", "prompt,ground_truth\nab,ab\ncd,cd,ef\n", "line 3 has 3 field(s) but the header has 2"),
    ("open_quote.csv", 'prompt,ground_truth\n"ab,ab\ncd,cd\n', "line 3 is not valid CSV"),
])
def test_unusable_files_are_refused_with_the_reason(tmp_path, name, text, reason):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        load_dataset(str(path))
    assert str(refused.value).startswith(f"train_dataset: cannot use {path}: {reason}")


def test_hub_failure_says_offline_machines_need_a_local_path(monkeypatch, registry):
    calls = []

    def offline(source, split):
        calls.append((source, split))
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"val_dataset: could not load 'org/name' \(split 'test'\).*no network.*local path"):
        load_dataset("org/name", split="test", what="val_dataset")
    assert calls == [("org/name", "test")]


def test_registered_dataset_is_built_once_and_split_by_name(registry):
    builds = []

    def build():
        builds.append(1)
        return {"train": ROWS, "test": datasets.Dataset.from_list(ROWS[:1])}

    register_dataset("copy", build)
    assert available_datasets() == ["copy"]
    assert not builds  # lazy
    assert dataset_to_tasks(load_dataset("copy")) == ROWS
    assert dataset_to_tasks(load_dataset("copy:test")) == ROWS[:1]
    assert dataset_to_tasks(load_dataset("copy", split="test")) == ROWS[:1]
    assert builds == [1]
    with pytest.raises(ValueError, match="train_dataset: dataset 'copy' has no split 'dev'; available splits: train, test"):
        load_dataset("copy:dev")


def test_register_dataset_refuses_duplicates(registry):
    register_dataset("copy", lambda: {"train": ROWS})
    with pytest.raises(ValueError, match="'copy' is already registered"):
        register_dataset("copy", lambda: {"train": ROWS})
    with pytest.raises(ValueError, match="must not contain ':'"):
        register_dataset("copy:v2", lambda: {"train": ROWS})


def test_require_columns_names_missing_and_present_columns():
    dataset = datasets.Dataset.from_list([{"prompt": "p", "answer": "a"}])
    require_columns(dataset, ["prompt", "answer"], "train_dataset")
    with pytest.raises(ValueError) as info:
        require_columns(
            dataset, ["prompt", "ground_truth"], "train_dataset", hint="Rename the column or set data.answer_key=<name>."
        )
    assert str(info.value) == (
        "train_dataset is missing column(s) 'ground_truth'; it has: prompt, answer. "
        "Rename the column or set data.answer_key=<name>."
    )


def test_require_columns_lists_every_missing_column():
    dataset = datasets.Dataset.from_list([{"question": "q"}])
    with pytest.raises(ValueError, match=r"^val_dataset is missing column\(s\) 'prompt', 'ground_truth'; it has: question\.$"):
        require_columns(dataset, ["prompt", "ground_truth"], "val_dataset")
