"""rLLM's ``AgentSFTTrainer`` on the trl backend (TRL's SFTTrainer), with rLLM's SFT launch script's
config and data made by its ``process_trajectories``: the tiny model's negative log-likelihood of the
trained replies falls (computed, not sampled) and its weights change."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import datasets
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from training import Step, Trajectory
from training.compat.rllm.sft import AgentSFTTrainer, SFTSettings, mean_nll
from training.rollouts.tiny import build_char_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import rllm_train_math_sft  # noqa: E402

# rLLM v0.2.1.post1 examples/sft/train_math_sft.sh, its overrides verbatim.
TRAIN_MATH_SFT = shlex.split("""
model.partial_pretrain=Qwen/Qwen2.5-Math-7B-Instruct model.trust_remote_code=true
model.enable_gradient_checkpointing=true model.lora_rank=32 model.lora_alpha=16 trainer.total_epochs=3
data.train_batch_size=4 data.micro_batch_size_per_gpu=2 data.max_length=13500 data.truncation=right
data.multiturn.enable=true data.multiturn.messages_key=messages data.train_files=train_data_5000.parquet
data.val_files=eval_data_1000.parquet trainer.default_local_dir=outputs/qwen2.5_math_sft
trainer.logger='["console", "wandb"]' trainer.project_name=math-tool-sft optim.lr=1e-5
""")  # split as bash splits it

QUESTIONS = [("2+3=", "5"), ("4+4=", "8"), ("1+6=", "7"), ("9-2=", "7"), ("3*3=", "9"), ("8-5=", "3")]


def conversations() -> list[Trajectory]:
    """Trajectories as an agent leaves them (the last step's chat_completions is the conversation),
    rewarded 1 when right; a wrong one and a two-turn one among them."""
    trajectories = []
    for question, answer in QUESTIONS:
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        trajectories.append(Trajectory(steps=[Step(chat_completions=messages)], reward=1.0))
    wrong = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "3"}]
    trajectories.append(Trajectory(steps=[Step(chat_completions=wrong)], reward=0.0))
    two_turns = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"},
                 {"role": "user", "content": " +1="}, {"role": "assistant", "content": "5"}]
    trajectories.append(Trajectory(steps=[Step(chat_completions=two_turns)], reward=1.0))
    return trajectories


@pytest.mark.slow
def test_the_launch_scripts_keys_train_the_tiny_model_on_process_trajectories_data(tmp_path, capsys):
    rows = AgentSFTTrainer.process_trajectories(conversations(), reward_threshold=1.0)
    assert "Processed 8 trajectories -> 7 valid examples" in capsys.readouterr().out
    assert {"role": "user", "content": "1+1="} not in [m for r in rows for m in r["messages"]]  # reward 0: left out
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "train.parquet")
    datasets.Dataset.from_list(rows[:2]).to_parquet(tmp_path / "val.parquet")
    tiny = [  # the tiny model on a CPU instead of Qwen2.5-Math-7B on two GPUs, and this test's files
        "model.partial_pretrain=tiny-char", "model.trust_remote_code=false", "model.enable_gradient_checkpointing=false",
        f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files={tmp_path / 'val.parquet'}",
        f"trainer.default_local_dir={tmp_path / 'sft'}", "optim.lr=3e-2", "trainer.total_epochs=20", "trainer.device=cpu",
        "model.lora_rank=0",  # all weights: LoRA moves the tiny model slowly (the next test checks it)
    ]
    replaced = {override.split("=")[0] for override in tiny}
    config = [o for o in TRAIN_MATH_SFT if o.split("=")[0] not in replaced] + tiny
    trainer = AgentSFTTrainer(config=config)
    assert trainer.settings.micro_batch_size == 2 and trainer.settings.truncation == "right"
    assert set(trainer.settings.unused) == {"data.multiturn.enable", "trainer.logger", "trainer.project_name"}

    # rLLM's train_math_sft.py: its hydra main called with the config (Hydra passes a given config through).
    rllm_train_math_sft.main(OmegaConf.from_dotlist(config))

    tokenizer = build_char_tokenizer()
    trained_rows = [trainer.tokenize(r["messages"], tokenizer) for r in rows]
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "sft" / "base_model")
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "sft" / "final_model")  # LoRA merged into the weights
    before, after = mean_nll(base, trained_rows), mean_nll(tuned, trained_rows)
    assert after < before - 1.5, (before, after)
    old, new = base.state_dict(), tuned.state_dict()
    changed = [name for name in old if not torch.equal(old[name], new[name])]
    assert len(changed) >= len(old) // 2, changed
    assert (tmp_path / "sft" / "final_model" / "config.json").is_file()


@pytest.mark.slow
def test_lora_adapters_are_trained_and_merged_into_the_saved_model(tmp_path):
    rows = AgentSFTTrainer.process_trajectories(conversations(), reward_threshold=1.0)
    config = {"model.partial_pretrain": "tiny-char", "model.lora_rank": 32, "model.lora_alpha": 16, "optim.lr": 3e-2,
              "trainer.total_epochs": 20, "trainer.default_local_dir": str(tmp_path), "trainer.device": "cpu"}
    trainer = AgentSFTTrainer(config, train_dataset=rows)
    result = trainer.train()
    tokenizer = build_char_tokenizer()
    trained_rows = [trainer.tokenize(r["messages"], tokenizer) for r in rows]
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model")
    tuned = AutoModelForCausalLM.from_pretrained(result.model_dir)  # a plain model: no adapter files to load
    assert not (result.model_dir / "adapter_config.json").exists()
    before, after = mean_nll(base, trained_rows), mean_nll(tuned, trained_rows)
    assert after < before - 0.3, (before, after)
    old, new = base.state_dict(), tuned.state_dict()
    projections = [name for name in old if name.endswith(("q_proj.weight", "down_proj.weight"))]
    assert projections and all(not torch.equal(old[name], new[name]) for name in projections)
    assert result.steps == 20 * 2 and len(result.losses) == result.steps  # 7 rows, 4 a step: 2 steps an epoch


def test_cumulative_trains_every_reply_and_stepwise_the_last():
    tokenizer = build_char_tokenizer()
    messages = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"},
                {"role": "user", "content": "d"}, {"role": "assistant", "content": "ef"}]
    eos = tokenizer.eos_token_id
    ids = tokenizer.convert_tokens_to_ids(list("abc")) + [eos] + tokenizer.convert_tokens_to_ids(list("def")) + [eos]
    cumulative = AgentSFTTrainer({"model.partial_pretrain": "tiny-char"})
    stepwise = AgentSFTTrainer({"model": {"partial_pretrain": "tiny-char"}, "data": {"rllm": {"tokenize_and_mask_method": "stepwise"}}})
    assert cumulative.tokenize(messages, tokenizer) == (ids, [0, 0, 1, 1, 0, 1, 1, 1])
    assert stepwise.tokenize(messages, tokenizer) == (ids, [0, 0, 0, 0, 0, 1, 1, 1])


def test_bad_rows_keys_and_backends_are_refused_by_name(tmp_path):
    base = {"model.partial_pretrain": "tiny-char", "trainer.default_local_dir": str(tmp_path)}
    with pytest.raises(ValueError, match=r"train_dataset row 1: no 'messages' list.*fields are \['question'\]"):
        AgentSFTTrainer(base, train_dataset=[{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                                              "question": None}, {"messages": None, "question": "x"}]).train()
    with pytest.raises(ValueError, match=r"train_dataset row 0: no assistant tokens to train on"):
        AgentSFTTrainer(base, train_dataset=[{"messages": [{"role": "user", "content": "a"}]}]).train()
    with pytest.raises(ValueError, match=r"row 0: 5 tokens, more than data.max_length=3 \(set data.truncation"):
        AgentSFTTrainer({**base, "data.max_length": 3},
                        train_dataset=[{"messages": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "d"}]}]).train()
    with pytest.raises(ValueError, match=r"data\.max_lenght is not a key this trainer knows"):
        SFTSettings.from_config({**base, "data.max_lenght": 8})
    with pytest.raises(ValueError, match=r"data.rllm.tokenize_and_mask_method: 'per_turn' is not cumulative or stepwise"):
        SFTSettings.from_config({**base, "data.rllm.tokenize_and_mask_method": "per_turn"})
    with pytest.raises(ValueError, match=r"backend='verl'.*runs on the trl backend"):
        AgentSFTTrainer(base, backend="verl")


# -- the tinker backend: examples/sft_tinker/train_norobots_tinker.py ----------------------------------

# rLLM v0.2.1.post1 examples/sft_tinker/train_norobots_tinker.sh, the overrides it passes (its defaults).
TRAIN_NOROBOTS_TINKER = shlex.split("""
model.name=meta-llama/Llama-3.1-8B model.lora_rank=32 data.train_batch_size=128 data.max_length=32768
data.renderer_name=llama3 data.rllm.tokenize_and_mask_method=cumulative optim.lr=2e-4 optim.lr_scheduler=linear
trainer.total_epochs=1 trainer.project_name=rllm-tinker-norobots trainer.experiment_name=sl_basic
trainer.save_freq=20 trainer.test_freq=8 trainer.default_local_dir=/tmp/rllm-tinker-examples/sft_norobots
""")


@pytest.mark.slow
def test_the_norobots_tinker_script_trains_through_the_tinker_sdk(tmp_path, monkeypatch):
    """The real ``tinker`` SDK against the loopback stand-in of the Tinker service (no network here),
    which trains a real tiny model: the service's weights change and their NLL of the replies falls."""
    from standins.tinker_service import TinkerStandIn

    import rllm_train_norobots_tinker
    from training.data import DatasetRegistry
    from training.rollouts.tiny import build_tiny_model

    service = TinkerStandIn()
    monkeypatch.setenv("TINKER_API_KEY", service.api_key)
    monkeypatch.setattr(DatasetRegistry, "_splits", dict(DatasetRegistry._splits))
    try:
        rows = AgentSFTTrainer.process_trajectories(conversations(), reward_threshold=1.0)
        DatasetRegistry.register_dataset("norobots", rows, "train")  # as its prepare_norobots_dataset.py does
        DatasetRegistry.register_dataset("norobots", rows[:2], "test")
        tiny = ["model.name=tiny-char", "data.train_batch_size=7", "optim.lr=5e-2", "optim.lr_scheduler=constant",
                "trainer.total_epochs=12", f"trainer.default_local_dir={tmp_path}", f"tinker_base_url={service.url}"]
        replaced = {override.split("=")[0] for override in tiny}
        config = OmegaConf.from_dotlist([o for o in TRAIN_NOROBOTS_TINKER if o.split("=")[0] not in replaced] + tiny)
        rllm_train_norobots_tinker.main(config)

        [policy] = service.models.values()
        tokenizer = build_char_tokenizer()
        trainer = AgentSFTTrainer(config)
        trained_rows = [trainer.tokenize(r["messages"], tokenizer) for r in rows]
        base = build_tiny_model(tokenizer, seed=0)  # what the stand-in starts from
        before, after = mean_nll(base, trained_rows), mean_nll(policy.model, trained_rows)
        assert after < before - 1.0, (before, after)
        old, new = base.state_dict(), policy.model.state_dict()
        assert sum(not torch.equal(old[k], new[k]) for k in old) >= len(old) // 2
        assert service.counts["forward_backward"] == service.counts["optim_step"] == 12  # one batch of 7 an epoch
        assert service.learning_rates == [5e-2] * 12
    finally:
        service.close()


def test_the_tinker_backend_needs_its_api_key(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    trainer = AgentSFTTrainer({"model.name": "tiny-char"}, train_dataset=[{"messages": []}], backend="tinker")
    with pytest.raises(ValueError, match="TINKER_API_KEY is not set"):
        trainer.train()
