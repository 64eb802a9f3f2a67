"""AWorld's TRL-style runs, as its evolution runner builds them: ``agent="virtual"`` (no agent: the
dataset's prompts go to the model), a GRPOConfig dict naming the model ``model`` and the run's
folder ``output_dir``, then ``await trainer.inference()`` written with ``json.dump``."""

import asyncio
import json

import pytest

from training import AgentTrainer
from training.config import ConfigError


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0


def train_configs(output_dir) -> dict:
    # What AWorld's EvolutionRunner._generate_train_config writes for train_framework == 'trl'
    # (GRPOConfig fields, plus 'model' and 'output_dir'), with a tiny model and two steps.
    return {"model": "tiny-char", "output_dir": str(output_dir), "learning_rate": 1e-2, "max_steps": 2,
            "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 2}


def test_a_virtual_agent_with_a_trl_config_trains_into_output_dir_and_its_inference_is_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "evolve_run"
    trainer = AgentTrainer(agent="virtual", train_dataset=[{"prompt": p} for p in ("x=", "y=")], test_dataset=[{"prompt": "z="}],
                           reward_func=starts_with_a, config=train_configs(out), train_engine_name="trl")
    config = trainer.final_config
    assert config.actor_rollout_ref.model.path == "tiny-char" and config.trainer.total_training_steps == 2
    assert trainer.agent == "virtual" and trainer.train_processor.agent_spec.kind == "single_turn"
    result = trainer.train()
    assert result.steps == 2 and (out / "final_model").is_dir() and not (tmp_path / "runs").exists()

    metrics = asyncio.run(trainer.inference())
    result_file = out / "evaluation_result.json"
    with open(result_file, "w") as f:  # AWorld's evolution runner, as it writes the evaluation
        json.dump(metrics, f, indent=4, ensure_ascii=False)
    written = json.loads(result_file.read_text())
    assert written["metrics"] == metrics.metrics and written["rows"][0]["task"] == {"prompt": "z="}


def test_output_dir_and_a_different_run_path_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="output_dir: is .* but run_path is .*both name the run's folder; give one"):
        AgentTrainer(agent="virtual", train_dataset=[{"prompt": "x="}], reward_func=starts_with_a,
                     config=train_configs(tmp_path / "a"), run_path=str(tmp_path / "b"), train_engine_name="trl")
