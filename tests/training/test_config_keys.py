"""The audit of every config key per backend (training/backends/keys.py, docs/keys.md): every key of
the schema has a row for every built-in backend, the docs are the code's, a key without effect on a
backend is said at construction and recorded in the run's config.yaml and TrainResult, and a
refused value stops construction naming the key.

Construction checks the whole configuration and trains nothing: tinker and fireworks are given a
stand-in API key (nothing is sent), verl a stand-in GPU count.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import yaml

from task_rewards import PROMPTS, starts_a_to_m
from training import AgentTrainer
from training.backends import keys as audit
from training.backends.processor import BUILTIN_PROCESSORS
from training.backends.swift.backend import DEFAULT_PYTHON, environment_problem
from training.backends.verl import backend as verl_backend
from training.config import valid_keys
from training.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "keys.md"
BASE = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
        "data.max_response_length": 2, "trainer.total_training_steps": 2, "trainer.logger": []}
# Keys without effect on each backend, set away from their defaults (a sample: every backend, several kinds).
NO_EFFECT_SAMPLES = {
    "trl": {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.9, "trainer.n_gpus_per_node": 8, "rllm.agent.name": "math"},
    "verl": {"trainer.log_freq": 5, "data.val_batch_size": 4, "trainer.cpu_threads": 2},
    "swift": {"trainer.val_before_train": False, "actor_rollout_ref.rollout.name": "sglang", "remote.loss_fn": "ppo"},
    "tinker": {"actor_rollout_ref.model.dtype": "bfloat16", "remote.region": "us", "trainer.total_epochs": 3},
    "fireworks": {"trainer.device": "cpu", "actor_rollout_ref.rollout.tensor_model_parallel_size": 2},
}
# Asked when the test is set up (a condition given as text), not at collection (a subprocess importing ms-swift).
needs_swift_env = pytest.mark.skipif("environment_problem(DEFAULT_PYTHON) is not None", reason="no .venv-swift here (`make swift-env`)")


@pytest.fixture(autouse=True)
def services_and_gpu(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tk-test")
    monkeypatch.setenv("FIREWORKS_API_KEY", "fw-test")
    monkeypatch.setattr(verl_backend, "cuda_device_count", lambda: 1)


def build(backend: str, tmp_path, overrides: dict) -> AgentTrainer:
    return AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend=backend, run_path=str(tmp_path),
                        config={**BASE, **overrides})


# -- the table --------------------------------------------------------------------------------------


def test_every_key_of_the_schema_has_a_row_for_every_built_in_backend():
    assert set(audit.BACKENDS) == set(BUILTIN_PROCESSORS)
    assert audit.missing_rows() == []


def test_a_key_added_to_the_schema_without_a_row_is_named(monkeypatch):
    added = dict(valid_keys())
    added["trainer.new_knob"] = dataclasses.field(default=1)
    monkeypatch.setattr(audit, "valid_keys", lambda: added)
    assert audit.missing_rows() == ["trainer.new_knob: no row"]
    monkeypatch.setitem(audit.KEY_EFFECTS, "trainer.new_knob", {"trl": audit.APPLIED})
    assert audit.missing_rows() == [f"trainer.new_knob: no effect for {b}" for b in BUILTIN_PROCESSORS if b != "trl"]


def test_docs_keys_md_is_the_tables_own():
    assert DOCS.read_text() == audit.audit_markdown(), "docs/keys.md is out of date: python -m training.backends.keys > docs/keys.md"


def test_the_docs_show_each_kind_and_link_from_readme_and_backends():
    text = DOCS.read_text()
    for cell in ("| applied |", "mapped: TRL's loss_type", "no effect: the share of GPU memory", "refused unless 1"):
        assert cell in text
    root = DOCS.parents[1]
    assert "docs/keys.md" in (root / "README.md").read_text() and "keys.md" in (root / "docs" / "backends.md").read_text()


# -- no effect: said and recorded ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["trl", "verl", pytest.param("swift", marks=needs_swift_env), "tinker", "fireworks"])
def test_keys_without_effect_are_said_at_construction_and_recorded(backend, tmp_path, caplog):
    sample = NO_EFFECT_SAMPLES[backend]
    for key in sample:
        assert audit.effect(backend, key).kind == "no_effect", key
    with caplog.at_level(logging.WARNING, logger="training"):
        trainer = build(backend, tmp_path, sample)
    for key, value in sample.items():
        assert any(key in message and f"has no effect on the {backend} backend" in message for message in caplog.messages), key
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["ignored_keys"]
    assert {key: entry["value"] for key, entry in recorded.items()} == sample
    assert all(entry["why"] == audit.effect(backend, key).note for key, entry in recorded.items())
    assert trainer.train_processor.ignored_keys == recorded


def test_a_key_applied_on_the_backend_is_not_recorded(tmp_path):
    build("trl", tmp_path, {"actor_rollout_ref.rollout.temperature": 0.7, "trainer.log_freq": 2})
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["ignored_keys"] == {}


def test_the_result_carries_what_was_recorded(tmp_path):
    trainer = build("trl", tmp_path, {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.9, "trainer.critic_warmup": 0})
    result = trainer.train()
    assert set(result.ignored_keys) == {"actor_rollout_ref.rollout.gpu_memory_utilization", "trainer.critic_warmup"}
    assert result.ignored_keys["trainer.critic_warmup"]["value"] == 0


def test_trls_names_without_effect_are_recorded_too(tmp_path):
    build("trl", tmp_path, {"disable_tqdm": True, "dataloader_num_workers": 2})
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["ignored_keys"]
    assert {key: entry["value"] for key, entry in recorded.items()} == {"disable_tqdm": True, "dataloader_num_workers": 2}


# -- refused: construction stops, naming the key ------------------------------------------------------


@pytest.mark.parametrize(("backend", "key", "value"), [
    ("trl", "trainer.nnodes", 2),
    ("trl", "rllm.disable_thinking", True),
    ("tinker", "actor_rollout_ref.actor.entropy_coeff", 0.01),
    ("fireworks", "actor_rollout_ref.actor.use_kl_loss", True),
    ("tinker", "rllm.rejection_sample.multiplier", 2),
    ("verl", "rllm.stepwise_advantage.enable", True),
])
def test_a_refused_value_stops_construction_naming_the_key(backend, key, value, tmp_path):
    assert audit.effect(backend, key).kind == "refused"
    with pytest.raises((ConfigError, ValueError), match=key.replace(".", r"\.")):
        build(backend, tmp_path, {key: value})


@pytest.mark.parametrize("backend", ["trl", "tinker", "fireworks"])
def test_every_refused_row_with_accepted_values_accepts_them(backend, tmp_path):
    """The values a refused row accepts (its ``unless``) pass construction together."""
    accepted = {key: effects[backend].unless[0] for key, effects in audit.KEY_EFFECTS.items()
                if effects[backend].kind == "refused" and effects[backend].unless}
    assert accepted
    build(backend, tmp_path, accepted)
