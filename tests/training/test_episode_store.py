"""The episode store in the library: every episode of every step (and validation) kept whole in the
run folder as Parquet per step, or handed to a sink that keeps them itself."""

import json
from pathlib import Path

import pandas as pd
import pytest

from training import AgentTrainer
from training.rollouts.tiny import build_char_tokenizer
from training.tracking.episodes import keep_for_store, read_records, token_pieces

pytestmark = pytest.mark.slow  # trains the tiny model


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0


def tiny_config(steps: int, **extra) -> dict:
    return {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
        "data.max_response_length": 3, "trainer.total_training_steps": steps, "trainer.logger": ["jsonl"], **extra,
    }


class StoringSink:
    def __init__(self):
        self.stored: list[tuple[int, list[dict]]] = []

    def log_metrics(self, step, metrics):
        pass

    def log_episodes(self, step, episodes):
        pass

    def store_episodes(self, step, records):
        self.stored.append((step, records))

    def close(self):
        pass


PROMPTS = [{"prompt": p, "data_source": "letters"} for p in ("x=", "y=", "z=", "w=")]


def test_every_episode_of_every_step_lands_in_the_run_folder_as_parquet(tmp_path):
    trainer = AgentTrainer(train_dataset=PROMPTS, val_dataset=PROMPTS[:2], reward_func=starts_with_a, backend="trl",
                           run_path=str(tmp_path), config=tiny_config(2))
    trainer.train()
    train_files = sorted((tmp_path / "episodes" / "train").glob("step-*.parquet"))
    assert [f.name[:13] for f in train_files] == ["step-00000001", "step-00000002"]
    frame = pd.concat([pd.read_parquet(f) for f in train_files])
    assert len(frame) == 8 and set(frame["step"]) == {1, 2}  # 2 prompts x 2 episodes per step, 2 steps
    assert set(frame["data_source"]) == {"letters"} and frame["row_index"].notna().all()
    assert frame.groupby(["step", "group"]).size().tolist() == [2, 2, 2, 2]
    for _, row in frame.iterrows():
        assert len(row["token_ids"]) == len(row["mask"]) and len(row["token_ids"]) >= 1 and len(row["prompt_ids"]) == 2
        assert len(row["token_texts"]) == len(row["token_ids"])  # each token decoded alone, for a reader
        assert "".join(row["token_texts"]).startswith(json.loads(row["turns"])[0]["response"])
        assert row["reward"] == starts_with_a(None, "a" if row["turns"].count('"response": "a') else "")
        assert row["termination_reason"] and row["advantage"] is not None
    first = read_records(open(train_files[0], "rb"), [1])[0]
    assert first["turns"][0]["messages"][0]["content"] in {"x=", "y=", "z=", "w="}
    assert first["reward_components"]["score"] == first["reward"]
    val_files = sorted((tmp_path / "episodes" / "val").glob("step-*.parquet"))
    assert val_files and len(pd.read_parquet(val_files[0])) == 2  # validation before the first step


def test_a_sink_that_keeps_episodes_replaces_the_run_folder_and_the_fraction_is_honoured(tmp_path):
    sink = StoringSink()
    trainer = AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend="trl", run_path=str(tmp_path),
                           config=tiny_config(2, **{"actor_rollout_ref.rollout.n": 4, "trainer.log_episodes_fraction": 0.5}),
                           sinks=[sink])
    trainer.train()
    assert not (tmp_path / "episodes").exists()
    assert [step for step, _ in sink.stored] == [1, 2]
    assert all(len(records) == 4 for _, records in sink.stored)  # half of 2 prompts x 4 episodes
    positions = [r["position"] for r in sink.stored[0][1]]
    assert positions == sorted(positions) and len(set(positions)) == 4


def test_store_off_keeps_nothing(tmp_path):
    sink = StoringSink()
    AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend="trl", run_path=str(tmp_path / "alone"),
                 config=tiny_config(1, **{"trainer.log_episodes": False})).train()
    AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend="trl", run_path=str(tmp_path / "with-sink"),
                 config=tiny_config(1, **{"trainer.log_episodes": False}), sinks=[sink]).train()
    assert not (tmp_path / "alone" / "episodes").exists() and sink.stored == []


@pytest.mark.parametrize(("fraction", "per_step", "kept"), [(1.0, 0, 10), (0.25, 0, 3), (1.0, 4, 4), (0.5, 2, 2), (0.01, 0, 1)])
def test_keep_for_store_takes_a_seeded_share_in_order(fraction, per_step, kept):
    records = [{"position": i} for i in range(10)]
    chosen = keep_for_store(records, fraction, per_step, seed=3)
    assert len(chosen) == kept and chosen == sorted(chosen, key=lambda r: r["position"])
    assert chosen == keep_for_store(records, fraction, per_step, seed=3)


def test_a_multi_turn_run_keeps_each_turn_its_timings_and_the_environment_tokens_masked(tmp_path):
    import examples  # noqa: F401  (registers the frozenlake dataset)

    config = {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
        "data.max_response_length": 48, "rllm.agent.max_steps": 4, "rllm.agent.max_tokens_per_turn": 1,
        "trainer.total_training_steps": 2, "trainer.logger": [],
    }
    sink = StoringSink()
    AgentTrainer(agent_class="examples.frozenlake.FrozenLakeAgent", env_class="examples.frozenlake.FrozenLakeEnv",
                 train_dataset="frozenlake:train", backend="trl", run_path=str(tmp_path), config=config, sinks=[sink]).train()
    records = [r for _, step_records in sink.stored for r in step_records]
    assert len(records) == 8 and {r["split"] for r in records} == {"train"}
    for record in records:
        assert len(record["token_ids"]) == len(record["mask"]) == len(record["logprobs"])
        assert record["num_turns"] == len(record["turns"]) >= 1
        assert record["response_length"] == sum(record["mask"]) >= 1
        timed = [turn for turn in record["turns"] if turn["generation_seconds"] is not None]
        assert len(timed) == sum(record["mask"])  # each model turn (one token each) timed
        assert all(turn["generation_seconds"] >= 0 and turn["env_seconds"] >= 0 for turn in timed)
        assert record["advantage"] is not None and record["row_index"] is not None
    assert any(0 in r["mask"] for r in records if r["num_turns"] > 1)  # the environment's replies are not trained on
    # GRPO: the advantages of a group sum to about zero.
    groups: dict[tuple, list[float]] = {}
    for record in records:
        groups.setdefault((record["step"], record["group"]), []).append(record["advantage"])
    assert all(len(values) == 2 and abs(sum(values)) < 1e-4 for values in groups.values())


def test_token_pieces_are_each_token_decoded_alone():
    tokenizer = build_char_tokenizer()
    ids = tokenizer.encode("ab= c\n", add_special_tokens=False)
    assert token_pieces(tokenizer, ids) == ["a", "b", "=", " ", "c", "\n"]
    assert token_pieces(tokenizer, []) == []


def test_a_token_is_decoded_once_per_tokenizer(monkeypatch):
    tokenizer = build_char_tokenizer()
    asked: list[list[list[int]]] = []
    decode = type(tokenizer).batch_decode

    def counting(self, sequences, *args, **kwargs):
        asked.append(sequences)
        return decode(self, sequences, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "batch_decode", counting)
    first = tokenizer.encode("abba", add_special_tokens=False)
    second = tokenizer.encode("cab", add_special_tokens=False)
    assert token_pieces(tokenizer, first) == ["a", "b", "b", "a"]
    assert token_pieces(tokenizer, second) == ["c", "a", "b"]
    assert token_pieces(tokenizer, first) == ["a", "b", "b", "a"]
    assert sorted(len(sequences) for sequences in asked) == [1, 2]  # a and b, then c alone; then nothing
    assert token_pieces(build_char_tokenizer(), second) == ["c", "a", "b"]  # another tokenizer decodes its own
