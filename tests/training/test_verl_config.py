"""verl config composition against the installed verl: our keys land on verl's paths, verl-native
keys pass through, bad keys name the verl path meant, and verl's own checks run.

The GPU count is faked (``cuda_device_count``) so that the whole ``check_config`` runs on CPU;
one test keeps it at 0 to see the no-GPU error.
"""

import importlib
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from training.backends.verl import backend as verl_backend
from training.backends.verl.backend import (
    AGENT_LOOP_MODULE,
    AGENT_LOOP_NAME,
    NO_GPU_MESSAGE,
    VerlProcessor,
    compose_verl_config,
    split_overrides,
)
from training import CumulativeWorkflow, SimpleWorkflow, SingleTurnEnvironment, SingleTurnWorkflow, Workflow, math_reward_fn
from training.config import Config
from training.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
for module in ("copy_task", "countdown_workflow", "frozenlake"):  # they register their datasets
    importlib.import_module(f"examples.{module}")


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(verl_backend, "cuda_device_count", lambda: 1)


def checked_processor(tmp_path, spec: dict, config=None) -> VerlProcessor:
    processor = VerlProcessor(str(tmp_path))
    processor.check_agent(spec.get("agent"))
    processor.check_dataset(spec["train_dataset"], spec.get("val_dataset"))
    processor.check_reward(spec.get("reward_func"))
    processor.check_config(spec.get("config") if config is None else config)
    return processor


def test_our_keys_land_on_verl_paths(tmp_path):
    config = Config.build(
        {
            "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
            "data.train_batch_size": 16,
            "data.max_prompt_length": 300,
            "data.max_response_length": 700,
            "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.actor.optim.lr": 3e-6,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
            "actor_rollout_ref.actor.use_kl_loss": True,
            "actor_rollout_ref.actor.kl_loss_coef": 0.01,
            "actor_rollout_ref.model.enable_gradient_checkpointing": False,
            "algorithm.adv_estimator": "rloo",
            "trainer.nnodes": 2,
            "trainer.n_gpus_per_node": 4,
            "trainer.ray_address": "auto",
        }
    )
    verl = compose_verl_config(config, run_path=tmp_path, train_files="train.parquet", val_files="test.parquet")

    assert verl.data.train_batch_size == 16
    assert verl.actor_rollout_ref.rollout.prompt_length == 300  # verl's own interpolation from data.*
    assert verl.actor_rollout_ref.rollout.response_length == 700
    assert verl.actor_rollout_ref.rollout.n == 4
    assert verl.actor_rollout_ref.actor.optim.lr == 3e-6
    assert verl.actor_rollout_ref.actor.ppo_mini_batch_size == 8
    assert verl.actor_rollout_ref.actor.use_kl_loss is True and verl.actor_rollout_ref.actor.kl_loss_coef == 0.01
    assert verl.algorithm.adv_estimator == "rloo"
    assert verl.actor_rollout_ref.model.enable_gradient_checkpointing is False
    assert (verl.trainer.nnodes, verl.trainer.n_gpus_per_node) == (2, 4)
    assert verl.trainer.default_local_dir == str(tmp_path / "checkpoints")
    assert verl.ray_kwargs.ray_init.address == "auto"
    assert (verl.data.train_files, verl.data.val_files) == ("train.parquet", "test.parquet")
    assert verl.trainer.logger == ["file"]


def test_the_recipe_keys_reach_verl_under_its_own_names(tmp_path):
    config = Config.build({
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct", "data.max_response_length": 700,
        "actor_rollout_ref.actor.clip_ratio_high": 0.28, "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo", "reward_model.overlong_buffer.enable": True,
        "reward_model.overlong_buffer.len": 100, "reward_model.overlong_buffer.penalty_factor": 0.5,
        "algorithm.adv_estimator": "reinforce_plus_plus_baseline",
    })
    verl = compose_verl_config(config, run_path=tmp_path, train_files="train.parquet", val_files="test.parquet")
    actor = verl.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert (actor.loss_agg_mode, actor.policy_loss.loss_mode) == ("seq-mean-token-mean", "gspo")
    assert verl.algorithm.adv_estimator == "reinforce_plus_plus_baseline"
    assert verl.reward.reward_manager.name == "dapo"  # verl's DAPO reward manager applies the overlong buffer
    assert verl.reward.reward_kwargs.max_resp_len == 700
    assert dict(verl.reward.reward_kwargs.overlong_buffer_cfg) == {"enable": True, "len": 100, "penalty_factor": 0.5, "log": False}


@pytest.mark.parametrize("example", ["copy", "countdown", "frozenlake"])
def test_example_configs_compose_and_validate(tmp_path, one_gpu, example):
    spec = yaml.safe_load((EXAMPLES / "configs" / f"{example}.yaml").read_text())
    processor = checked_processor(tmp_path, spec)

    written = OmegaConf.load(tmp_path / "verl_config.yaml")
    ours = spec["config"]
    assert written.data.train_batch_size == ours["data.train_batch_size"]
    assert written.actor_rollout_ref.rollout.n == ours["actor_rollout_ref.rollout.n"]
    assert written.data.max_response_length == ours["data.max_response_length"]
    assert written.actor_rollout_ref.model.path == str(tmp_path.resolve() / "tiny_model")
    assert (tmp_path / "tiny_model" / "config.json").is_file()
    assert Path(written.data.train_files).is_file()
    multi_turn = processor.agent_spec.kind != "single_turn"
    assert written.actor_rollout_ref.rollout.agent.default_agent_loop == (AGENT_LOOP_NAME if multi_turn else "single_turn_agent")
    if multi_turn:
        assert written.actor_rollout_ref.model.external_lib == AGENT_LOOP_MODULE
        assert written.agent_trainer.payload
    else:
        assert written.reward.custom_reward_function.reward_kwargs.reward == spec["reward_func"]
    assert (tmp_path / "config.yaml").is_file()


def test_verl_native_keys_pass_through(tmp_path, one_gpu):
    spec = yaml.safe_load((EXAMPLES / "configs" / "copy.yaml").read_text())
    overrides = [
        *(f"{key}={value}" for key, value in spec["config"].items()),
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager=true",
    ]
    checked_processor(tmp_path, spec, config=overrides)

    written = OmegaConf.load(tmp_path / "verl_config.yaml")
    assert written.actor_rollout_ref.actor.fsdp_config.param_offload is True
    assert written.actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager is True
    assert written.actor_rollout_ref.actor.optim.lr == 0.001  # ours still applied


def test_bad_key_names_the_verl_path():
    with pytest.raises(ConfigError) as error:
        split_overrides(["actor_rollout_ref.actor.fsdp_config.param_offlaod=true"])
    assert error.value.key == "actor_rollout_ref.actor.fsdp_config.param_offlaod"
    assert "Did you mean 'actor_rollout_ref.actor.fsdp_config.param_offload'" in str(error.value)


@pytest.mark.parametrize("groups", [(), (("model_engine", "dp"),), (("model_engine", "megatron"),)])
def test_verls_defaults_composed_from_its_folder_are_those_its_module_composes(groups):
    from hydra import compose, initialize_config_module

    from training.backends.verl.names import _verl_defaults_yaml

    with initialize_config_module("verl.trainer.config", version_base=None):
        through_module = OmegaConf.to_yaml(compose("ppo_trainer", overrides=[f"{k}={v}" for k, v in groups]))
    assert _verl_defaults_yaml(groups) == through_module


def test_telling_an_unknown_key_from_verls_imports_neither_verl_nor_torch():
    """A typo in the CLI or the run form is answered in about a second, not after verl's imports."""
    import subprocess
    import sys

    code = ("import sys\nfrom training.config import Config\n"
            "try:\n    Config.build({'data.train_batchsize': 2})\nexcept ValueError as exc:\n    print(exc)\n"
            "print(sorted(name for name in ('verl', 'torch', 'ray', 'tensordict') if name in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2]).stdout.splitlines()
    assert out[0] == "data.train_batchsize: unknown config key. Did you mean 'data.train_batch_size'?"
    assert out[-1] == "[]"


def test_verl_rejects_an_inconsistent_config():
    config = Config.build({"actor_rollout_ref.model.path": "some/model"})
    # Fixed-size micro-batches without a size: verl's validate_config refuses and names the key.
    with pytest.raises(ConfigError, match="ppo_micro_batch_size"):
        compose_verl_config(config, {"actor_rollout_ref.actor.use_dynamic_bsz": False})


def test_no_gpu_fails_early_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setattr(verl_backend, "cuda_device_count", lambda: 0)
    spec = yaml.safe_load((EXAMPLES / "configs" / "copy.yaml").read_text())
    with pytest.raises(ValueError, match="the verl backend needs CUDA GPUs; this worker has none; choose trl"):
        checked_processor(tmp_path, spec)
    assert NO_GPU_MESSAGE.startswith("the verl backend needs CUDA GPUs")
    assert not (tmp_path / "verl_config.yaml").exists()


def test_more_gpus_than_this_machine_needs_a_ray_cluster(tmp_path, one_gpu):
    spec = yaml.safe_load((EXAMPLES / "configs" / "copy.yaml").read_text())
    with pytest.raises(ConfigError, match="trainer.ray_address"):
        checked_processor(tmp_path, spec, config={**spec["config"], "trainer.n_gpus_per_node": 8})


class JudgedWorkflow(Workflow):
    """Declares what rLLM's solver-judge returns: two solvers and a judge per episode."""

    trajectories_per_episode = 3

    async def run(self, task, uid, **kwargs):
        raise AssertionError("never run: the verl backend refuses the class before any episode")


class UndeclaredWorkflow(Workflow):
    async def run(self, task, uid, **kwargs):
        raise AssertionError("not run in this test")


WORKFLOW_ROWS = [{"question": "1+1=", "ground_truth": "2"}]


def test_a_workflow_declaring_several_trajectories_is_refused_when_the_trainer_is_built(tmp_path, one_gpu):
    from training import AgentTrainer

    with pytest.raises(ValueError) as refused:
        AgentTrainer(workflow_class=JudgedWorkflow, train_dataset=WORKFLOW_ROWS, backend="verl",
                     run_path=str(tmp_path), config={"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 1})
    message = str(refused.value)
    assert f"workflow {__name__}.JudgedWorkflow returns 3 trajectories per episode" in message
    assert "Use backend=trl, tinker or fireworks" in message
    assert not (tmp_path / "verl_config.yaml").exists()


@pytest.mark.parametrize("workflow", [SingleTurnWorkflow, CumulativeWorkflow, SimpleWorkflow, UndeclaredWorkflow])
def test_one_trajectory_and_undeclared_workflows_pass_construction(tmp_path, one_gpu, workflow):
    """One trajectory per episode, or undeclared: built (the undeclared one is checked at its first
    episode of several sequences, on the GPUs, which this machine has not)."""
    args = {"reward_function": math_reward_fn} if workflow is SimpleWorkflow else {}
    if workflow in (SingleTurnWorkflow, CumulativeWorkflow):
        args = {"agent_cls": "tests.fixtures.rllm_math_agent.MathAgent", "env_cls": SingleTurnEnvironment,
                "env_args": {"reward_fn": math_reward_fn}}
    processor = checked_processor(tmp_path, {
        "agent": {"workflow_class": workflow, "workflow_args": args}, "train_dataset": WORKFLOW_ROWS,
        "config": {"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 1},
    })
    assert (tmp_path / "verl_config.yaml").exists() and processor.agent_spec.workflow_class is workflow
