"""LoRA on the trl backend (actor_rollout_ref.model.lora_rank > 0): peft adapters train, are saved with
each checkpoint and as the final model, load onto the base model, resume; the multi-turn rollout
generates through the adapter; backends that cannot honour a LoRA key refuse it by name."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import training.rollouts.generation
from training import AgentTrainer
from training.backends.swift.backend import swift_lora_args
from training.backends.verl.backend import _our_keys_in_verl
from training.config import Config, ConfigError
from training.rollouts.models import is_adapter, load_policy, load_trained
from training.rollouts.tiny import save_tiny_model

PROMPTS = [{"prompt": p} for p in ("x=", "y=", "z=", "w=")]
LORA = {"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.lora_alpha": 16}


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0


def lora_config(steps: int, **extra) -> dict:
    return {
        "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.actor.optim.lr": 1e-1,
        "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4, "data.max_response_length": 2,
        "trainer.total_training_steps": steps, "trainer.save_freq": 10, "trainer.logger": ["jsonl"], **LORA, **extra,
    }


def chance_of_a(model, tokenizer, prompt: str = "x=") -> float:
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0, -1], -1)
    return probs[tokenizer.convert_tokens_to_ids("a")].item()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora")
    result = AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend="trl", run_path=str(path),
                          config=lora_config(20)).train()
    assert result.steps == 20 and result.checkpoint == str(path / "final_model")
    return path


@pytest.mark.slow
def test_the_final_model_is_an_adapter_that_peft_loads_and_merges(lora_run):
    final = lora_run / "final_model"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in final.iterdir()}
    assert not (final / "config.json").exists() and not (final / "model.safetensors").exists()  # no full copy
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16
    assert Path(adapter["base_model_name_or_path"]) == (lora_run / "base_model").resolve()

    base = AutoModelForCausalLM.from_pretrained(lora_run / "base_model")
    tokenizer = AutoTokenizer.from_pretrained(final)
    before = chance_of_a(base, tokenizer)
    merged = PeftModel.from_pretrained(base, final).merge_and_unload()
    assert not isinstance(merged, PeftModel)
    # The reward paid for a leading "a": the adapter made it likelier.
    assert chance_of_a(merged, tokenizer) > before * 2, (chance_of_a(merged, tokenizer), before)
    # The platform's loader (inference, playground, run:<id>) gives the same merged weights.
    loaded, _ = load_trained(final)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in merged.state_dict().items())


@pytest.mark.slow
def test_evaluate_after_training_uses_the_adapter(lora_run, caplog):
    caplog.set_level("INFO")
    trainer = AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend="trl", run_path=str(lora_run),
                           config=lora_config(20))
    result = trainer.evaluate(PROMPTS)
    assert f"inference with the trained weights in {lora_run / 'final_model'}" in caplog.text
    assert "test/default/reward" in result.metrics


@pytest.mark.slow
def test_only_the_adapter_trained(lora_run, tmp_path):
    # The base model on disk is the one built from the seed, byte for byte.
    save_tiny_model(tmp_path / "fresh", seed=42)
    assert (lora_run / "base_model" / "model.safetensors").read_bytes() == (tmp_path / "fresh" / "model.safetensors").read_bytes()
    for step in (10, 20):
        checkpoint = lora_run / "checkpoints" / f"checkpoint-{step}"
        tensors = load_file(checkpoint / "adapter_model.safetensors")
        assert tensors and all(".lora_A." in name or ".lora_B." in name for name in tensors), sorted(tensors)
        assert any(t.abs().max() > 0 for name, t in tensors.items() if ".lora_B." in name)  # B starts at zero
        # The optimizer held the adapter's tensors and nothing else.
        optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=False)
        assert len(optimizer["state"]) == len(tensors)
    first = load_file(lora_run / "checkpoints" / "checkpoint-10" / "adapter_model.safetensors")
    last = load_file(lora_run / "checkpoints" / "checkpoint-20" / "adapter_model.safetensors")
    assert any(not torch.equal(first[name], last[name]) for name in first)


@pytest.mark.slow
def test_a_lora_run_resumes_from_its_adapter_checkpoint(lora_run, tmp_path, sink):
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    before = load_file(run / "final_model" / "adapter_model.safetensors")
    result = AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend="trl", run_path=str(run),
                          config=lora_config(22), sinks=[sink]).train()
    assert result.steps == 22
    assert [m["step"] for m in sink.metrics] == [21, 22]  # steps 1-20 came from the checkpoint
    after = load_file(run / "final_model" / "adapter_model.safetensors")
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_a_run_can_start_from_a_lora_runs_model(lora_run, tmp_path):
    """run:<id> of a LoRA run: its base with the adapter merged; a new adapter names that adapter as its base."""
    config = Config.build({"actor_rollout_ref.model.path": str(lora_run / "final_model")})
    model, tokenizer, path = load_policy(config, tmp_path)
    merged, _ = load_trained(lora_run / "final_model")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in merged.state_dict().items())
    assert model.config._name_or_path == str((lora_run / "final_model").resolve())


@pytest.mark.slow
def test_the_multi_turn_rollout_generates_through_the_adapter(tmp_path, sink, monkeypatch):
    import examples  # noqa: F401

    generated_with = []

    class RecordingGenerator(training.rollouts.generation.HFBatchGenerator):
        def __init__(self, model, *args, **kwargs):
            generated_with.append(model)
            super().__init__(model, *args, **kwargs)

    monkeypatch.setattr(training.rollouts.generation, "HFBatchGenerator", RecordingGenerator)
    result = AgentTrainer(
        workflow_class="examples.countdown_workflow.CountdownWorkflow", workflow_args={"attempts": 2},
        train_dataset="countdown:train", backend="trl", run_path=str(tmp_path), sinks=[sink],
        config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                "data.max_response_length": 32, "rllm.agent.max_tokens_per_turn": 6, "trainer.total_training_steps": 2,
                "trainer.logger": [], **LORA},
    ).train()
    assert result.steps == 2 and is_adapter(tmp_path / "final_model")
    assert len(generated_with) == 2 and all(isinstance(model, PeftModel) for model in generated_with)


@pytest.mark.slow
def test_verl_style_lora_overrides_as_rllm_examples_pass_them(tmp_path):
    overrides = [
        "actor_rollout_ref.model.path=tiny-char", "actor_rollout_ref.model.lora_rank=32",
        "actor_rollout_ref.model.lora_alpha=32", "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
        "actor_rollout_ref.rollout.n=2", "data.train_batch_size=2", "data.max_response_length=2",
        "trainer.total_training_steps=1", "trainer.logger=[]",
    ]
    AgentTrainer(train_dataset=PROMPTS[:2], reward_func=starts_with_a, backend="trl", run_path=str(tmp_path), config=overrides).train()
    adapter = json.loads((tmp_path / "final_model" / "adapter_config.json").read_text())
    assert adapter["r"] == 32 and adapter["lora_alpha"] == 32 and set(adapter["target_modules"]) == {"q_proj", "v_proj"}
    assert all(".q_proj." in n or ".v_proj." in n for n in load_file(tmp_path / "final_model" / "adapter_model.safetensors"))


# -- the keys on the other backends ------------------------------------------------------------

def test_the_lora_keys_take_verls_defaults_and_are_checked():
    model = Config.build({}).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules, model.exclude_modules) == (0, 16, "all-linear", None)
    listed = Config.build(["actor_rollout_ref.model.target_modules=[q_proj,k_proj]"]).actor_rollout_ref.model
    assert listed.target_modules == ["q_proj", "k_proj"]
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.lora_alpha: must be more than 0"):
        Config.build({"actor_rollout_ref.model.lora_alpha": 0})
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.target_modules: names no layer"):
        Config.build({"actor_rollout_ref.model.target_modules": []})


@pytest.mark.parametrize("backend", ["tinker", "fireworks"])
@pytest.mark.parametrize("key, value", [("lora_alpha", 64), ("target_modules", ["q_proj"]), ("exclude_modules", "lm_head")])
def test_the_services_refuse_the_lora_keys_they_cannot_honour_by_name(monkeypatch, tmp_path, backend, key, value):
    monkeypatch.setenv(f"{backend.upper()}_API_KEY", "not-used")  # refused before any call to the service
    with pytest.raises(ConfigError, match=rf"actor_rollout_ref\.model\.{key}: the {backend} service sets the LoRA adapter's other settings"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend=backend, run_path=str(tmp_path),
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 4,
                             f"actor_rollout_ref.model.{key}": value})


def test_swift_maps_rank_alpha_and_targets_and_refuses_exclude_modules(tmp_path):
    config = Config.build({**LORA, "actor_rollout_ref.model.target_modules": "all-linear"})
    assert swift_lora_args(config) == {"lora_rank": 8, "lora_alpha": 16, "target_modules": ["all-linear"]}
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.exclude_modules: ms-swift's LoRA takes no list"):
        AgentTrainer(train_dataset=PROMPTS, reward_func=starts_with_a, backend="swift", run_path=str(tmp_path),
                     config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 1, **LORA,
                             "actor_rollout_ref.model.exclude_modules": "lm_head"})


def test_verl_gets_every_lora_key(tmp_path):
    config = Config.build({**LORA, "actor_rollout_ref.model.target_modules": ["q_proj"], "actor_rollout_ref.model.exclude_modules": "k"})
    keys = _our_keys_in_verl(config, tmp_path)
    assert {k: keys[f"actor_rollout_ref.model.{k}"] for k in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules")} == {
        "lora_rank": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "exclude_modules": "k"}
