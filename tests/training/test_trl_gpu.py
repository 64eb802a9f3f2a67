"""The trl backend on a CUDA GPU: the same learning checks as the CPU tests, with the model on the GPU.

Skipped without CUDA (CI has none); run on a machine with a GPU.
"""

from pathlib import Path

import pytest
import torch
from test_trl_smoke import starts_with_a, tiny_config, weights  # the CPU test's reward and weight reader

from training import AgentTrainer

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def gpu_config(steps: int, **extra) -> dict:
    return tiny_config(steps, **{"trainer.device": "cuda", "trainer.logger": [], **extra})


def test_single_turn_trains_on_the_gpu_weights_change_and_reward_rises(tmp_path, sink):
    torch.cuda.reset_peak_memory_stats()
    result = AgentTrainer(
        train_dataset=[{"prompt": p} for p in ("x=", "y=", "z=", "w=")],
        reward_func=starts_with_a, backend="trl", run_path=str(tmp_path), config=gpu_config(20), sinks=[sink],
    ).train()

    assert result.steps == 20 and not result.stopped
    assert torch.cuda.max_memory_allocated() > 0, "nothing was put on the GPU"
    before, after = weights(tmp_path / "base_model"), weights(Path(result.checkpoint))
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert len(changed) > len(before) // 2, f"only {changed} changed"
    rewards = [m["reward"] for m in sink.metrics]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards
    assert any(key.startswith("system/gpu_memory_gb/") for m in sink.metrics for key in m), "no GPU metrics logged"


def test_multi_turn_frozenlake_runs_its_turns_on_the_gpu(tmp_path, sink):
    from examples.frozenlake import FrozenLakeAgent, FrozenLakeEnv

    result = AgentTrainer(
        agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv, train_dataset="frozenlake:train", backend="trl",
        run_path=str(tmp_path), sinks=[sink],
        config=gpu_config(2, **{"data.max_response_length": 64, "rllm.agent.max_steps": 3,
                                "rllm.agent.max_tokens_per_turn": 4}),
    ).train()
    assert result.steps == 2
    assert [m["step"] for m in sink.metrics] == [1, 2]
    assert all(m["turns"] >= 1 for m in sink.metrics), [m["turns"] for m in sink.metrics]
    assert sink.episodes, "no episodes reached the sink"


def test_lora_trains_only_the_adapter_on_the_gpu(tmp_path, sink):
    from peft import PeftModel
    from safetensors.torch import load_file
    from test_trl_lora import chance_of_a
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def base_model(path):
        return AutoModelForCausalLM.from_pretrained(path / "base_model")

    result = AgentTrainer(
        train_dataset=[{"prompt": p} for p in ("x=", "y=", "z=", "w=")],
        reward_func=starts_with_a, backend="trl", run_path=str(tmp_path), sinks=[sink],
        config=gpu_config(20, **{"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.lora_alpha": 16,
                                 "actor_rollout_ref.actor.optim.lr": 1e-1}),  # test_trl_lora.py's settings
    ).train()

    assert result.steps == 20 and not result.stopped
    final = Path(result.checkpoint)
    assert (final / "adapter_model.safetensors").exists() and not (final / "model.safetensors").exists()
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and all("lora_" in name for name in adapter), sorted(adapter)[:5]
    assert any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name), "lora_B never moved off zero"
    # The base model on disk is the one training started from: only the adapter changed.
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    merged = PeftModel.from_pretrained(base, final).merge_and_unload()
    assert any(not torch.equal(before[k], v) for k, v in merged.state_dict().items()), "merging changed nothing"
    # The reward paid for a leading "a" (rare at first: LoRA's reward curve over 20 steps is too noisy to test):
    # the adapter made it likelier, as on the CPU.
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert chance_of_a(merged, tokenizer) > chance_of_a(base_model(tmp_path), tokenizer) * 2
