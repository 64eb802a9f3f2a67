"""AWorld's own verl config (train/examples/train_gaia_with_aworld_verl/grpo_trainer.yaml, unchanged in
aworld_examples/) on the trl engine, as its GAIA example passes it to AgentTrainer: the nulls AWorld fills
in later are not given, a switched-off section's keys and verl's sizing keys have no effect (said and
recorded), the rest is applied. Construction checks everything and trains nothing (the model is
AWorld's Qwen3-32B, never loaded here)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from task_rewards import PROMPTS, starts_a_to_m
from training import Agent, AgentConfig, AgentTrainer
from training.backends import keys as audit
from training.backends.verl import backend as verl_backend
from training.config import flatten
from training.errors import ConfigError

EXAMPLES = Path(__file__).parent / "aworld_examples"
GRPO_TRAINER = EXAMPLES / "grpo_trainer.yaml"
AWORLD = flatten(yaml.safe_load(GRPO_TRAINER.read_text()))
# What AWorld's header says its trainer fills in later.
FILLED_LATER = {"data.train_files", "data.val_files", "custom_reward_function.path", "custom_reward_function.name",
                "actor_rollout_ref.rollout.agent.agent_loop_config_path"}
VLLM_SIZING = {"actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.tensor_model_parallel_size",
               "actor_rollout_ref.rollout.max_num_batched_tokens", "actor_rollout_ref.rollout.max_num_seqs"}


def gaia_trainer(tmp_path, config) -> AgentTrainer:
    """AWorld's GAIA example (train_gaia_with_aworld_verl/main.py) with its YAML, reward and data, on trl."""
    agent = Agent(name="gaia_agent", desc="gaia_agent", system_prompt="Gaia agent", conf=AgentConfig(llm_provider="verl", top_k=80))
    return AgentTrainer(agent=agent, config=config, reward_func=str(EXAMPLES / "reward" / "gaia_reward_function.py"),
                        train_dataset=str(EXAMPLES / "gaia_data" / "sample_train.parquet"),
                        test_dataset=str(EXAMPLES / "gaia_data" / "sample_test.parquet"),
                        run_path=str(tmp_path), train_engine_name="trl")


def test_aworlds_verl_yaml_builds_on_trl_and_records_what_has_no_effect(tmp_path, caplog):
    assert FILLED_LATER <= set(AWORLD) and all(AWORLD[key] is None for key in FILLED_LATER)
    with caplog.at_level(logging.INFO, logger="training"):
        trainer = gaia_trainer(tmp_path, str(GRPO_TRAINER))
    config = trainer.final_config
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen3-32B" and config.actor_rollout_ref.actor.optim.lr == 6e-6
    assert config.actor_rollout_ref.rollout.n == 8 and config.actor_rollout_ref.rollout.top_k == 80
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.28 and config.actor_rollout_ref.rollout.val_kwargs.top_p == 0.6
    assert config.trainer.save_freq == 30 and config.trainer.val_before_train is False

    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["ignored_keys"]
    assert VLLM_SIZING <= set(recorded) and "trainer.n_gpus_per_node" in recorded
    assert {key for key in AWORLD if key.startswith("actor_rollout_ref.rollout.multi_turn.")} <= set(recorded)
    assert recorded["actor_rollout_ref.rollout.max_num_batched_tokens"]["value"] == 32768
    assert not FILLED_LATER & set(recorded)
    for key in recorded:
        assert any(key in m and "has no effect" in m for m in caplog.messages if "ignored_keys" in m), key
    for key in FILLED_LATER:
        assert any(m.startswith(f"{key}=null:") and "not given" in m for m in caplog.messages), key

    # Every key of AWorld's file is accounted for: applied, recorded without effect, or a null not given.
    applied = {key for key in config.given_keys if audit.effect("trl", key).kind != "no_effect"}
    assert set(AWORLD) == applied | set(recorded) | FILLED_LATER | {"trainer.default_local_dir"}
    assert trainer.train_processor.ignored_keys == recorded


def test_a_switched_on_verl_section_is_refused_naming_the_key_and_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.multi_turn\.enable: is a verl setting .* takes effect with backend=verl"):
        gaia_trainer(tmp_path, {**AWORLD, "actor_rollout_ref.rollout.multi_turn.enable": True})


def test_a_value_where_aworld_leaves_null_is_refused_on_trl(tmp_path):
    with pytest.raises(ConfigError, match=r"^data\.train_files: is a verl setting .*on other backends remove it"):
        gaia_trainer(tmp_path, {**AWORLD, "data.train_files": "gaia.parquet"})


def test_on_verl_the_nulls_aworld_fills_later_leave_the_runs_own_files(tmp_path, monkeypatch):
    monkeypatch.setattr(verl_backend, "cuda_device_count", lambda: 1)
    trainer = AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="verl", run_path=str(tmp_path),
                           config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2,
                                   "data.train_batch_size": 2, "data.train_files": None, "custom_reward_function.path": None})
    verl = trainer.train_processor.verl_config
    assert verl.data.train_files.endswith("train.parquet") and verl.reward.custom_reward_function.path is not None
