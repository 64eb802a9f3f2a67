"""The 2025 recipes under verl's keys on the trl backend: each option reaches TRL, the loss changes
with it, and the loss equals verl's policy loss with the same keys on the same batch."""

from pathlib import Path

import pytest
import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig as VerlActorConfig

from training import AgentTrainer
from training.backends.trl.backend import _TRLRun
from training.cli import build_trainer, load_run_file
from training.config import Config
from training.errors import ConfigError
from training.rollouts.models import load_policy
from training.algorithms.recipes import overlong_penalties

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
MAX_TOKENS = 6
ROWS = 8


def char_reward(task, response):
    return 1.0 if response.startswith("a") else 0.0


def grpo_trainer(tmp_path: Path, overrides: dict):
    """Our trl backend's GRPOTrainer for ``overrides`` (built as train() builds it, not run)."""
    config = {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
        "data.max_response_length": MAX_TOKENS, "trainer.logger": [], "trainer.total_training_steps": 1, **overrides,
    }
    trainer = AgentTrainer(train_dataset=[{"prompt": "x="}, {"prompt": "y="}], reward_func=char_reward, backend="trl",
                           run_path=str(tmp_path), config=config)
    processor = trainer.train_processor
    torch.manual_seed(0)
    model, tokenizer, _ = load_policy(processor.config, processor.run_path)
    grpo = _TRLRun(processor, model, tokenizer).build_trainer()
    grpo.model.train()
    grpo.current_gradient_accumulation_steps = 1
    return grpo, processor.config


def off_policy_batch(grpo):
    """Eight responses of different lengths, token advantages, and old log-probs off the current
    ones by up to +-0.4 (so that clipping and the ratio level matter)."""
    generator = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, 40, (ROWS, 3), generator=generator)
    completion_ids = torch.randint(3, 40, (ROWS, MAX_TOKENS), generator=generator)
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    mask = (torch.arange(MAX_TOKENS).unsqueeze(0) < lengths.unsqueeze(1)).long()
    with torch.no_grad():
        current, _, _ = grpo._get_per_token_logps_and_entropies(
            grpo.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([torch.ones_like(prompt_ids), mask], 1),
            MAX_TOKENS,
        )
    advantages = torch.randn(ROWS, generator=generator).unsqueeze(1) * mask
    old = current + (torch.rand(ROWS, MAX_TOKENS, generator=generator) - 0.5) * 0.8
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
        "completion_mask": mask, "advantages": advantages, "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    return inputs, current


def verl_loss(config: Config, inputs, current) -> float:
    """verl's policy loss (the registered loss_mode, aggregated by verl's agg_loss) on the same batch."""
    actor = config.actor_rollout_ref.actor
    from verl.workers.config import PolicyLossConfig

    verl_actor = VerlActorConfig(
        strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, rollout_n=1,
        clip_ratio=actor.clip_ratio, clip_ratio_low=actor.clip_ratio_low, clip_ratio_high=actor.clip_ratio_high,
        loss_agg_mode=actor.loss_agg_mode, loss_scale_factor=config.data.max_response_length,
        policy_loss=PolicyLossConfig(loss_mode=actor.policy_loss.loss_mode),
    )
    loss_fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    loss, _ = loss_fn(
        old_log_prob=inputs["old_per_token_logps"], log_prob=current, advantages=inputs["advantages"],
        response_mask=inputs["completion_mask"].float(), loss_agg_mode=actor.loss_agg_mode, config=verl_actor,
    )
    return float(loss)


RECIPES = {
    "token-mean (DAPO, default)": {},
    "clip-higher": {"actor_rollout_ref.actor.clip_ratio_high": 0.28, "actor_rollout_ref.actor.clip_ratio_low": 0.1},
    "seq-mean-token-mean (GRPO)": {"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"},
    "seq-mean-token-sum": {"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum"},
    "seq-mean-token-sum-norm (Dr. GRPO)": {"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm"},
    "gspo": {"actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
             "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"},
}


@pytest.fixture(scope="module")
def default_loss(tmp_path_factory):
    grpo, _ = grpo_trainer(tmp_path_factory.mktemp("default"), {})
    inputs, _ = off_policy_batch(grpo)
    with torch.no_grad():
        return float(grpo._compute_loss(grpo.model, inputs))


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_loss_key_reaches_trl_and_gives_verls_loss(tmp_path, recipe, default_loss):
    grpo, config = grpo_trainer(tmp_path, RECIPES[recipe])
    inputs, current = off_policy_batch(grpo)
    with torch.no_grad():
        ours = float(grpo._compute_loss(grpo.model, inputs))
    assert ours == pytest.approx(verl_loss(config, inputs, current), abs=1e-6)
    if RECIPES[recipe]:  # the option changed what is optimized, not only a name in a config
        assert abs(ours - default_loss) > 1e-4


def test_our_loss_is_trls_loss_on_the_same_batch(tmp_path):
    """The subclass changes advantages only: TRL's GRPOTrainer itself gives the same loss."""
    from trl import GRPOTrainer

    grpo, _ = grpo_trainer(tmp_path, {"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm"})
    inputs, _ = off_policy_batch(grpo)
    with torch.no_grad():
        ours = grpo._compute_loss(grpo.model, inputs)
        trls = GRPOTrainer._compute_loss(grpo, grpo.model, inputs)
    assert torch.equal(ours, trls)


def test_the_options_arrive_in_grpo_config(tmp_path):
    grpo, _ = grpo_trainer(tmp_path, {
        "actor_rollout_ref.actor.clip_ratio_high": 0.28, "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo", "reward_model.overlong_buffer.enable": True,
        "reward_model.overlong_buffer.len": 2, "reward_model.overlong_buffer.penalty_factor": 0.5,
    })
    args = grpo.args
    assert (args.loss_type, args.importance_sampling_level, args.epsilon, args.epsilon_high) == ("dr_grpo", "sequence", 0.2, 0.28)
    assert grpo.reward_func_names[1] == "soft_overlong_punishment_reward"
    assert grpo.reward_weights.tolist() == [1.0, 0.5]


def test_overlong_penalty_is_verls_dapo_shaping():
    config = Config.build({"data.max_response_length": 10, "reward_model.overlong_buffer.enable": True,
                           "reward_model.overlong_buffer.len": 4, "reward_model.overlong_buffer.penalty_factor": 0.5})
    lengths = [3, 6, 7, 8, 10]
    # verl's DAPO reward manager: min(-(length - (max - len)) / len * factor, 0)
    expected = [min(-(n - 6) / 4 * 0.5, 0.0) for n in lengths]
    assert overlong_penalties(config, [[0] * n for n in lengths]) == pytest.approx(expected)


@pytest.mark.parametrize("override, message", [
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "clip_cov"}, "actor_rollout_ref.actor.policy_loss.loss_mode: 'clip_cov' cannot be honoured by the trl backend"),
    ({"algorithm.adv_estimator": "remax"}, "algorithm.adv_estimator: remax needs a greedy baseline rollout"),
    ({"algorithm.adv_estimator": "gae"}, "algorithm.adv_estimator: gae needs a critic"),
    ({"actor_rollout_ref.actor.loss_agg_mode": "token-sum-mean"}, "actor_rollout_ref.actor.loss_agg_mode: must be one of token-mean"),
    ({"actor_rollout_ref.actor.clip_ratio_high": 1.5}, "actor_rollout_ref.actor.clip_ratio_high: must be between 0 and 1"),
    ({"reward_model.overlong_buffer.enable": True}, "reward_model.overlong_buffer.len: must be at least 1 token"),
    ({"reward_model.overlong_buffer.enable": True, "reward_model.overlong_buffer.len": 6}, "reward_model.overlong_buffer.len: must be shorter than data.max_response_length (6)"),
])
def test_what_the_trl_backend_cannot_honour_is_refused_by_name(tmp_path, override, message):
    with pytest.raises(ConfigError) as error:
        grpo_trainer(tmp_path, override)
    assert str(error.value).startswith(message)


# -- the example configs: each trains and its option reached TRL -------------------------------------

EXPECTED_ARGS = {
    "dapo.yaml": {"loss_type": "dapo", "epsilon_high": 0.28, "epsilon": 0.2},
    "gspo.yaml": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 0.0003, "epsilon_high": 0.0004},
    "dr_grpo.yaml": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "overlong.yaml": {"reward_weights": [1.0, 0.5]},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED_ARGS))
def test_each_recipe_example_trains_with_its_options(tmp_path, sink, name, monkeypatch):
    import examples  # noqa: F401  (the copy dataset)
    from transformers import AutoModelForCausalLM

    run = load_run_file(EXAMPLES / name, ["trainer.total_training_steps=3", "trainer.val_before_train=false",
                                          "trainer.logger=[]", "trainer.test_freq=-1"])
    run["run_path"] = str(tmp_path)
    trainer = build_trainer(run, [sink])
    seen = {}
    original = _TRLRun.build_trainer

    def spy(self):
        seen["args"] = (grpo := original(self)).args
        return grpo

    monkeypatch.setattr(_TRLRun, "build_trainer", spy)
    result = trainer.train()
    assert result.steps == 3
    for option, value in EXPECTED_ARGS[name].items():
        assert getattr(seen["args"], option) == value, option
    before = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all("loss" in m and "reward" in m for m in sink.metrics)


def test_the_entropy_bonus_reaches_the_loss(tmp_path, default_loss):
    """actor.entropy_coeff is TRL's entropy_coef: the loss is the policy loss minus the coefficient
    times the mean entropy over the response tokens (verl's token-mean entropy_loss)."""
    coeff = 0.05
    grpo, _ = grpo_trainer(tmp_path, {"actor_rollout_ref.actor.entropy_coeff": coeff})
    assert grpo.args.entropy_coef == coeff
    inputs, _ = off_policy_batch(grpo)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        ours = float(grpo._compute_loss(grpo.model, inputs))
        _, entropies, _ = grpo._get_per_token_logps_and_entropies(grpo.model, ids, attention, MAX_TOKENS, compute_entropy=True)
    mask = inputs["completion_mask"].float()
    mean_entropy = float((entropies * mask).sum() / mask.sum())
    assert mean_entropy > 1.0  # a fresh model: the bonus is far from zero
    assert ours == pytest.approx(default_loss - coeff * mean_entropy, abs=1e-6)
