"""The verl backend keeps every episode: what verl's rollout dump carries reaches the episode store.

verl's trainer cannot run here (CUDA GPUs, vLLM): verl's job is ``standins.verl_trainer``, a
stand-in of its trainer loop that dumps each step's rollouts with verl's own writer
(``RayPPOTrainer._write_generations``), each sample's ``reward_extra_info`` made by our agent
loop's own functions. Our agent loop itself runs in ``test_verl_agent_loop`` against a scripted
server; here the driver side: the metrics bridge reading the dump into records, the share kept,
and the run folder's Parquet files."""

from __future__ import annotations

import json

import pytest

from standins.verl_trainer import StandInVerlJob
from test_verl_agent_loop import AGENT_ENV, EchoAgent, GuessEnv, base_verl_config, run_loop  # noqa: F401 - a fixture
from training import AgentTrainer
from training.backends.verl import backend as verl_backend
from training.backends.verl.backend import EPISODE_RECORD_KEY, rollout_rows_to_records
from training.rollouts.tiny import build_char_tokenizer
from training.tracking.episodes import read_records

STEPS = 3


@pytest.fixture(autouse=True)
def one_gpu(monkeypatch):
    monkeypatch.setattr(verl_backend, "cuda_device_count", lambda: 1)  # check_config composes for one GPU


def verl_run(tmp_path, **config):
    trainer = AgentTrainer(
        backend="verl", agent_class=EchoAgent, env_class=GuessEnv,
        train_dataset=[{"prompt": "go>", "target": "b"}, {"prompt": "go>", "target": "c"}],
        run_path=str(tmp_path), config={
            "actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 3,
            "trainer.total_training_steps": STEPS, "trainer.save_freq": -1, "trainer.logger": [], **config},
    )
    processor = trainer.train_processor
    job = StandInVerlJob(processor)
    processor.train_with(None, job.launch, job.end_job)
    return processor


def stored(tmp_path) -> list[dict]:
    records = []
    for path in sorted((tmp_path / "episodes" / "train").glob("step-*.parquet")):
        with open(path, "rb") as handle:
            records.extend(read_records(handle))
    return records


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
    assert first["advantage"] is None  # verl's dump carries no advantage


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


def test_our_agent_loop_puts_the_whole_record_in_reward_extra_info(base_verl_config):
    output, _ = run_loop(base_verl_config, AGENT_ENV, {"target": "b", "data_source": "guess"}, ["a", "b"])
    record = json.loads(output.extra_fields["reward_extra_info"][EPISODE_RECORD_KEY])
    assert record["token_ids"] == output.response_ids and record["mask"] == output.response_mask == [1, 1, 0, 0, 0, 1, 1]
    assert record["logprobs"] == output.response_logprobs and record["prompt_ids"] == output.prompt_ids
    assert len(record["token_texts"]) == len(record["token_ids"]) and record["token_texts"][0] == "a"
    assert record["reward"] == 1.0 and record["row_index"] == 3 and record["num_turns"] == 2
