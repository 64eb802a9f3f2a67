"""Every name in rLLM's tinker and fireworks configs and example scripts is either mapped onto our
keys or refused with a reason, on both backends (none is an "unknown config key").

The names and values are in tests/fixtures/rllm_remote_names.yaml, copied from rllm-org/rllm
(v0.2.1.post1: rllm/trainer/config/tinker_*.yaml, examples/*tinker*/*.sh; HEAD: unified.yaml with
rllm/backend/tinker.yaml and fireworks.yaml, cookbooks/*/train_tinker.sh and train_fireworks.sh);
the path of each is its key there. Nothing is a stand-in: the trainer is built (not trained), which
checks the whole configuration before anything runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from task_rewards import PROMPTS, starts_a_to_m
from training import AgentTrainer
from training.backends.tinker_protocol.service import RLLM_REMOTE_ALIASES
from training.backends.tinker_protocol.rllm_names import RLLM_REMOTE_NAMES, Rename

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "rllm_remote_names.yaml"
SOURCES = yaml.safe_load(FIXTURE.read_text())
# rLLM's generic unified names (rllm.*): handled with the rest of rLLM's names, not by these backends' table.
GENERIC = "rllm."
# Models a test can load here (no network): the key is exercised, the tiny model stands for rLLM's.
LOCAL_VALUES = {"model.name": "tiny-char", "model.tokenizer_model": "tiny-char", "tinker_base_url": None, "fireworks_base_url": None}
BASE = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
        "data.max_response_length": 2, "trainer.total_training_steps": 2, "trainer.logger": []}


def named_keys() -> list[tuple[str, object]]:
    seen: dict[tuple[str, str], tuple[str, object]] = {}
    for source, keys in SOURCES.items():
        for key, value in keys.items():
            if key.startswith(GENERIC):
                continue
            value = LOCAL_VALUES.get(key, value)
            seen.setdefault((key, repr(value)), (key, value))
    return sorted(seen.values(), key=lambda kv: (kv[0], repr(kv[1])))


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tk-test")  # checked at construction; nothing is sent
    monkeypatch.setenv("FIREWORKS_API_KEY", "fw-test")


def build(backend: str, tmp_path, overrides: dict) -> AgentTrainer:
    config = {**BASE, **overrides}
    if "model.name" in overrides:
        config.pop("actor_rollout_ref.model.path")
    return AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend=backend, run_path=str(tmp_path), config=config)


def test_the_fixture_holds_every_source_and_their_names():
    assert len(SOURCES) >= 25 and all(":" in source for source in SOURCES)
    names = {key for keys in SOURCES.values() for key in keys}
    for expected in ("training.max_length", "training.num_minibatches", "rollout_engine.bypass_render_with_parser",
                     "rollout_engine.reasoning_effort", "rollout_engine.accumulate_reasoning",
                     "fuse_forward_backward_and_optim_step", "model.train_unembed", "fireworks_config.policy_trainer_shape_id"):
        assert expected in names


@pytest.mark.parametrize("backend", ["tinker", "fireworks"])
@pytest.mark.parametrize(("key", "value"), named_keys(), ids=lambda v: str(v)[:60])
def test_each_rllm_name_maps_or_is_refused_with_a_reason(backend, key, value, tmp_path):
    try:
        trainer = build(backend, tmp_path, {key: value})
    except ValueError as exc:
        message = str(exc)
        assert "unknown config key" not in message, message
        assert key in message and len(message) > len(key) + 40, f"refused without a reason: {message}"
        return
    ours = RLLM_REMOTE_ALIASES.get(key)
    rule = RLLM_REMOTE_NAMES.get(key)
    if isinstance(rule, Rename):
        ours = rule.ours
    if ours is not None and value is not None:
        assert trainer.final_config.get(ours) == value, (key, ours)


def test_num_minibatches_becomes_prompts_per_optimizer_step(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="training"):
        trainer = build("tinker", tmp_path, {"data.train_batch_size": 4, "training.num_minibatches": 2})
    assert trainer.final_config.actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert "rLLM's training.num_minibatches=2 -> actor_rollout_ref.actor.ppo_mini_batch_size=2" in caplog.text
    with pytest.raises(ValueError, match=r"training.num_minibatches: must divide data.train_batch_size \(4\)"):
        build("tinker", tmp_path, {"data.train_batch_size": 4, "training.num_minibatches": 3})


def test_max_length_below_the_sequence_limits_is_refused_naming_them(tmp_path):
    build("fireworks", tmp_path, {"training.max_length": 32768})
    with pytest.raises(ValueError, match=r"training.max_length: is 100, below data.max_prompt_length \+ data.max_response_length"):
        build("fireworks", tmp_path, {"training.max_length": 100, "data.max_prompt_length": 512})


@pytest.mark.parametrize(("key", "value", "why"), [
    ("fuse_forward_backward_and_optim_step", True, "tinker-only knob with no effect on our loss"),
    ("rollout_engine.bypass_render_with_parser", False, "tinker-cookbook renderer"),
    ("rollout_engine.reasoning_effort", "high", "gpt-oss"),
    ("training.resume_from_path", "global_step_10", "newest checkpoint recorded in the run's own folder"),
    ("fireworks_infra.trainers.policy.job_id", "job-1", "provisioning section"),
    ("optim.lr", 1e-5, "SFT trainer"),
])
def test_refusals_say_why(key, value, why, tmp_path):
    with pytest.raises(ValueError, match=why):
        build("tinker", tmp_path, {key: value})


def test_a_fireworks_training_shape_has_no_meaning_on_tinker(tmp_path):
    shape = "accounts/fireworks/trainingShapes/qwen3-4b-minimum-lora"
    assert build("fireworks", tmp_path, {"fireworks_config.policy_trainer_shape_id": shape}).final_config.remote.training_shape == shape
    with pytest.raises(ValueError, match="is a Fireworks training shape"):
        build("tinker", tmp_path, {"fireworks_config.policy_trainer_shape_id": shape})


def test_an_rllm_name_and_ours_with_different_values_are_refused(tmp_path):
    with pytest.raises(ValueError, match="is rLLM's name for rllm.accumulate_reasoning"):
        build("tinker", tmp_path, {"rollout_engine.accumulate_reasoning": True, "rllm.accumulate_reasoning": False})
