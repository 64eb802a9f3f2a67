"""rLLM's config keys (``rllm.*`` from its launch scripts and trainer config) and verl's keys on a
backend that is not verl: each is honoured, accepted as having no effect here, or refused saying
why; and functions inside ``*_args`` are recorded by import path."""

from __future__ import annotations

import pytest
import yaml

from training import AgentTrainer, SingleTurnEnvironment
from training.agents.spec import AgentSpec
from training.config import Config
from training.errors import ConfigError

TINY = {"actor_rollout_ref.model.path": "tiny-char", "trainer.logger": [], "data.train_batch_size": 2}
QUESTIONS = [{"question": q} for q in ("1+1=", "2+2=", "3+3=", "4+4=")]


def reward_fn(task_info, action):
    return float(action.startswith("a"))


def build(tmp_path, config, **kwargs):
    kwargs.setdefault("agent_class", _math_agent())
    kwargs.setdefault("env_class", SingleTurnEnvironment)
    kwargs.setdefault("env_args", {"reward_fn": reward_fn})
    return AgentTrainer(config={**TINY, **config}, train_dataset=QUESTIONS, run_path=str(tmp_path), backend="trl", **kwargs)


def _math_agent():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    from rllm_math_agent import MathAgent

    return MathAgent


def test_every_rllm_key_of_its_trainer_config_is_known():
    # rllm.* of rLLM v0.2.1.post1's agent_ppo_trainer.yaml and its launch scripts.
    keys = [
        "rllm.agent.name=math_agent", "rllm.agent.max_steps=20", "rllm.agent.trajectory_timeout=null",
        "rllm.agent.overlong_filter=False", "rllm.env.name=custom", "rllm.workflow.use_workflow=False",
        "rllm.workflow.name=single_turn_workflow", "rllm.workflow.n_parallel_tasks=256", "rllm.workflow.retry_limit=3",
        "rllm.disable_thinking=False", "rllm.accumulate_reasoning=False", "rllm.mask_truncated_samples=False",
        "rllm.filter_token_mismatch=True", "rllm.stepwise_advantage.enable=False", "rllm.stepwise_advantage.mode=broadcast",
        "rllm.stepwise_advantage.normalize_by_steps=False", "rllm.compact_filtering.enable=False",
        "rllm.compact_filtering.mask_max_prompt_length_exceeded=True", "rllm.compact_filtering.mask_max_response_length_exceeded=True",
        "rllm.compact_filtering.mask_env_done=False", "rllm.compact_filtering.mask_max_turns_exceeded=True",
        "rllm.compact_filtering.mask_timeout=True", "rllm.compact_filtering.mask_unknown=False",
        "rllm.compact_filtering.mask_error=True", "rllm.rejection_sample.enable=False", "rllm.rejection_sample.multiplier=1",
        "+rllm.agent.agent_args.use_accumulate_history=True", "+rllm.env.env_args.is_slippery=False",
        "+rllm.agent.engine_args.retry_limit=2", "rllm.sdk.store.path=~/.rllm/traces.db",
        "rllm.sdk.processing.groupby_key=null", "rllm.sdk.processing.traj_name_key=null", "rllm.sdk.proxy.host=127.0.0.1",
        "rllm.sdk.proxy.port=4000", "rllm.sdk.proxy.mode=subprocess", "rllm.sdk.proxy.admin_token=my-shared-secret",
    ]
    config = Config.build(keys)
    assert config.rllm.agent.trajectory_timeout is None
    assert config.rllm.retries == 2 and config.rllm.n_parallel_tasks == 256  # rllm.workflow.* win where set
    assert config.rllm.env.env_args == {"is_slippery": False}


def test_rllm_args_keys_join_the_trainers_args_and_the_trainers_own_win(tmp_path):
    trainer = build(tmp_path, {"+rllm.agent.agent_args.accumulate_thinking": False, "rllm.env.env_args.extra": 1},
                    env_args={"reward_fn": reward_fn, "extra": 2})
    spec = trainer.train_processor.agent_spec
    assert spec.agent_args == {"accumulate_thinking": False}
    assert spec.env_args["extra"] == 2


def test_functions_inside_args_are_recorded_by_import_path(tmp_path):
    trainer = build(tmp_path, {})
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert recorded["agent"]["env_args"] == {"reward_fn": f"{__name__}.reward_fn"}
    described = AgentSpec(workflow_class="pkg.Flow", workflow_args={"fn": reward_fn, "cls": Config, "n": 2}).describe()
    assert described["workflow_args"] == {"fn": f"{__name__}.reward_fn", "cls": "training.config.schema.Config", "n": 2}
    assert trainer.final_config.rllm.env.env_args == {}


def test_verl_resource_keys_are_accepted_and_recorded_as_without_effect(tmp_path):
    build(tmp_path, {"actor_rollout_ref.actor.fsdp_config.param_offload": True, "trainer.critic_warmup": 0})
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert {key: entry["value"] for key, entry in recorded["ignored_keys"].items()} == {
        "actor_rollout_ref.actor.fsdp_config.param_offload": True, "trainer.critic_warmup": 0}
    assert "FSDP sharding" in recorded["ignored_keys"]["actor_rollout_ref.actor.fsdp_config.param_offload"]["why"]


# -- one test per bad input -----------------------------------------------------------------------------


def test_a_verl_key_without_meaning_here_says_it_is_verls_not_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.ignore_eos: is a verl setting") as caught:
        build(tmp_path, {"actor_rollout_ref.rollout.ignore_eos": True})
    assert "backend=verl" in str(caught.value) and "Did you mean" not in str(caught.value)


def test_a_verl_key_with_a_value_that_would_matter_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="trainer.critic_warmup: is a verl setting"):
        build(tmp_path, {"trainer.critic_warmup": 10})


def test_a_misspelt_rllm_key_gets_the_nearest_one(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean 'rllm.stepwise_advantage.enable'"):
        build(tmp_path, {"rllm.stepwise_advantage.enabled": True})


def test_an_unknown_stepwise_mode(tmp_path):
    with pytest.raises(ConfigError, match="rllm.stepwise_advantage.mode: must be one of broadcast, per_step"):
        build(tmp_path, {"rllm.stepwise_advantage.mode": "per_token"})


def test_rejection_oversampling_is_refused_on_trl(tmp_path):
    with pytest.raises(ConfigError, match="rllm.rejection_sample.multiplier"):
        build(tmp_path, {"rllm.rejection_sample.enable": True, "rllm.rejection_sample.multiplier": 2})


def test_use_workflow_without_a_workflow(tmp_path):
    with pytest.raises(ConfigError, match="rllm.workflow.use_workflow: is true but no workflow_class"):
        AgentTrainer(config={**TINY, "rllm.workflow.use_workflow": True}, train_dataset=[{"prompt": "x"}] * 8,
                     reward_func=reward_fn, run_path=str(tmp_path), backend="trl")


def test_engine_args_other_than_retry_limit(tmp_path):
    with pytest.raises(ConfigError, match="rllm.agent.engine_args.max_workers: is an argument of rLLM's AgentExecutionEngine"):
        build(tmp_path, {"+rllm.agent.engine_args.max_workers": 4})


def test_disable_thinking_is_refused_rather_than_ignored(tmp_path):
    with pytest.raises(ConfigError, match="rllm.disable_thinking: is not implemented"):
        build(tmp_path, {"rllm.disable_thinking": True})


def test_single_turn_environment_without_a_reward_fn_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="SingleTurnEnvironment needs a reward function: pass env_args"):
        build(tmp_path, {}, env_args={})


def test_config_env_args_that_break_the_environment_fail_at_construction(tmp_path):
    with pytest.raises(ValueError, match="env_class SingleTurnEnvironment could not be built"):
        build(tmp_path, {"rllm.env.env_args.reward_fn": "no_such_reward"}, env_args={})


def test_row_options_on_a_plain_single_turn_task_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="rllm.compact_filtering.enable: has no effect here: a plain single-turn prompt"):
        AgentTrainer(config={**TINY, "rllm.compact_filtering.enable": True}, train_dataset=[{"prompt": "x"}] * 8,
                     reward_func=reward_fn, run_path=str(tmp_path), backend="trl")


def test_sdk_grouping_by_session_metadata_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="rllm.sdk.processing.groupby_key: is not implemented"):
        build(tmp_path, {"rllm.sdk.processing.groupby_key": "task_id"})
