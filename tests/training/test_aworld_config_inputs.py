"""AWorld's AgentTrainer takes the datasets and the reward in the config when its arguments are None
(``data.train_files``, ``data.val_files``, ``custom_reward_function.path``/``name``, verl's keys):
``AgentTrainer(agent=..., config=yaml, train_dataset=None, reward_func=None)`` trains on those files
with that function. The config is AWorld's GAIA ``grpo_trainer.yaml`` sections
(``tests/fixtures/aworld_gaia_grpo_trainer_inputs.yaml``); one test per bad input, each naming the
key, the path and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import yaml

from training import AgentTrainer
from training.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
AGENTS_YAML = REPO / "tests" / "training" / "aworld_examples" / "agents.yaml"
GAIA_CONFIG = REPO / "tests" / "fixtures" / "aworld_gaia_grpo_trainer_inputs.yaml"
GAIA_TRAIN = REPO / "tests" / "training" / "aworld_examples" / "gaia_data" / "sample_train.parquet"
GAIA_TEST = REPO / "tests" / "training" / "aworld_examples" / "gaia_data" / "sample_test.parquet"
TINY = {
    "actor_rollout_ref": {"model": {"path": "tiny-char"}, "rollout": {"n": 2}},
    "data": {"train_batch_size": 2, "max_prompt_length": 1024, "max_response_length": 8, "val_batch_size": 2},
    "rllm": {"agent": {"max_tokens_per_turn": 8}},
    "trainer": {"total_training_steps": 1, "logger": []},
}


def merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def config_file(tmp_path: Path, sections: dict) -> str:
    path = tmp_path / "grpo_trainer.yaml"
    path.write_text(yaml.safe_dump(merged(sections, TINY)))
    return str(path)


def test_aworlds_gaia_config_names_the_data_and_the_reward_and_they_train(tmp_path, sink, monkeypatch):
    monkeypatch.chdir(REPO)  # the config's paths are relative, as verl reads them: from the working directory
    config = config_file(tmp_path, yaml.safe_load(GAIA_CONFIG.read_text()))
    trainer = AgentTrainer(agent=str(AGENTS_YAML), config=config, train_dataset=None, reward_func=None,
                           run_path=str(tmp_path / "run"), sinks=[sink], train_engine_name="trl")
    processor = trainer.train_processor
    assert processor.train_dataset.to_list() == datasets.Dataset.from_parquet(str(GAIA_TRAIN)).to_list()
    assert processor.test_dataset.to_list() == datasets.Dataset.from_parquet(str(GAIA_TEST)).to_list()
    assert processor.reward_fn.name == "gaia_reward_func" and processor.reward_fn.style == "verl"
    assert Path(processor.reward_fn.fn.__code__.co_filename).resolve() == (REPO / "tests/training/aworld_examples/reward/gaia_reward_function.py")
    result = trainer.train()
    assert result.steps == 1
    assert any("val/gaia_dataset/reward" in m for m in sink.metrics), "the val_files rows were scored"
    assert sink.episodes and all(e["task"]["data_source"] == "gaia_dataset" for e in sink.episodes)


RECORDING_REWARD = '''
import json
import os


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(os.environ["REWARD_CALLS"], "a") as calls:
        calls.write(json.dumps({"data_source": data_source, "ground_truth": ground_truth}) + "\\n")
    return 1.0 if solution_str.strip() == ground_truth else 0.0


def reward_func(task, response):  # not the one: verl's default name is compute_score
    raise AssertionError("the wrong function was called")
'''


def test_a_list_of_jsonl_and_json_files_and_a_reward_file_without_a_name_train_with_compute_score(tmp_path, sink, monkeypatch):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.json"
    first.write_text("".join(json.dumps({"prompt": f"copy {c}", "ground_truth": c, "data_source": "jsonl"}) + "\n" for c in "ab"))
    second.write_text(json.dumps([{"prompt": f"copy {c}", "ground_truth": c, "data_source": "json"} for c in "cd"]))
    reward = tmp_path / "score.py"
    reward.write_text(RECORDING_REWARD)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("REWARD_CALLS", str(calls))
    config = config_file(tmp_path, {"data": {"train_files": [str(first), str(second)], "val_files": None},
                                    "custom_reward_function": {"path": str(reward), "name": None}})
    trainer = AgentTrainer(agent=str(AGENTS_YAML), config=config, run_path=str(tmp_path / "run"), sinks=[sink],
                           train_engine_name="trl")
    assert trainer.train_processor.train_dataset["data_source"] == ["jsonl", "jsonl", "json", "json"]
    assert trainer.train_processor.test_dataset is None
    before = len(calls.read_text().splitlines()) if calls.exists() else 0  # construction's probe of the first row
    trainer.train()
    recorded = [json.loads(line) for line in calls.read_text().splitlines()][before:]
    assert len(recorded) == len(sink.episodes) == 4  # every episode scored by the config's function
    assert {(r["data_source"], r["ground_truth"]) for r in recorded} <= {("jsonl", "a"), ("jsonl", "b"), ("json", "c"), ("json", "d")}


def test_aworlds_empty_keys_name_nothing(tmp_path):
    """AWorld's own grpo_trainer.yaml leaves them empty for its trainer to fill in: the arguments count."""
    config = config_file(tmp_path, {"data": {"train_files": None, "val_files": None},
                                    "custom_reward_function": {"path": None, "name": None}})
    trainer = AgentTrainer(agent=str(AGENTS_YAML), config=config, train_dataset=[{"prompt": "x", "ground_truth": "x"}] * 2,
                           reward_func="exact_match", run_path=str(tmp_path / "run"), train_engine_name="trl")
    assert len(trainer.train_processor.train_dataset) == 2


def build(tmp_path: Path, sections: dict, **arguments):
    return AgentTrainer(agent=str(AGENTS_YAML), config=config_file(tmp_path, sections), run_path=str(tmp_path / "run"),
                        train_engine_name="trl", **arguments)


def test_a_missing_data_file_names_the_key_the_path_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"^data.train_files: file nowhere/train.parquet does not exist; check the path \(relative to "):
        build(tmp_path, {"data": {"train_files": "nowhere/train.parquet"}}, reward_func="exact_match")


def test_a_registered_name_is_not_a_data_file(tmp_path):
    with pytest.raises(ValueError, match=r"^data.val_files: arithmetic:test is not a data file .*goes in train_dataset= instead"):
        build(tmp_path, {"data": {"val_files": "arithmetic:test"}}, train_dataset="arithmetic:train", reward_func="exact_match")


def test_a_missing_reward_file_names_the_key_the_path_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"^custom_reward_function.path: file reward/missing.py does not exist \(a relative "
                                          r"path is read from .*\); give the path of the .py file that defines the reward function"):
        build(tmp_path, {"custom_reward_function": {"path": "reward/missing.py", "name": "f"}}, train_dataset="arithmetic:train")


def test_a_missing_reward_function_names_the_key_the_path_and_the_fix(tmp_path):
    reward = tmp_path / "score.py"
    reward.write_text(RECORDING_REWARD)
    with pytest.raises(ConfigError) as error:
        build(tmp_path, {"custom_reward_function": {"path": str(reward), "name": "compute_scor"}}, train_dataset="arithmetic:train")
    message = str(error.value)
    assert message.startswith("custom_reward_function.name: ") and str(reward) in message
    assert "has no attribute 'compute_scor'. Did you mean 'compute_score'?" in message
    assert f"Set custom_reward_function.name to the function's name in {reward}." in message


def test_a_reward_name_without_a_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^custom_reward_function.name: names function 'compute_score' but "
                                          r"custom_reward_function.path names no file"):
        build(tmp_path, {"custom_reward_function": {"name": "compute_score"}}, train_dataset="arithmetic:train")


def test_an_input_given_both_ways_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^data.train_files: names the run's train dataset and so does train_dataset=; give one."):
        build(tmp_path, {"data": {"train_files": str(GAIA_TRAIN)}}, train_dataset="arithmetic:train", reward_func="exact_match")
