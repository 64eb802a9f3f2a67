"""The verl backend keeps every episode: what verl's rollout dump carries reaches the episode store.

verl's trainer cannot run here (CUDA GPUs, vLLM): verl's job is ``standins.verl_trainer``, a
stand-in of its trainer loop that dumps each step's rollouts with verl's own dump method
(``PPOTrainer._log_rollout_data`` of verl's default trainer, made to add our columns by
``training.backends.verl.dumps``), each sample made by our agent loop's own functions or as verl's
single-turn loop returns it. Our agent loop itself runs in ``test_verl_agent_loop`` against a
scripted server; here the driver side: the metrics bridge reading the dump into records, the share
kept, and the run folder's Parquet files, the advantages recomputed with verl's own estimators, and
the validation episodes verl dumps."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from standins.verl_trainer import SINGLE_TURN_SECONDS, TURN_SECONDS, StandInVerlJob
from test_verl_agent_loop import AGENT_ENV, EchoAgent, GuessEnv, base_verl_config, run_loop  # noqa: F401 - a fixture
from training import AgentTrainer
from training.backends.verl import backend as verl_backend
from training.backends.verl.backend import EPISODE_RECORD_KEY, rollout_rows_to_records
from training.rollouts.tiny import build_char_tokenizer
from training.tracking.episodes import read_run_folder

STEPS = 3


@pytest.fixture(autouse=True)
def one_gpu(monkeypatch):
    monkeypatch.setattr(verl_backend, "cuda_device_count", lambda: 1)  # check_config composes for one GPU


def verl_run(tmp_path, test_dataset=None, single_turn=False, val_batch_size=None, **config):
    agent = {"reward_func": "exact_match"} if single_turn else {"agent_class": EchoAgent, "env_class": GuessEnv}
    if single_turn:
        config.setdefault("data.answer_key", "target")
    trainer = AgentTrainer(
        backend="verl", **agent,
        train_dataset=[{"prompt": "go>", "target": "b"}, {"prompt": "go>", "target": "c"}], test_dataset=test_dataset,
        run_path=str(tmp_path), config={
            "actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 3,
            "trainer.total_training_steps": STEPS, "trainer.save_freq": -1, "trainer.logger": [], **config},
    )
    processor = trainer.train_processor
    job = StandInVerlJob(processor, val_batch_size=val_batch_size)
    processor.train_with(None, job.launch, job.end_job)
    return processor


def stored(tmp_path, split="train") -> list[dict]:
    return read_run_folder(tmp_path, split)


def test_a_verl_run_stores_every_episode_with_what_verl_and_our_agent_loop_give(tmp_path):
    verl_run(tmp_path)
    records = stored(tmp_path)
    tokenizer = build_char_tokenizer()

    assert [(r["step"], r["position"]) for r in records] == [(s, p) for s in range(1, STEPS + 1) for p in range(6)]
    first = records[0]
    # One group (verl's uid) per prompt, rollout.n episodes in it, in verl's order.
    groups = [r["group"] for r in records[:6]]
    assert len(set(groups)) == 2 and groups[0] == groups[2] != groups[3] and len(groups[0]) == 36
    assert [r["group_position"] for r in records[:6]] == [0, 1, 2, 0, 1, 2]
    assert first["reward"] == 1.0 and records[1]["reward"] == 0.0
    assert first["reward_components"] == {"score": 1.0, "format": 0.5, "answer": 1.0}
    assert first["is_correct"] and not records[1]["is_correct"] and first["termination_reason"] == "env_done"
    assert first["data_source"] == "guess" and [r["row_index"] for r in records[:6]] == [0, 0, 0, 1, 1, 1]
    assert first["prompt_ids"] == tokenizer.encode("go0>", add_special_tokens=False)
    assert first["token_ids"] == tokenizer.encode("ano>b", add_special_tokens=False)
    assert first["mask"] == [1, 0, 0, 0, 1] and first["logprobs"] == [-0.5, 0.0, 0.0, 0.0, -0.25]
    assert first["token_texts"] == ["a", "n", "o", ">", "b"]  # each response token decoded alone
    assert first["prompt_length"] == 4 and first["response_length"] == 2 and first["num_turns"] == 2
    assert [t["response"] for t in first["turns"]] == ["a", "b"]
    assert first["advantage"] == pytest.approx(verl_grpo([1.0, 0.0, 1.0], True)[0])  # recomputed: verl's dump has none


def test_our_agent_loops_turns_keep_their_model_and_environment_times_through_verls_dump(tmp_path):
    """verl's default trainer dumps no reward values: the record (with each turn's times) reaches
    the dump because our trainer class adds them."""
    verl_run(tmp_path)
    for record in stored(tmp_path):
        assert [(t["generation_seconds"], t["env_seconds"]) for t in record["turns"]] == list(TURN_SECONDS)
        assert record["generation_seconds"] == pytest.approx(sum(model for model, _ in TURN_SECONDS))
        assert record["env_seconds"] == pytest.approx(sum(env for _, env in TURN_SECONDS))


def test_verls_single_turn_loop_stores_the_tokens_verl_trained_on(tmp_path):
    processor = verl_run(tmp_path, single_turn=True)
    records = stored(tmp_path)
    tokenizer = build_char_tokenizer()
    assert [(r["step"], r["position"]) for r in records] == [(s, p) for s in range(1, STEPS + 1) for p in range(6)]
    first = records[0]
    # The stand-in's sample, as verl's SingleTurnAgentLoop returns it: "go0>" answered "a" and EOS.
    assert first["prompt_ids"] == tokenizer.encode("go0>", add_special_tokens=False)
    assert first["token_ids"] == tokenizer.encode("a", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert first["mask"] == [1, 1] and first["logprobs"] == [-0.5, -0.25] and len(first["token_texts"]) == 2
    assert first["prompt_length"] == 4 and first["response_length"] == 2
    assert first["turns"][0]["response"] == "a" and first["turns"][0]["generation_seconds"] == SINGLE_TURN_SECONDS
    assert first["generation_seconds"] == SINGLE_TURN_SECONDS and first["turns"][0]["env_seconds"] is None
    assert first["data_source"] == "guess" and [r["row_index"] for r in records[:6]] == [0, 0, 0, 1, 1, 1]
    assert first["reward_components"] == {"score": first["reward"], "acc": first["reward"]}
    # Grouped by verl's uid (its dump's sample keys), not by the prompt's text.
    groups = [r["group"] for r in records[:6]]
    assert len(set(groups)) == 2 and groups[0] == groups[2] != groups[3] and len(groups[0]) == 36
    # verl's own keys of the dump are as verl writes them; ours are beside them.
    row = json.loads((Path(processor.verl_config.trainer.rollout_data_dir) / "1.jsonl").read_text().splitlines()[0])
    assert {k: row[k] for k in ("input", "output", "gts", "step")} == {"input": "go0>", "output": "a", "gts": "a", "step": 1}
    assert row["uid"].startswith(groups[0] + "_0_") and row["response_ids"] == first["token_ids"]


def test_without_the_rollouts_log_probabilities_verls_single_turn_records_have_none(tmp_path):
    verl_run(tmp_path, single_turn=True, **{"actor_rollout_ref.rollout.calculate_log_probs": False})
    first = stored(tmp_path)[0]
    assert first["token_ids"] and first["mask"] == [1, 1] and first["logprobs"] == []


def verl_grpo(rewards: list[float], norm_by_std: bool) -> list[float]:
    """verl's GRPO advantages of one group, as its trainer calls the estimator."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=torch.tensor(rewards).unsqueeze(-1), response_mask=torch.ones(len(rewards), 1),
        index=np.array(["g"] * len(rewards), dtype=object), norm_adv_by_std_in_grpo=norm_by_std)
    return advantages[:, 0].tolist()


def verl_rloo(rewards: list[float]) -> list[float]:
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import compute_rloo_outcome_advantage

    advantages, _ = compute_rloo_outcome_advantage(
        token_level_rewards=torch.tensor(rewards).unsqueeze(-1), response_mask=torch.ones(len(rewards), 1),
        index=np.array(["g"] * len(rewards), dtype=object), config=AlgoConfig(adv_estimator="rloo"))
    return advantages[:, 0].tolist()


def by_group(records: list[dict]) -> dict[tuple[int, str], list[dict]]:
    groups = defaultdict(list)
    for record in records:
        groups[(record["step"], record["group"])].append(record)
    return groups


@pytest.mark.parametrize("algorithm, expected", [
    ({"algorithm.adv_estimator": "grpo"}, lambda rewards: verl_grpo(rewards, True)),
    ({"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False}, lambda rewards: verl_grpo(rewards, False)),
    ({"algorithm.adv_estimator": "rloo"}, verl_rloo),
], ids=["grpo", "dr-grpo", "rloo"])
@pytest.mark.parametrize("single_turn", [False, True], ids=["our agent loop", "verl's single-turn loop"])
def test_each_episode_has_the_advantage_verls_estimator_gives_its_group(tmp_path, algorithm, expected, single_turn):
    verl_run(tmp_path, single_turn=single_turn, **algorithm)
    groups = by_group(stored(tmp_path))
    assert len(groups) == 2 * STEPS
    for group in groups.values():
        rewards = [r["reward"] for r in group]
        assert sorted(rewards) != [rewards[0]] * 3  # the stand-in's groups are mixed: advantages are not all 0
        assert [r["advantage"] for r in group] == pytest.approx(expected(rewards), abs=1e-6)


def test_an_estimator_over_the_batchs_tokens_gets_each_episodes_mask(tmp_path):
    """REINFORCE++ with baseline whitens over every trained token of the step: our agent loop's
    masks (1 on the model's tokens, 0 on the environment's) are what it whitens over."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import compute_reinforce_plus_plus_baseline_outcome_advantage

    verl_run(tmp_path, **{"algorithm.adv_estimator": "reinforce_plus_plus_baseline"})
    step = [r for r in stored(tmp_path) if r["step"] == 1]
    mask = torch.tensor([r["mask"] for r in step], dtype=torch.float32)
    scores = torch.zeros_like(mask)
    scores[:, -1] = torch.tensor([r["reward"] for r in step])  # on the response's last token, as verl places it
    advantages, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(
        token_level_rewards=scores, response_mask=mask, index=np.array([r["group"] for r in step], dtype=object),
        config=AlgoConfig(adv_estimator="reinforce_plus_plus_baseline"))
    expected = ((advantages * mask).sum(dim=1) / mask.sum(dim=1)).tolist()
    assert [r["advantage"] for r in step] == pytest.approx(expected, abs=1e-6)
    assert len(set(round(a, 6) for a in expected)) > 1


def test_advantages_the_dump_cannot_give_are_left_empty():
    rows = [{"input": "2+3=", "output": "5", "gts": "5", "score": score, "step": 1, "acc": score} for score in (1.0, 0.0)]
    for estimator, kl_in_reward in [("gae", False), ("reinforce_plus_plus", False), ("grpo", True)]:
        algorithm = _algorithm(adv_estimator=estimator, use_kl_in_reward=kl_in_reward)
        assert [r["advantage"] for r in rollout_rows_to_records(rows, 1, "train", algorithm=algorithm)] == [None, None]
    grpo = rollout_rows_to_records(rows, 1, "train", algorithm=_algorithm(adv_estimator="grpo"))
    assert [r["advantage"] for r in grpo] == pytest.approx(verl_grpo([1.0, 0.0], True))


def test_an_estimator_that_refuses_the_dump_leaves_the_advantage_empty_and_the_episodes_stored():
    rows = [{"input": "2+3=", "output": "5", "gts": "5", "score": 1.0, "step": 1, "acc": 1.0}]
    # verl's pass@k estimator raises on a group of one episode
    records = rollout_rows_to_records(rows, 1, "train", algorithm=_algorithm(adv_estimator="grpo_passk"))
    assert [(r["step"], r["reward"], r["advantage"]) for r in records] == [(1, 1.0, None)]


def _algorithm(**values):
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(**values)


VALIDATION = {"trainer.test_freq": 2, "actor_rollout_ref.rollout.val_kwargs.n": 2}


@pytest.mark.parametrize("single_turn", [False, True], ids=["our agent loop", "verl's single-turn loop"])
def test_verls_validation_episodes_are_stored_as_val_at_the_step_they_were_scored(tmp_path, single_turn):
    test_rows = [{"prompt": "go>", "target": t} for t in "bcd"]
    verl_run(tmp_path, test_dataset=test_rows, single_turn=single_turn, **VALIDATION)
    val = stored(tmp_path, "val")
    # Before the first step, every test_freq steps and after the last: 3 rows, val_kwargs.n each.
    assert [(r["step"], r["position"]) for r in val] == [(s, p) for s in (0, 2, 3) for p in range(6)]
    assert {r["split"] for r in val} == {"val"} and all(r["advantage"] is None for r in val)
    # verl dumps its validation sorted by its (random) uids: each row's samples together, one group.
    for step in (0, 2, 3):
        rows = [r for r in val if r["step"] == step]
        assert sorted(r["row_index"] for r in rows) == [0, 0, 1, 1, 2, 2]
        assert [r["row_index"] for r in rows[::2]] == [r["row_index"] for r in rows[1::2]]
        assert [r["group"] for r in rows[::2]] == [r["group"] for r in rows[1::2]] and len({r["group"] for r in rows}) == 3
    assert all(r["reward"] == float(r["row_index"] % 2 == 0) for r in val)  # the stand-in's: 1 for even rows
    assert [r["group_position"] for r in val[:6]] == [0, 1, 0, 1, 0, 1]
    assert "reward" not in val[0]["reward_components"]  # verl's validation dump repeats the score as "reward"
    if not single_turn:
        assert val[0]["token_ids"] and val[0]["termination_reason"] == "env_done"
    assert [r["step"] for r in stored(tmp_path)] == [s for s in range(1, STEPS + 1) for _ in range(6)]


@pytest.mark.parametrize("log_probs", [True, False], ids=["with the rollout's log-probabilities", "without"])
def test_verls_single_turn_validation_episodes_keep_the_tokens_verl_generated(tmp_path, log_probs):
    """verl clears each validation batch from its TransferQueue (here two: rows 0-1 and 2) before it
    dumps them all: the tokens reach the dump because our trainer class reads them as verl samples
    each batch."""
    processor = verl_run(tmp_path, test_dataset=[{"prompt": "go>", "target": t} for t in "bcd"], single_turn=True,
                         val_batch_size=2, **VALIDATION, **{"actor_rollout_ref.rollout.calculate_log_probs": log_probs})
    val = stored(tmp_path, "val")
    tokenizer = build_char_tokenizer()
    reply = tokenizer.encode("a", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert len(val) == 18
    for record in val:  # the stand-in's sample of row i: "go<i>>" answered "a" and EOS
        assert record["prompt_ids"] == tokenizer.encode(f"go{record['row_index']}>", add_special_tokens=False)
        assert record["token_ids"] == reply and record["mask"] == [1, 1] and record["response_length"] == 2
        assert record["logprobs"] == ([-0.5, -0.25] if log_probs else [])
        assert len(record["token_texts"]) == 2 and record["data_source"] == "guess"
        assert record["generation_seconds"] == SINGLE_TURN_SECONDS
        assert record["reward_components"] == {"score": record["reward"], "acc": record["reward"]}
    # verl's own keys of its validation dump are as verl writes them; ours are beside them.
    row = json.loads((Path(processor.verl_config.trainer.validation_data_dir) / "2.jsonl").read_text().splitlines()[0])
    assert {k: row[k] for k in ("output", "gts", "step")} == {"output": "a", "gts": "bcd"[row["row_index"]], "step": 2}
    assert row["reward"] == row["score"] == row["acc"] and row["response_ids"] == reply
    assert row["input"] == f"go{row['row_index']}>" and row["uid"].endswith("_0_0")


def test_the_share_the_config_keeps_is_what_is_stored(tmp_path):
    verl_run(tmp_path, **{"trainer.log_episodes_per_step": 2})
    assert [(r["step"]) for r in stored(tmp_path)] == [1, 1, 2, 2, 3, 3]


def test_a_dump_of_verls_single_turn_loop_keeps_text_score_and_reward_values():
    rows = [{"input": "2+3=", "output": "5", "gts": "5", "score": 1.0, "step": 4, "acc": 1.0, "request_id": "r1"},
            {"input": "2+3=", "output": "6", "gts": "5", "score": 0.0, "step": 4, "acc": 0.0, "request_id": "r2"},
            {"input": "1+1=", "output": "2", "gts": "2", "score": 1.0, "step": 4, "acc": 1.0, "request_id": "r3"}]
    records = rollout_rows_to_records(rows, 4, "train")
    assert [(r["step"], r["position"], r["group_position"]) for r in records] == [(4, 0, 0), (4, 1, 1), (4, 2, 0)]
    assert records[0]["group"] == records[1]["group"] != records[2]["group"]
    assert records[1]["reward"] == 0.0 and records[1]["reward_components"] == {"score": 0.0, "acc": 0.0}
    assert records[0]["turns"][0]["response"] == "5" and records[0]["token_ids"] == []


def test_without_sampled_log_probabilities_our_agent_loops_record_has_none(base_verl_config):
    output, _ = run_loop(base_verl_config, AGENT_ENV, {"target": "b"}, ["a", "b"], sampling={"logprobs": False})
    record = json.loads(output.extra_fields["reward_extra_info"][EPISODE_RECORD_KEY])
    assert output.response_logprobs == [0.0] * len(output.response_ids)  # what verl is handed: aligned zeros
    assert record["token_ids"] == output.response_ids and record["logprobs"] == []  # not zeros as if sampled


def test_our_agent_loop_puts_the_whole_record_in_reward_extra_info(base_verl_config):
    output, _ = run_loop(base_verl_config, AGENT_ENV, {"target": "b", "data_source": "guess"}, ["a", "b"])
    record = json.loads(output.extra_fields["reward_extra_info"][EPISODE_RECORD_KEY])
    assert record["token_ids"] == output.response_ids and record["mask"] == output.response_mask == [1, 1, 0, 0, 0, 1, 1]
    assert record["logprobs"] == output.response_logprobs and record["prompt_ids"] == output.prompt_ids
    assert len(record["token_texts"]) == len(record["token_ids"]) and record["token_texts"][0] == "a"
    assert record["reward"] == 1.0 and record["row_index"] == 3 and record["num_turns"] == 2
    # Each turn's times, as the turn loop measured them: the model's call and the environment's step.
    assert all(t["generation_seconds"] > 0 and t["env_seconds"] > 0 for t in record["turns"])
    assert record["generation_seconds"] > 0 and record["episode_seconds"] >= record["generation_seconds"]
