"""A config dict keyed by TRL's GRPOConfig names (as AWorld's TRL trainer takes one): mapped onto our
keys with the mapping logged, handed back to TRL unchanged, and refused, named, where it cannot be honoured."""

from __future__ import annotations

import logging

import pytest

from training import AgentTrainer
from training.backends.trl.backend import _TRLRun
from training.config import Config

# AWorld's own default config for its TRL trainer (train/trainer/utils.py, TRAIN_DEFAULT_CONFIG["trl"]).
from training.errors import ConfigError
AWORLD_TRL_DEFAULTS = {
    "output_dir": ".", "learning_rate": 5e-6, "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1, "num_train_epochs": 1, "logging_steps": 10,
    "save_strategy": "steps", "save_steps": 100, "eval_strategy": "no", "remove_unused_columns": False,
    "fp16": True, "max_prompt_length": 12800, "max_completion_length": 128, "num_generations": 2,
    "report_to": ["none"], "use_liger_kernel": False, "push_to_hub": False, "max_steps": 2,
}


def batch_reward(completions, prompts, **kwargs):
    return [1.0 if completion.startswith("a") else 0.0 for completion in completions]


def test_trl_names_map_onto_ours_and_back_to_trl_unchanged(tmp_path, caplog):
    config = {"actor_rollout_ref.model.path": "tiny-char", "learning_rate": 3e-3, "num_generations": 4, "per_device_train_batch_size": 8,
              "max_completion_length": 3, "beta": 0.04, "temperature": 0.9, "top_p": 0.95, "epsilon": 0.3,
              "num_iterations": 2, "max_steps": 2, "logging_steps": 1, "save_strategy": "no", "seed": 7,
              "lr_scheduler_type": "cosine", "warmup_steps": 1, "max_grad_norm": 0.5, "scale_rewards": "none",
              "loss_type": "dr_grpo", "epsilon_high": 0.35, "importance_sampling_level": "sequence",
              "gradient_checkpointing": False}
    with caplog.at_level(logging.INFO, logger="training"):
        trainer = AgentTrainer(train_dataset=[{"prompt": p} for p in "wxyz"], reward_func=batch_reward, config=config,
                               run_path=str(tmp_path), train_engine_name="trl")
    ours = trainer.final_config
    assert ours.data.train_batch_size == 2 and ours.actor_rollout_ref.rollout.n == 4  # 8 completions = 2 prompts x 4
    assert ours.actor_rollout_ref.actor.use_kl_loss and ours.actor_rollout_ref.actor.kl_loss_coef == 0.04
    assert ours.algorithm.norm_adv_by_std_in_grpo is False and ours.trainer.save_freq == -1
    assert "config: TRL's learning_rate=0.003 -> actor_rollout_ref.actor.optim.lr=0.003" in caplog.text
    assert "config: TRL's per_device_train_batch_size=8 -> data.train_batch_size=2" in caplog.text

    trl = _TRLRun(trainer.train_processor, model=None, tokenizer=None).grpo_args()
    for name, value in config.items():
        if "." in name:
            continue
        got = getattr(trl, name)
        assert (got.value if hasattr(got, "value") else got) == value, name

    result = trainer.train()
    assert result.steps == 2


def test_batch_sizes_follow_trls_arithmetic():
    config = Config.build({"num_generations": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
                           "steps_per_generation": 4})
    # A generation round is 8 x 4 = 32 completions (8 prompts); an optimizer step 8 x 2 = 16 (4 prompts).
    assert config.data.train_batch_size == 8 and config.actor_rollout_ref.actor.ppo_mini_batch_size == 4


def test_a_layer_with_batch_sizes_alone_uses_the_configs_group_size():
    config = Config.build({"per_device_train_batch_size": 12}, base={"actor_rollout_ref.rollout.n": 3})
    assert config.data.train_batch_size == 4


def test_trls_defaults_ask_for_nothing_and_no_effect_names_are_accepted(caplog):
    with caplog.at_level(logging.INFO, logger="training"):
        config = Config.build({"push_to_hub": False, "use_vllm": False, "remove_unused_columns": True, "report_to": "none",
                               "bf16": False, "warmup_ratio": 0.0})
    assert config == Config.build(None)
    assert "TRL's push_to_hub=False is TRL's default; nothing to set" in caplog.text


def test_eval_strategy_steps_is_validation_every_eval_steps():
    assert Config.build({"eval_strategy": "steps", "eval_steps": 5}).trainer.test_freq == 5
    assert Config.build({"num_generations_eval": 3}).actor_rollout_ref.rollout.val_kwargs.n == 3


def test_aworlds_default_trl_config_is_refused_where_it_cannot_be_honoured(tmp_path):
    with pytest.raises(ConfigError, match=r"^output_dir: output_dir cannot be used here: the run writes under run_path"):
        Config.build(AWORLD_TRL_DEFAULTS)  # the trainer takes a dict's output_dir as its run path (test_aworld_trl_runs.py)
    rest = {k: v for k, v in AWORLD_TRL_DEFAULTS.items() if k != "output_dir"}
    with pytest.raises(ConfigError, match=r"^fp16: TRL's GRPOConfig option fp16=True cannot be honoured: mixed precision"):
        Config.build(rest)
    rest = {k: v for k, v in rest.items() if k != "fp16"}
    assert Config.build({**rest, "model": "tiny-char"}).actor_rollout_ref.model.path == "tiny-char"  # AWorld's name for it
    config = Config.build(rest)
    assert config.data.max_prompt_length == 12800 and config.data.train_batch_size == 1
    assert config.trainer.save_freq == 100 and config.trainer.total_training_steps == 2


@pytest.mark.parametrize("override, message", [
    ({"learning_rat": 1e-5}, "learning_rat: unknown config key. Did you mean 'learning_rate' (TRL's GRPOConfig name)?"),
    ({"loss_type": "bnpo"}, "loss_type: 'bnpo' cannot be honoured: use one of dapo, grpo, luspo, dr_grpo"),
    ({"importance_sampling_level": "word"}, "importance_sampling_level: 'word' cannot be honoured"),
    ({"use_vllm": True}, "use_vllm: TRL's GRPOConfig option use_vllm=True cannot be honoured: generation with vLLM belongs to the verl backend"),
    ({"trust_remote_code": True}, "trust_remote_code: trust_remote_code cannot be used here: set actor_rollout_ref.model.trust_remote_code"),
    ({"num_generations": 3, "per_device_train_batch_size": 8}, "per_device_train_batch_size: per_device_train_batch_size x gradient_accumulation_steps = 8 completions must be a multiple of num_generations (3)"),
    ({"scale_rewards": "batch"}, "scale_rewards: 'batch' cannot be honoured"),
    ({"save_strategy": "epoch"}, "save_strategy: 'epoch' cannot be honoured"),
    ({"report_to": ["comet_ml"]}, "report_to: ['comet_ml'] cannot be honoured"),
    ({"epsilon_high": 1.28}, "epsilon_high: must be between 0 and 1, got 1.28. (TRL's epsilon_high sets actor_rollout_ref.actor.clip_ratio_high)"),
    ({"max_steps": -1}, "max_steps: must be at least 1. (TRL's max_steps sets trainer.total_training_steps)"),
    ({"lr_scheduler_type": "linear"}, "lr_scheduler_type: must be 'constant' or 'cosine', not 'linear'."),
])
def test_a_grpo_name_that_cannot_be_honoured_is_refused_naming_it(tmp_path, override, message):
    with pytest.raises(ConfigError) as error:
        AgentTrainer(train_dataset=[{"prompt": "x"}], reward_func=batch_reward, config=override, run_path=str(tmp_path),
                     train_engine_name="trl")
    assert str(error.value).startswith(message)


def test_trls_top_k_is_the_rollouts_top_k():
    assert Config.build({"top_k": 50}).actor_rollout_ref.rollout.top_k == 50
