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


def test_multi_turn_agent_end_to_end(tmp_path, sink):
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv
    trainer = AgentTrainer(
        agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv, train_dataset="frozenlake:train", backend="verl",
        run_path=str(tmp_path), config=tiny_verl_config(**{"rllm.agent.max_steps": 3, "rllm.agent.max_tokens_per_turn": 1}),
        sinks=[sink],
    )
    check_run(trainer.train(), sink, tmp_path)
    assert "num_turns/mean" in sink.metrics[-1]

