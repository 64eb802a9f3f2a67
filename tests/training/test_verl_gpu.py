"""The verl backend end to end: verl's trainer on a local Ray cluster, vLLM rollouts, FSDP updates.

Needs a CUDA GPU and vLLM; skipped elsewhere (CI, CPU workers). Each run trains the tiny model
for two steps and checks that metrics reached our sinks through the bridge and that verl wrote
a checkpoint.
"""

import importlib.util

import pytest
import torch

from training import AgentTrainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM, verl's rollout engine"),
]




def tiny_verl_config(**extra) -> dict:
    return {
        "actor_rollout_ref.model.path": "tiny-char",
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.3,
        "data.train_batch_size": 4,
        "data.max_prompt_length": 32,
        "data.max_response_length": 16,
        "trainer.total_training_steps": 2,
        "trainer.save_freq": 2,
        "trainer.n_gpus_per_node": 1,
        "trainer.logger": ["jsonl"],
        **extra,
    }


def check_run(result, sink, run_path):
    assert result.steps == 2 and not result.stopped
    assert [m["step"] for m in sink.metrics] == [1, 2]
    assert all("reward" in m and "critic/score/mean" in m for m in sink.metrics)
    assert sink.closed
    assert result.checkpoint is not None and result.checkpoint.endswith("global_step_2")
    assert (run_path / "verl_config.yaml").is_file() and (run_path / "metrics.jsonl").is_file()


def test_single_turn_end_to_end(tmp_path, sink):
    trainer = AgentTrainer(
        train_dataset=[{"prompt": p, "ground_truth": "a"} for p in ("x=", "y=", "z=", "w=")],
        reward_func="exact_match", backend="verl", run_path=str(tmp_path), config=tiny_verl_config(), sinks=[sink],
    )
    check_run(trainer.train(), sink, tmp_path)
    # verl's own single-turn loop: each stored episode has the tokens verl trained on (added to
    # verl's dump by our trainer class), the rollout's log-probabilities and verl's generation time.
    records = stored_records(tmp_path, "train")
    assert sorted({r["step"] for r in records}) == [1, 2]
    for record in records:
        assert record["prompt_ids"] and record["token_ids"] and len(record["mask"]) == len(record["token_ids"])
        assert len(record["logprobs"]) == len(record["token_ids"]) and sum(record["mask"]) == record["response_length"]
        assert len(record["token_texts"]) == len(record["token_ids"]) and record["row_index"] is not None
        assert record["turns"][0]["generation_seconds"] > 0 and record["generation_seconds"] > 0


def test_single_turn_validation_episodes_keep_the_tokens_verl_generated(tmp_path, sink):
    """verl clears each validation batch before it writes its validation dump: the tokens of verl's
    own single-turn loop reach the stored val episodes because our trainer class reads them as
    verl samples each validation batch."""
    trainer = AgentTrainer(
        train_dataset=[{"prompt": p, "ground_truth": "a"} for p in ("x=", "y=", "z=", "w=")],
        test_dataset=[{"prompt": p, "ground_truth": "a"} for p in ("u=", "v=", "t=")], reward_func="exact_match",
        backend="verl", run_path=str(tmp_path), config=tiny_verl_config(**{"trainer.test_freq": 2}), sinks=[sink],
    )
    trainer.train()
    val = stored_records(tmp_path, "val")
    assert sorted({r["step"] for r in val}) == [0, 2] and {r["split"] for r in val} == {"val"}
    for step in (0, 2):
        assert sorted(r["row_index"] for r in val if r["step"] == step) == [0, 1, 2]
    for record in val:
        assert record["prompt_ids"] and record["token_ids"] and len(record["mask"]) == len(record["token_ids"])
        assert len(record["logprobs"]) == len(record["token_ids"]) and sum(record["mask"]) == record["response_length"]
        assert len(record["token_texts"]) == len(record["token_ids"]) and record["data_source"]
        assert record["generation_seconds"] > 0 and record["advantage"] is None


def test_multi_turn_agent_end_to_end(tmp_path, sink):
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv
    trainer = AgentTrainer(
        agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv, train_dataset="frozenlake:train", backend="verl",
        run_path=str(tmp_path), config=tiny_verl_config(**{"rllm.agent.max_steps": 3, "rllm.agent.max_tokens_per_turn": 1}),
        sinks=[sink],
    )
    check_run(trainer.train(), sink, tmp_path)
    assert "num_turns/mean" in sink.metrics[-1]
    # Our agent loop's record reaches verl's training dump, each turn with its model and environment times.
    records = stored_records(tmp_path, "train")
    assert records and all(r["token_ids"] and r["termination_reason"] for r in records)
    assert all(t["generation_seconds"] > 0 and t["env_seconds"] is not None for r in records for t in r["turns"])



def stored_records(run_path, split: str) -> list[dict]:
    from training.tracking.episodes import read_run_folder

    return read_run_folder(run_path, split)


def test_multi_turn_episodes_keep_verls_advantages_and_its_validation(tmp_path, sink):
    """Each stored episode's advantage, recomputed from verl's dump with verl's estimator, agrees
    with what verl trained with (its critic/advantages/max, min and mean over every trained token),
    and verl's validation generations are stored as val episodes at the steps they were scored."""
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv, make_tasks
    trainer = AgentTrainer(
        agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv, train_dataset="frozenlake:train",
        test_dataset=make_tasks(4, seed=1), backend="verl", run_path=str(tmp_path),
        config=tiny_verl_config(**{"rllm.agent.max_steps": 3, "rllm.agent.max_tokens_per_turn": 1, "trainer.test_freq": 1}),
        sinks=[sink],
    )
    trainer.train()
    train = stored_records(tmp_path, "train")
    for metrics in (m for m in sink.metrics if "critic/advantages/max" in m):
        trained = [(r["advantage"], sum(r["mask"])) for r in train if r["step"] == metrics["step"] and sum(r["mask"])]
        assert max(a for a, _ in trained) == pytest.approx(metrics["critic/advantages/max"], abs=1e-4)
        assert min(a for a, _ in trained) == pytest.approx(metrics["critic/advantages/min"], abs=1e-4)
        mean = sum(a * n for a, n in trained) / sum(n for _, n in trained)
        assert mean == pytest.approx(metrics["critic/advantages/mean"], abs=1e-4)
    val = stored_records(tmp_path, "val")
    assert sorted({r["step"] for r in val}) == [0, 1, 2] and {r["split"] for r in val} == {"val"}
    assert all(r["token_ids"] and r["group"] for r in val)
