"""Validation on the trl backend (``trainer.test_freq``, ``trainer.val_before_train``,
``actor_rollout_ref.rollout.val_kwargs.*``, metrics per data source), and ``AgentTrainer.inference()``
/ ``evaluate()``: the agent on a test dataset, per-row results and per-source metrics."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import torch

from training import AgentTrainer
from training.errors import ConfigError
from training.rollouts.generation import HFBatchGenerator
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model
from training.rollouts.validation import EvalResult, pass_at_k

TRAIN = [{"prompt": p, "ground_truth": "a"} for p in "wxyz"]
# Two sources, so the metrics come apart by data_source.
TEST = [{"prompt": "u", "ground_truth": "a", "data_source": "letters"},
        {"prompt": "v", "ground_truth": "a", "data_source": "letters"},
        {"prompt": "7", "ground_truth": "a", "data_source": "digits"}]


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0


def tiny(**extra) -> dict:
    return {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
            "data.max_response_length": 2, "trainer.total_training_steps": 3, "trainer.logger": [], **extra}


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)


def test_greedy_generation_matches_transformers_greedy_decoding():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    prompt = tokenizer("abc", add_special_tokens=False)["input_ids"]
    ours = HFBatchGenerator(model, tokenizer, do_sample=False).generate_batch([prompt], [6])[0]
    theirs = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id)
    assert ours.completion_ids == theirs[0, len(prompt):].tolist()[: len(ours.completion_ids)]


@pytest.mark.slow
def test_the_test_dataset_is_scored_on_schedule_per_data_source(tmp_path, sink, caplog):
    config = tiny(**{"trainer.test_freq": 2, "actor_rollout_ref.rollout.val_kwargs.n": 3,
                     "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
                     "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0})
    with caplog.at_level(logging.INFO, logger="training"):
        result = AgentTrainer(train_dataset=TRAIN, val_dataset=TEST, reward_func=starts_with_a, backend="trl",
                              run_path=str(tmp_path), config=config, sinks=[sink]).train()
    assert result.steps == 3
    validated = [m for m in sink.metrics if "val/letters/reward" in m]
    # Before training (val_before_train is on by default), every test_freq steps, and after the last.
    assert [m["step"] for m in validated] == [0, 2, 3]
    for metrics in validated:
        for source in ("letters", "digits"):
            assert {f"val/{source}/reward", f"val/{source}/pass@1", f"val/{source}/pass@3"} <= set(metrics)
            assert 0.0 <= metrics[f"val/{source}/pass@1"] <= metrics[f"val/{source}/pass@3"] <= 1.0
    step_two = [m for m in sink.metrics if m["step"] == 2]
    assert len(step_two) == 1 and "reward" in step_two[0]  # one report with the training metrics of step 2
    assert "val/digits/reward" in result.metrics
    assert "validation at step 0 (3 tasks" in caplog.text


@pytest.mark.slow
def test_a_resumed_run_does_not_score_its_start_again(tmp_path, sink):
    first = tiny(**{"trainer.total_training_steps": 2, "trainer.save_freq": 1})
    AgentTrainer(train_dataset=TRAIN, val_dataset=TEST, reward_func=starts_with_a, backend="trl",
                 run_path=str(tmp_path), config=first, sinks=[sink]).train()
    assert [m["step"] for m in sink.metrics if "val/letters/reward" in m] == [0]
    sink.metrics.clear()
    AgentTrainer(train_dataset=TRAIN, val_dataset=TEST, reward_func=starts_with_a, backend="trl",
                 run_path=str(tmp_path), config=tiny(**{"trainer.total_training_steps": 4}), sinks=[sink]).train()
    assert [m["step"] for m in sink.metrics if "reward" in m] == [3, 4]  # resumed after step 2
    assert not any("val/letters/reward" in m for m in sink.metrics)


@pytest.mark.slow
def test_validation_off_and_on_its_own_step(tmp_path, sink):
    AgentTrainer(train_dataset=TRAIN, val_dataset=TEST, reward_func=starts_with_a, backend="trl",
                 run_path=str(tmp_path / "off"), config=tiny(**{"trainer.val_before_train": False}), sinks=[sink]).train()
    assert not any(key.startswith("val/") for m in sink.metrics for key in m)

    sink.metrics.clear()
    config = tiny(**{"trainer.val_before_train": False, "trainer.test_freq": 3, "trainer.log_freq": 2})
    AgentTrainer(train_dataset=TRAIN, val_dataset=TEST, reward_func=starts_with_a, backend="trl",
                 run_path=str(tmp_path / "own"), config=config, sinks=[sink]).train()
    assert [m["step"] for m in sink.metrics] == [2, 3]  # step 3 is not a logging step: its scores alone
    assert "val/letters/reward" in sink.metrics[1] and "reward" not in sink.metrics[1]


def test_greedy_validation_gives_the_same_scores_twice(tmp_path, sink):
    config = tiny(**{"trainer.total_training_steps": 1, "trainer.test_freq": 1, "actor_rollout_ref.actor.optim.lr": 1e-9})
    AgentTrainer(train_dataset=TRAIN, val_dataset=TEST, reward_func=starts_with_a, backend="trl",
                 run_path=str(tmp_path), config=config, sinks=[sink]).train()
    before, after = (m for m in sink.metrics if "val/letters/reward" in m)
    assert {k: v for k, v in before.items() if k.startswith("val/")} == {k: v for k, v in after.items() if k.startswith("val/")}


@pytest.mark.slow
def test_inference_and_evaluate_after_training(tmp_path, caplog):
    trainer = AgentTrainer(train_dataset=TRAIN, test_dataset=TEST, reward_func=starts_with_a, train_engine_name="trl",
                           run_path=str(tmp_path), config=tiny(**{"trainer.total_training_steps": 1}))
    with caplog.at_level(logging.INFO, logger="training"):
        untrained = trainer.evaluate()
    assert "inference with the base model" in caplog.text
    trainer.train()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="training"):
        result = asyncio.run(trainer.inference())  # AWorld's form: a coroutine
    assert "inference with the trained weights in" in caplog.text and "final_model" in caplog.text
    assert isinstance(result, EvalResult) and isinstance(untrained, EvalResult)
    assert [row["data_source"] for row in result.rows] == ["letters", "letters", "digits"]
    row = result.rows[0]
    assert row["task"]["prompt"] == "u" and len(row["responses"]) == 1 and row["termination_reasons"][0] in ("env_done", "max_response_length")
    assert row["rewards"] == [starts_with_a(None, row["responses"][0])]
    assert set(result.metrics) == {"test/letters/reward", "test/letters/pass@1", "test/digits/reward", "test/digits/pass@1"}
    # AWorld's evolution runner writes the result with json.dump
    written = tmp_path / "evaluation_result.json"
    with open(written, "w") as f:
        json.dump(result, f, indent=4, ensure_ascii=False)
    assert json.loads(written.read_text()) == {"metrics": result.metrics, "rows": result.rows}

    other = trainer.evaluate([{"prompt": "q", "ground_truth": "a"}])
    assert [row["data_source"] for row in other.rows] == ["default"] and "test/default/reward" in other.metrics


def test_inference_needs_a_dataset(tmp_path):
    trainer = AgentTrainer(train_dataset=TRAIN, reward_func=starts_with_a, train_engine_name="trl",
                           run_path=str(tmp_path), config=tiny())
    with pytest.raises(ValueError, match="inference: no dataset to run on; pass one, or give test_dataset"):
        trainer.evaluate()


def test_scoring_on_schedule_needs_a_test_dataset(tmp_path):
    with pytest.raises(ValueError, match=r"^trainer.test_freq: scoring every 5 steps needs a test dataset"):
        AgentTrainer(train_dataset=TRAIN, reward_func=starts_with_a, backend="trl", run_path=str(tmp_path),
                     config=tiny(**{"trainer.test_freq": 5}))


@pytest.mark.parametrize("override, message", [
    ({"actor_rollout_ref.rollout.val_kwargs.do_sample": True},
     "actor_rollout_ref.rollout.val_kwargs.temperature: must be greater than 0 when do_sample is true"),
    ({"actor_rollout_ref.rollout.val_kwargs.n": 0}, "actor_rollout_ref.rollout.val_kwargs.n: must be at least 1."),
    ({"actor_rollout_ref.rollout.val_kwargs.top_p": 1.5}, "actor_rollout_ref.rollout.val_kwargs.top_p: must be in (0, 1]."),
    ({"actor_rollout_ref.rollout.val_kwargs.top_k": -2}, "actor_rollout_ref.rollout.val_kwargs.top_k: must be -1 or 0 (off) or a number of tokens."),
    ({"trainer.test_freq": -2}, "trainer.test_freq: must be -1 or 0 (never) or a number of steps."),
])
def test_bad_validation_settings_are_refused_named(tmp_path, override, message):
    with pytest.raises(ConfigError) as error:
        AgentTrainer(train_dataset=TRAIN, val_dataset=TEST, reward_func=starts_with_a, backend="trl",
                     run_path=str(tmp_path), config=tiny(**override))
    assert str(error.value).startswith(message)
