"""verl's config keys, as the config sees them (registered with ``training.config.names``): a key of
verl's PPO trainer config is passed to verl on the verl backend; on the others it is

- not given, when it is a null that verl's users leave for their framework to fill in (AWorld's
  ``grpo_trainer.yaml``: ``data.train_files``, ``custom_reward_function.path``, ...; here the run's
  datasets and reward fill them), ``VERL_FILLED_LATER``;
- without effect, said and recorded (``Config.ignored_keys``), when it changes where or how fast verl
  trains, never what is learnt (``VERL_NO_EFFECT``), or when its section is switched off
  (``multi_turn.enable: false`` makes ``multi_turn.*`` say nothing);
- refused otherwise, with the advice to use backend=verl.

verl is imported inside functions: it is optional.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import os
from typing import Any

from training.config import flatten
from training.config.names import Elsewhere, register_foreign_keys
from training.utils import is_verl_available

# verl's sections that we do not have: what tells a verl key without verl installed.
VERL_ONLY_SECTIONS = ("critic", "reward_model", "custom_reward_function", "ray_init", "ray_kwargs")


# verl settings that change where or how fast verl trains, never what is learnt: accepted on
# every backend (a launch script runs unchanged) and left out where verl is not the trainer.
# Each entry: a key pattern, the values that have no effect (None: any), and why.
VERL_NO_EFFECT: tuple[tuple[str, tuple | None, str], ...] = (
    ("*.fsdp_config.*", None, "FSDP sharding and offloading"),
    ("*.megatron.*", None, "Megatron parallelism"),
    ("*.ulysses_sequence_parallel_size", None, "sequence parallelism"),
    ("*.use_dynamic_bsz", None, "token-budgeted micro-batches"),
    ("*.log_prob_use_dynamic_bsz", None, "token-budgeted micro-batches"),
    ("*.ppo_max_token_len_per_gpu", None, "micro-batch token budget"),
    ("*.log_prob_max_token_len_per_gpu", None, "micro-batch token budget"),
    ("*micro_batch_size*", None, "micro-batch size (gradients are the same)"),
    ("actor_rollout_ref.actor.strategy", None, "verl's training engine"),
    ("actor_rollout_ref.model.use_remove_padding", None, "padding-free kernels"),
    ("actor_rollout_ref.model.use_fused_kernels", None, "fused kernels"),
    ("actor_rollout_ref.hybrid_engine", None, "verl's colocated engines"),
    ("actor_rollout_ref.rollout.mode", None, "verl's rollout mode"),
    ("actor_rollout_ref.rollout.enforce_eager", None, "vLLM CUDA graphs"),
    ("actor_rollout_ref.rollout.load_format", None, "vLLM weight loading"),
    ("actor_rollout_ref.rollout.dtype", None, "vLLM dtype (the trainer samples from the policy itself)"),
    ("actor_rollout_ref.rollout.free_cache_engine", None, "vLLM memory"),
    ("actor_rollout_ref.rollout.calculate_log_probs", None, "the rollout's logprobs (always recorded here)"),
    ("actor_rollout_ref.rollout.chat_scheduler", None, "verl's chat scheduler"),
    ("actor_rollout_ref.rollout.engine_kwargs.*", None, "vLLM/SGLang engine options"),
    ("actor_rollout_ref.rollout.agent.num_workers", None, "verl's agent-loop workers"),
    ("actor_rollout_ref.ref.*", None, "the reference model's placement"),
    ("critic.*", None, "the critic (GRPO and its variants have none)"),
    ("trainer.critic_warmup", (0,), "critic warm-up (there is no critic)"),
    ("trainer.default_hdfs_dir", (None,), "HDFS copies of checkpoints"),
    ("trainer.balance_batch", None, "balancing tokens across GPUs"),
    ("trainer.episode_log_dir", None, "rLLM's episode log files (episodes go to the run's sinks)"),
    ("trainer.n_training_gpus_per_node", None, "GPU placement"),
    ("algorithm.kl_ctrl.*", None, "the KL-in-reward controller, used only with algorithm.use_kl_in_reward"),
    ("algorithm.use_kl_in_reward", (False,), "KL in the reward (off)"),
    ("actor_rollout_ref.actor.kl_loss_type", ("low_var_kl", "k3"), "the KL estimator: TRL's is k3, verl's low_var_kl"),
    ("ray_init.*", None, "Ray start-up"),
    ("ray_kwargs.*", None, "Ray start-up"),
    ("data.filter_overlong_prompts*", None, "verl's prompt pre-filter (long prompts end with max_prompt_length here)"),
    ("data.return_multi_modal_inputs", (False,), "multi-modal inputs (off)"),
    ("data.gen_batch_size", None, "rLLM's rejection-sampling batch (see rllm.rejection_sample)"),
    # vLLM's sizing of the rollout engine (ours are actor_rollout_ref.rollout.gpu_memory_utilization and
    # tensor_model_parallel_size, in the audit of docs/keys.md)
    ("actor_rollout_ref.rollout.max_num_batched_tokens", None, "vLLM's token budget per scheduler step"),
    ("actor_rollout_ref.rollout.max_num_seqs", None, "vLLM's sequences per scheduler step"),
    ("actor_rollout_ref.rollout.max_model_len", None, "vLLM's context length"),
    ("actor_rollout_ref.rollout.data_parallel_size", None, "the rollout engine's data parallelism"),
    ("actor_rollout_ref.rollout.expert_parallel_size", None, "the rollout engine's expert parallelism"),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size", None, "the rollout engine's pipeline parallelism"),
    ("actor_rollout_ref.rollout.enable_chunked_prefill", None, "vLLM's chunked prefill"),
    ("actor_rollout_ref.rollout.enable_prefix_caching", None, "vLLM's prefix cache"),
    ("actor_rollout_ref.rollout.disable_log_stats", None, "vLLM's statistics log"),
    ("actor_rollout_ref.rollout.layered_summon", None, "FSDP weight gathering for the rollout engine"),
    ("actor_rollout_ref.rollout.layer_name_map.*", None, "verl's weight names for the rollout engine"),
    # verl's rollout copy of the length limits (they default to data.max_prompt_length and
    # data.max_response_length, which bound every episode here)
    ("actor_rollout_ref.rollout.prompt_length", None, "the rollout engine's prompt limit (data.max_prompt_length bounds prompts here)"),
    ("actor_rollout_ref.rollout.response_length", None, "the rollout engine's response limit (data.max_response_length bounds responses here)"),
    ("actor_rollout_ref.rollout.trace.*", None, "verl's rollout tracing (episodes go to the run's sinks)"),
    ("actor_rollout_ref.actor.clip_ratio_c", None,
     "dual-clip PPO's bound on the ratio of tokens with a negative advantage; the trl loss clips without it"),
    ("trainer.log_val_generations", None, "verl's print of validation generations (validation episodes go to the run's sinks)"),
    ("data.return_raw_chat", None, "verl's dataset handing its agent loop the chat messages (the rollout engine always has them here)"),
    ("data.truncation", None, "verl's handling of over-long prompts (an episode whose prompt is too long ends with max_prompt_length here)"),
)
# Keys that verl's users leave null for their framework to fill in (AWorld's grpo_trainer.yaml says so in
# its header): here the run's train_dataset, test_dataset, reward_func and agent fill them, so a null
# asks for nothing. A value is a verl setting like any other (refused away from verl).
VERL_FILLED_LATER = {
    "data.train_files": "the run's train_dataset",
    "data.val_files": "the run's test_dataset",
    "custom_reward_function.path": "the run's reward_func",
    "custom_reward_function.name": "the run's reward_func",
    "reward.custom_reward_function.path": "the run's reward_func",
    "reward.custom_reward_function.name": "the run's reward_func",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "the run's agent",
}


@functools.lru_cache(maxsize=4)
def _verl_defaults_yaml(groups: tuple[tuple[str, str], ...] = ()) -> str:
    """verl's composed PPO trainer config, unresolved, as YAML (composing takes half a second; cache it).

    Composed from verl's config folder, found without importing verl: the package's ``__init__``
    imports torch, Ray and tensordict (3 CPU-seconds), which a process that only checks a key's name
    (the CLI or the run form telling an unknown key from one of verl's) has no use for. Hydra reads
    the same YAML files as through the module ``verl.trainer.config``, and composes the same config
    (tests/training/test_verl_config.py)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=_verl_config_folder(), version_base=None):
        composed = compose("ppo_trainer", overrides=[f"{key}={value}" for key, value in groups])
    return OmegaConf.to_yaml(composed)


def _verl_config_folder() -> str:
    spec = importlib.util.find_spec("verl")  # a top-level package's spec: its __init__ is not run
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed", name="verl")
    return os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config")


def verl_default_config(groups: dict[str, str] | None = None):
    """A fresh copy of verl's PPO trainer config (a struct ``DictConfig``: unknown keys are refused)."""
    from omegaconf import OmegaConf

    config = OmegaConf.create(_verl_defaults_yaml(tuple(sorted((groups or {}).items()))))
    OmegaConf.set_struct(config, True)
    return config


def verl_keys(verl_config: Any = None) -> set[str]:
    """Every dotted path of verl's config, sections included."""
    from omegaconf import OmegaConf

    verl_config = verl_config if verl_config is not None else verl_default_config()
    leaves = flatten(OmegaConf.to_container(verl_config, resolve=False))
    keys = set(leaves)
    for key in leaves:
        parts = key.split(".")
        keys.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return keys


@functools.lru_cache(maxsize=1)
def _default_verl_keys() -> frozenset[str]:
    return frozenset(verl_keys())


def is_verl_key(key: str) -> bool:
    """Whether verl's PPO trainer config has ``key`` (verl installed), else whether it sits in one
    of verl's sections that we do not have."""
    if is_verl_available():
        return key in _default_verl_keys()
    return key.split(".", 1)[0] in VERL_ONLY_SECTIONS


def verl_elsewhere(key: str, value: Any, given: dict[str, Any]) -> Elsewhere | None:
    """What verl's ``key`` set to ``value`` does on the other backends (``given``: every key given
    beside it): None when it is refused there."""
    if value is None and key in VERL_FILLED_LATER:
        return Elsewhere("not_given", f"verl's users leave it for their framework to fill in; {VERL_FILLED_LATER[key]} does here")
    for pattern, harmless, why in VERL_NO_EFFECT:
        if fnmatch.fnmatchcase(key, pattern) and (harmless is None or value in harmless):
            return Elsewhere("no_effect", f"{why}: a verl setting, with no effect outside the verl backend")
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):  # the nearest section switched off by its own enable flag
        switch = ".".join(parts[:end]) + ".enable"
        if switch != key and given.get(switch) is False and is_verl_key(switch):
            return Elsewhere("no_effect", f"its section is switched off ({switch}=false)")
    if key.endswith(".enable") and value is False and is_verl_key(key):
        return Elsewhere("no_effect", f"it switches verl's {key.rsplit('.', 1)[0]} off, which no other backend has")
    return None


register_foreign_keys("verl", is_verl_key, verl_elsewhere)
