"""Training configuration: defaults, overrides, validation, frozen afterwards.

Keys follow verl's names wherever verl has one (``data.train_batch_size``,
``actor_rollout_ref.rollout.n``, ``actor_rollout_ref.actor.optim.lr``, ...) so that an rLLM or
verl user's overrides carry over; agent-loop settings live under ``rllm.*`` as in rLLM.

Overrides come as a dict of dotted keys, a list of ``key=value`` strings, a nested dict, or a
YAML file path. Every error names the key and says how to fix it; a misspelt key gets the
nearest valid key as a suggestion.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml
from training.config import names
from training.errors import ConfigError, Problems

logger = logging.getLogger("training")


def _doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING, *, location: bool = False) -> Any:
    """A documented field. ``location``: its value names a file, directory, interpreter or service
    (a platform sets these itself and never takes them from a run's overrides)."""
    metadata = {"doc": text, "location": location}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


@dataclass(frozen=True)
class DataConfig:
    train_batch_size: int = _doc("Prompts (tasks) per training step.", 8)
    val_batch_size: int | None = _doc("Prompts per validation pass; None uses the whole validation set.", None)
    max_prompt_length: int = _doc("Longest prompt in tokens; longer episodes end with max_prompt_length.", 512)
    max_response_length: int = _doc("Most tokens after the prompt (all turns together).", 256)
    prompt_key: str = _doc("Dataset column that holds the prompt of a single-turn task.", "prompt")
    answer_key: str = _doc("Dataset column the reward compares against.", "ground_truth")
    shuffle: bool = _doc("Shuffle the training set each epoch.", True)

    def __post_init__(self) -> None:
        _check(self.train_batch_size >= 1, "data.train_batch_size", "must be at least 1.")
        _check(self.max_prompt_length >= 1, "data.max_prompt_length", "must be at least 1 token.")
        _check(self.max_response_length >= 1, "data.max_response_length", "must be at least 1 token.")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = _doc(
        "Hugging Face hub id or local directory of the policy model. 'tiny-char' builds a tiny "
        "character-level Qwen2 model in code (no download), for tests and demos.",
        None, location=True,
    )
    tokenizer_path: str | None = _doc("Tokenizer id or directory; None uses model.path.", None, location=True)
    trust_remote_code: bool = _doc("Allow the model repository's own code to run.", False)
    dtype: str = _doc("Weights dtype: float32, bfloat16 or float16.", "float32")
    enable_gradient_checkpointing: bool = _doc(
        "Recompute activations during the backward pass instead of keeping them: less memory for about a "
        "third more compute. On by default, as in verl, TRL and ms-swift; a small model on a CPU trains faster without it.",
        True,
    )
    tiny_layers: int = _doc("Layers of the 'tiny-char' model.", 2)
    tiny_hidden_size: int = _doc("Hidden size of the 'tiny-char' model.", 64)
    lora_rank: int = _doc(
        "LoRA rank of the trained adapter; 0 trains all weights where the backend can (tinker and "
        "fireworks train LoRA adapters and default to 32). The trl backend trains a peft adapter and saves "
        "it (adapter_config.json, adapter_model.safetensors) with each checkpoint and as the final model.",
        0,
    )
    lora_alpha: int = _doc("LoRA scaling factor (the adapter's update is scaled by lora_alpha / lora_rank).", 16)
    target_modules: str | list[str] = _doc(
        "The layers LoRA adapts, peft's names: 'all-linear' (every linear layer but the output one) or a "
        "list of module names such as [q_proj, v_proj].",
        "all-linear",
    )
    exclude_modules: str | list[str] | None = _doc(
        "Layers LoRA leaves alone among target_modules, peft's names (a regex, or a list of names); None: none.", None
    )

    def __post_init__(self) -> None:
        _check(self.lora_rank >= 0, "actor_rollout_ref.model.lora_rank", "must be 0 (no LoRA) or more.")
        _check(self.lora_alpha > 0, "actor_rollout_ref.model.lora_alpha", f"must be more than 0, got {self.lora_alpha}.")
        _check(
            bool(self.target_modules), "actor_rollout_ref.model.target_modules",
            "names no layer; use 'all-linear' or a list of module names such as [q_proj, v_proj].",
        )
        _check(
            self.dtype in ("float32", "bfloat16", "float16"),
            "actor_rollout_ref.model.dtype",
            f"must be float32, bfloat16 or float16, not {self.dtype!r}.",
        )


@dataclass(frozen=True)
class OptimConfig:
    lr: float = _doc("Learning rate of the policy.", 1e-6)
    weight_decay: float = _doc("AdamW weight decay.", 0.0)
    lr_warmup_steps: int = _doc("Linear warm-up steps (0: none).", 0)
    lr_scheduler_type: str = _doc("constant or cosine (verl's names).", "constant")

    def __post_init__(self) -> None:
        _check(0 < self.lr < 1, "actor_rollout_ref.actor.optim.lr", f"must be between 0 and 1, got {self.lr}.")
        _check(
            self.lr_scheduler_type in ("constant", "cosine"),
            "actor_rollout_ref.actor.optim.lr_scheduler_type",
            f"must be 'constant' or 'cosine', not {self.lr_scheduler_type!r}.",
        )


LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# verl's policy losses (core_algos.POLICY_LOSS_REGISTRY; a test keeps the two lists equal).
POLICY_LOSS_MODES = (
    "vanilla", "gspo", "bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg", "kl_cov", "sapo",
)


@dataclass(frozen=True)
class PolicyLossConfig:
    loss_mode: str = _doc(
        "verl's policy loss: vanilla (PPO clip on token ratios) or gspo (GSPO: one importance ratio per "
        "sequence, the geometric mean of its token ratios); verl's other losses run on the verl backend.",
        "vanilla",
    )

    def __post_init__(self) -> None:
        _check(
            self.loss_mode in POLICY_LOSS_MODES,
            "actor_rollout_ref.actor.policy_loss.loss_mode",
            f"must be one of {', '.join(POLICY_LOSS_MODES)}, not {self.loss_mode!r}.",
        )


@dataclass(frozen=True)
class ActorConfig:
    optim: OptimConfig = _doc("Optimizer settings.", factory=OptimConfig)
    ppo_mini_batch_size: int | None = _doc(
        "Prompts per optimizer step; None uses data.train_batch_size (one update per step).", None
    )
    ppo_epochs: int = _doc("Passes over each generated batch.", 1)
    clip_ratio: float = _doc("PPO clip range epsilon.", 0.2)
    clip_ratio_low: float | None = _doc("Lower clip epsilon (ratio >= 1 - low); None uses clip_ratio.", None)
    clip_ratio_high: float | None = _doc(
        "Upper clip epsilon (ratio <= 1 + high); None uses clip_ratio. DAPO's clip-higher uses 0.28.", None
    )
    loss_agg_mode: str = _doc(
        "How token losses become one loss (verl's names): token-mean (DAPO; every token weighs the same), "
        "seq-mean-token-mean (original GRPO), seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO: "
        "token sums divided by data.max_response_length).",
        "token-mean",
    )
    policy_loss: PolicyLossConfig = _doc("The policy loss.", factory=PolicyLossConfig)
    entropy_coeff: float = _doc("Weight of the entropy bonus.", 0.0)
    use_kl_loss: bool = _doc("Add a KL penalty to the reference model.", False)
    kl_loss_coef: float = _doc("Weight of the KL penalty when use_kl_loss is on.", 0.001)
    grad_clip: float = _doc("Clip gradients to this global norm.", 1.0)

    def __post_init__(self) -> None:
        _check(self.ppo_epochs >= 1, "actor_rollout_ref.actor.ppo_epochs", "must be at least 1.")
        _check(0 < self.clip_ratio < 1, "actor_rollout_ref.actor.clip_ratio", "must be between 0 and 1.")
        for name in ("clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            _check(value is None or 0 < value < 1, f"actor_rollout_ref.actor.{name}", f"must be between 0 and 1, got {value}.")
        _check(
            self.loss_agg_mode in LOSS_AGG_MODES,
            "actor_rollout_ref.actor.loss_agg_mode",
            f"must be one of {', '.join(LOSS_AGG_MODES)}, not {self.loss_agg_mode!r}.",
        )
        _check(self.kl_loss_coef >= 0, "actor_rollout_ref.actor.kl_loss_coef", "must not be negative.")


@dataclass(frozen=True)
class ValKwargsConfig:
    temperature: float = _doc("Validation sampling temperature (used when do_sample is true).", 0.0)
    top_p: float = _doc("Validation nucleus sampling threshold (used when do_sample is true).", 1.0)
    top_k: int = _doc("Validation top-k sampling: the k likeliest tokens only (used when do_sample is true; -1 or 0: off).", -1)
    n: int = _doc("Episodes per validation task; pass@n is reported beside pass@1.", 1)
    do_sample: bool = _doc("Sample during validation; false decodes greedily (verl's default).", False)

    def __post_init__(self) -> None:
        key = "actor_rollout_ref.rollout.val_kwargs"
        _check(self.n >= 1, f"{key}.n", "must be at least 1.")
        _check(0 < self.top_p <= 1, f"{key}.top_p", "must be in (0, 1].")
        _check(self.top_k >= -1, f"{key}.top_k", "must be -1 or 0 (off) or a number of tokens.")
        _check(self.temperature >= 0, f"{key}.temperature", "must not be negative.")
        _check(
            not self.do_sample or self.temperature > 0, f"{key}.temperature",
            "must be greater than 0 when do_sample is true (or set do_sample=false for greedy decoding).",
        )


@dataclass(frozen=True)
class RolloutConfig:
    n: int = _doc("Episodes sampled per prompt (the group size of GRPO).", 8)
    temperature: float = _doc("Sampling temperature.", 1.0)
    top_p: float = _doc("Nucleus sampling threshold.", 1.0)
    top_k: int = _doc("Top-k sampling: sample among the k likeliest tokens (-1 or 0: off, verl's default -1).", -1)
    name: str = _doc("Rollout engine of verl: vllm or sglang (ignored by trl).", "vllm")
    server_url: str | None = _doc(
        "trl backend: a running vLLM server (`vllm serve`) that generates the rollouts; TRL pushes the weights "
        "to it every step (needs the vllm package). None generates in the training process.",
        None, location=True,
    )
    gpu_memory_utilization: float = _doc("Share of GPU memory the rollout engine may take (verl).", 0.5)
    tensor_model_parallel_size: int = _doc("Tensor-parallel size of the rollout engine (verl).", 1)
    val_kwargs: ValKwargsConfig = _doc("Sampling when scoring the test dataset (verl's names).", factory=ValKwargsConfig)

    def __post_init__(self) -> None:
        _check(self.n >= 1, "actor_rollout_ref.rollout.n", "must be at least 1 (2 or more for GRPO).")
        _check(self.temperature > 0, "actor_rollout_ref.rollout.temperature", "must be greater than 0.")
        _check(0 < self.top_p <= 1, "actor_rollout_ref.rollout.top_p", "must be in (0, 1].")
        _check(self.top_k >= -1, "actor_rollout_ref.rollout.top_k", "must be -1 or 0 (off) or a number of tokens.")


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    model: ModelConfig = _doc("The policy model.", factory=ModelConfig)
    actor: ActorConfig = _doc("The policy update.", factory=ActorConfig)
    rollout: RolloutConfig = _doc("Sampling.", factory=RolloutConfig)


@dataclass(frozen=True)
class FilterGroupsConfig:
    enable: bool = _doc("Drop groups whose rewards are all equal (they carry no signal).", False)


# verl's advantage estimators (core_algos.ADV_ESTIMATOR_REGISTRY; a test keeps the two lists equal).
ADV_ESTIMATORS = (
    "grpo", "grpo_passk", "grpo_vectorized", "gpg", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
    "rloo", "rloo_vectorized", "gae", "gdpo", "optimal_token_baseline", "remax", "tir_optimal_token_baseline",
)


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = _doc(
        "verl's advantage estimator, computed by verl on every backend: grpo, rloo, reinforce_plus_plus, "
        "reinforce_plus_plus_baseline, grpo_passk, opo, gpg (and their _vectorized forms); gae, remax, gdpo "
        "and the optimal token baselines need what only the verl backend produces.",
        "grpo",
    )
    norm_adv_by_std_in_grpo: bool = _doc("Divide GRPO advantages by the group's reward std (false: Dr. GRPO).", True)
    gamma: float = _doc("Discount (REINFORCE++).", 1.0)
    filter_groups: FilterGroupsConfig = _doc("Group filtering.", factory=FilterGroupsConfig)

    def __post_init__(self) -> None:
        _check(
            self.adv_estimator in ADV_ESTIMATORS,
            "algorithm.adv_estimator",
            f"must be one of {', '.join(ADV_ESTIMATORS)}, not {self.adv_estimator!r}.",
        )


@dataclass(frozen=True)
class TrainerConfig:
    total_training_steps: int = _doc("Optimizer steps to run.", 100)
    total_epochs: int = _doc("Upper bound on passes over the training set.", 1000)
    save_freq: int = _doc("Save a checkpoint every N steps (-1: only at the end).", -1)
    test_freq: int = _doc(
        "Score the test dataset every N steps and after the last (-1 or 0: never during training, as in verl; "
        "trainer.val_before_train still scores it before the first step); metrics val/<data_source>/...", -1
    )
    val_before_train: bool = _doc(
        "Score the test dataset before the first step (when there is one; not again when resuming from a checkpoint).", True
    )
    log_freq: int = _doc("Report metrics every N steps.", 1)
    resume_mode: str = _doc("auto (resume from the latest checkpoint if any) or disable.", "auto")
    project_name: str = _doc("Project name, for grouping runs.", "agent-trainer")
    experiment_name: str = _doc("Run name.", "run")
    logger: list[str] = _doc(
        "Where metrics go, verl's names: console, jsonl (or verl's 'file'), wandb, tensorboard, mlflow, "
        "swanlab (training/tracking/trackers.py). Each tracker writes under the run path unless a key below or its "
        "environment variable points elsewhere.",
        factory=lambda: ["console", "jsonl"],
    )
    wandb_dir: str | None = _doc("Folder wandb writes its wandb/ folder in; None: $WANDB_DIR, else the run path.", None, location=True)
    wandb_entity: str | None = _doc("W&B entity (team or user); None: $WANDB_ENTITY, else the API key's default.", None)
    tensorboard_dir: str | None = _doc("TensorBoard event folder; None: $TENSORBOARD_DIR, else <run path>/tensorboard.", None, location=True)
    mlflow_tracking_uri: str | None = _doc(
        "MLflow tracking URI; None: $MLFLOW_TRACKING_URI, else a SQLite store in <run path>/mlruns.", None,
        location=True,
    )
    system_metrics_interval: float = _doc(
        "Seconds between samples of CPU, memory and GPU use (system/* metrics, averaged per logged step); 0: off.", 5.0
    )
    default_local_dir: str | None = _doc("Checkpoint directory; None puts them under the run path.", None, location=True)
    seed: int = _doc("Random seed.", 42)
    nnodes: int = _doc("Machines in the job (verl).", 1)
    n_gpus_per_node: int = _doc("GPUs per machine (verl).", 1)
    device: str = _doc("auto, cpu or cuda.", "auto")
    ray_address: str | None = _doc("Join this Ray cluster (verl); None starts a local one.", None, location=True)
    max_checkpoints: int = _doc("Keep at most this many checkpoints (0: keep all).", 2)
    metric_for_best_model: str | None = _doc(
        "Keep the best checkpoints by this metric (its name as logged, e.g. val/default/pass@1 or "
        "reward/mean, HF's metric_for_best_model) besides the newest trainer.max_checkpoints: they are "
        "never rotated out. A checkpoint is ranked by the metric's value logged at its own step. None: newest only.",
        None,
    )
    greater_is_better: bool | None = _doc(
        "Whether a larger trainer.metric_for_best_model is better; None: true unless the metric's name "
        "ends in 'loss' (HF's rule).", None,
    )
    keep_best_checkpoints: int = _doc(
        "How many of the best checkpoints by trainer.metric_for_best_model are kept (used only with it).", 1,
    )
    python: str | None = _doc(
        "Interpreter of the training process, for backends that train in an environment of their own "
        "(swift); None: the backend's default.",
        None, location=True,
    )
    cpu_threads: int = _doc(
        "Torch threads when training on the CPU; 0 keeps torch's default. Tiny models on a few "
        "shared cores run several times faster with 1.",
        0,
    )
    log_episodes: bool = _doc(
        "Keep every episode (rLLM's name): each step's and each validation's episodes, token ids, mask, logprobs, "
        "advantage and reward components, as Parquet per step in <run path>/episodes/ (on the platform: in the run's "
        "artifact store, searchable on its API). false: only the few sample episodes the trackers get.",
        True,
    )
    log_episodes_fraction: float = _doc(
        "Share of each step's episodes trainer.log_episodes keeps (a seeded random sample; 1: all).", 1.0
    )
    log_episodes_per_step: int = _doc(
        "At most this many episodes of each step are kept (after log_episodes_fraction); 0: no limit.", 0
    )
    max_episode_error_rate: float = _doc(
        "Fail the run when more than this share of one step's episodes end with termination "
        "'error' (the error names the count and shows the first episode's traceback). 1 never fails.",
        0.5,
    )

    def __post_init__(self) -> None:
        _check(self.total_training_steps >= 1, "trainer.total_training_steps", "must be at least 1.")
        _check(self.log_freq >= 1, "trainer.log_freq", "must be at least 1.")
        _check(self.save_freq == -1 or self.save_freq >= 1, "trainer.save_freq", "must be -1 or at least 1.")
        _check(self.test_freq >= -1, "trainer.test_freq", "must be -1 or 0 (never) or a number of steps.")
        _check(self.keep_best_checkpoints >= 1, "trainer.keep_best_checkpoints",
               "must be at least 1 (leave trainer.metric_for_best_model out to keep the newest only).")
        _check(self.metric_for_best_model is None or bool(str(self.metric_for_best_model).strip()),
               "trainer.metric_for_best_model", "must name a logged metric (e.g. reward/mean), or be null.")
        _check(self.resume_mode in ("auto", "disable"), "trainer.resume_mode", "must be 'auto' or 'disable'.")
        _check(self.device in ("auto", "cpu", "cuda"), "trainer.device", "must be auto, cpu or cuda.")
        _check(self.cpu_threads >= 0, "trainer.cpu_threads", "must be 0 (torch's default) or more.")
        _check(
            0 <= self.max_episode_error_rate <= 1,
            "trainer.max_episode_error_rate",
            f"must be between 0 (no errors allowed) and 1 (never fail), got {self.max_episode_error_rate}.",
        )
        problem = names.value_problem("trainer.logger", list(self.logger))
        _check(problem is None, "trainer.logger", problem or "")
        _check(0 < self.log_episodes_fraction <= 1, "trainer.log_episodes_fraction",
               f"must be above 0 and at most 1 (set trainer.log_episodes=false to keep none), got {self.log_episodes_fraction}.")
        _check(self.log_episodes_per_step >= 0, "trainer.log_episodes_per_step", "must be 0 (no limit) or a number of episodes.")
        _check(self.system_metrics_interval >= 0, "trainer.system_metrics_interval", "must be 0 (off) or a number of seconds.")


@dataclass(frozen=True)
class AgentLoopConfig:
    name: str | None = _doc(
        "rLLM's registry name of the agent (its launch scripts set it). The agent is the agent_class "
        "given to AgentTrainer; this only labels the run.",
        None,
    )
    max_steps: int = _doc("Most turns per episode; then it ends with max_turns.", 5)
    max_tokens_per_turn: int = _doc("Most tokens the model may write in one turn.", 64)
    trajectory_timeout: float | None = _doc("Seconds an episode may take, then it ends with timeout; null: no limit.", 60.0)
    retries: int = _doc("Retries of an episode that raised, before it counts as an error.", 0)
    n_parallel_tasks: int = _doc("Episodes run concurrently.", 128)
    overlong_filter: bool = _doc(
        "Mask (do not train on) episodes whose response reached data.max_response_length (rLLM's).", False
    )
    agent_args: dict = _doc(
        "Keyword arguments of the agent class, merged under AgentTrainer's agent_args (rLLM's "
        "rllm.agent.agent_args.<name>=...; AgentTrainer's own win).",
        factory=dict,
    )
    engine_args: dict = _doc(
        "rLLM's AgentExecutionEngine arguments; only retry_limit (attempts per episode, so "
        "rllm.agent.retries = retry_limit - 1) has a meaning here.",
        factory=dict,
    )

    def __post_init__(self) -> None:
        _check(self.max_steps >= 1, "rllm.agent.max_steps", "must be at least 1.")
        _check(self.max_tokens_per_turn >= 1, "rllm.agent.max_tokens_per_turn", "must be at least 1.")
        _check(
            self.trajectory_timeout is None or self.trajectory_timeout > 0,
            "rllm.agent.trajectory_timeout", "must be greater than 0 seconds, or null for no limit.",
        )
        _check(self.retries >= 0, "rllm.agent.retries", "must not be negative.")
        _check(self.n_parallel_tasks >= 1, "rllm.agent.n_parallel_tasks", "must be at least 1.")
        unknown = sorted(set(self.engine_args) - {"retry_limit"})
        _check(
            not unknown, f"rllm.agent.engine_args.{unknown[0] if unknown else ''}",
            "is an argument of rLLM's AgentExecutionEngine, which this trainer does not use; the rollout is "
            "set by rllm.agent.* (max_steps, trajectory_timeout, retries, n_parallel_tasks).",
        )


@dataclass(frozen=True)
class EnvLoopConfig:
    name: str | None = _doc("rLLM's registry name of the environment; the environment is env_class, so this only labels the run.", None)
    env_args: dict = _doc(
        "Keyword arguments of the environment (rLLM's rllm.env.env_args.<name>=...), merged under "
        "AgentTrainer's env_args (AgentTrainer's own win).",
        factory=dict,
    )


@dataclass(frozen=True)
class WorkflowLoopConfig:
    use_workflow: bool = _doc(
        "rLLM's switch to its workflow trainer. Here a run is a workflow when workflow_class is given; "
        "true without a workflow_class or agent_class/env_class is refused.",
        False,
    )
    name: str | None = _doc("rLLM's registry name of the workflow; the workflow is workflow_class, so this only labels the run.", None)
    workflow_args: dict = _doc(
        "Keyword arguments of the workflow, merged under AgentTrainer's workflow_args (AgentTrainer's own win).",
        factory=dict,
    )
    n_parallel_tasks: int | None = _doc("rLLM's workflow pool size: when set, used instead of rllm.agent.n_parallel_tasks.", None)
    retry_limit: int | None = _doc(
        "rLLM's attempts per episode: when set, rllm.agent.retries becomes retry_limit - 1.", None
    )

    def __post_init__(self) -> None:
        _check(self.n_parallel_tasks is None or self.n_parallel_tasks >= 1, "rllm.workflow.n_parallel_tasks", "must be at least 1.")
        _check(self.retry_limit is None or self.retry_limit >= 1, "rllm.workflow.retry_limit", "must be at least 1 (attempts).")


STEPWISE_MODES = ("broadcast", "per_step")


@dataclass(frozen=True)
class StepwiseAdvantageConfig:
    enable: bool = _doc("Train every step of a trajectory as a sequence of its own (rLLM's stepwise advantage).", False)
    mode: str = _doc(
        "broadcast: each step gets its trajectory's advantage; per_step: each step's own reward is compared "
        "with the same step of the other episodes of its task.",
        "broadcast",
    )
    normalize_by_steps: bool = _doc("broadcast: divide the advantage by the trajectory's number of steps.", False)

    def __post_init__(self) -> None:
        _check(
            self.mode in STEPWISE_MODES, "rllm.stepwise_advantage.mode",
            f"must be one of {', '.join(STEPWISE_MODES)}, not {self.mode!r}.",
        )


@dataclass(frozen=True)
class CompactFilteringConfig:
    enable: bool = _doc("Mask (do not train on) episodes that ended for the reasons flagged below.", False)
    mask_max_prompt_length_exceeded: bool = _doc("Mask episodes ended by max_prompt_length.", True)
    mask_max_response_length_exceeded: bool = _doc("Mask episodes ended by max_response_length.", True)
    mask_env_done: bool = _doc("Mask episodes the environment ended.", False)
    mask_max_turns_exceeded: bool = _doc("Mask episodes ended by max_turns.", True)
    mask_timeout: bool = _doc("Mask episodes ended by timeout.", True)
    mask_unknown: bool = _doc("Mask episodes that ended for no stated reason.", False)
    mask_error: bool = _doc("Mask episodes ended by an error.", True)


@dataclass(frozen=True)
class RejectionSampleConfig:
    enable: bool = _doc("Mask the tasks whose episodes were all correct or all wrong (rLLM's rejection sampling).", False)
    multiplier: float = _doc(
        "rLLM samples multiplier x data.train_batch_size tasks to refill rejected ones; only 1 on the trl "
        "backend, whose batches are TRL's.",
        1,
    )

    def __post_init__(self) -> None:
        _check(self.multiplier >= 1, "rllm.rejection_sample.multiplier", "must be at least 1.")


_SDK_ENDPOINT = (
    "The trainer serves its own OpenAI-compatible endpoint on 127.0.0.1 (a port the OS picks) for the run, "
    "and get_chat_client() routes to it, so this is accepted and not used."
)


@dataclass(frozen=True)
class SdkStoreConfig:
    path: str | None = _doc(
        "rLLM's trace database. Each episode's calls are kept in memory here, so this is accepted and not used.",
        "~/.rllm/traces.db", location=True,
    )


@dataclass(frozen=True)
class SdkProcessingConfig:
    groupby_key: str | None = _doc(
        "rLLM's grouping of one episode's calls into trajectories by session metadata; not implemented "
        "(null: all calls are one trajectory). Return TrajectoryView lists instead.",
        None,
    )
    traj_name_key: str | None = _doc("rLLM's trajectory name from session metadata; not implemented (null).", None)

    def __post_init__(self) -> None:
        for name in ("groupby_key", "traj_name_key"):
            _check(
                getattr(self, name) is None, f"rllm.sdk.processing.{name}",
                "is not implemented: every call of an episode is one trajectory, unless the function returns "
                "TrajectoryView lists (training.sdk.trajectory / session); leave it null.",
            )


@dataclass(frozen=True)
class SdkProxyConfig:
    host: str = _doc(f"rLLM's LiteLLM proxy host. {_SDK_ENDPOINT}", "127.0.0.1")
    port: int = _doc(f"rLLM's LiteLLM proxy port. {_SDK_ENDPOINT}", 4000)
    mode: str = _doc(f"rLLM's proxy mode (external or subprocess). {_SDK_ENDPOINT}", "subprocess")
    admin_token: str = _doc(f"rLLM's proxy admin token. {_SDK_ENDPOINT}", "my-shared-secret")


@dataclass(frozen=True)
class SdkConfig:
    store: SdkStoreConfig = _doc("rLLM's trace store.", factory=SdkStoreConfig)
    processing: SdkProcessingConfig = _doc("rLLM's trace processing.", factory=SdkProcessingConfig)
    proxy: SdkProxyConfig = _doc("rLLM's LiteLLM proxy.", factory=SdkProxyConfig)


@dataclass(frozen=True)
class RllmConfig:
    agent: AgentLoopConfig = _doc("The agent loop.", factory=AgentLoopConfig)
    env: EnvLoopConfig = _doc("The environment (rLLM's rllm.env).", factory=EnvLoopConfig)
    workflow: WorkflowLoopConfig = _doc("Workflows (rLLM's rllm.workflow).", factory=WorkflowLoopConfig)
    stepwise_advantage: StepwiseAdvantageConfig = _doc("Per-step training of multi-step trajectories.", factory=StepwiseAdvantageConfig)
    compact_filtering: CompactFilteringConfig = _doc("Masking episodes by how they ended.", factory=CompactFilteringConfig)
    rejection_sample: RejectionSampleConfig = _doc("Masking tasks that teach nothing.", factory=RejectionSampleConfig)
    mask_truncated_samples: bool = _doc("Mask (do not train on) rows whose response reached data.max_response_length.", False)
    filter_token_mismatch: bool = _doc(
        "rLLM drops trajectories whose re-tokenised text differs from the sampled tokens. Here the trainer "
        "learns from the sampled token ids themselves, so there is never a mismatch; either value is accepted.",
        True,
    )
    accumulate_reasoning: bool = _doc(
        "rLLM's chat parser can drop earlier turns' reasoning when it re-tokenises a conversation. Here the "
        "trainer learns from the sampled tokens, so earlier turns are kept exactly as the model wrote them; "
        "either value is accepted.",
        False,
    )
    disable_thinking: bool = _doc("Render chat templates with enable_thinking=False (Qwen3 and alike).", False)
    backend: str | None = _doc(
        "rLLM's unified config names the backend here (rllm/backend=tinker); AgentTrainer's backend= decides "
        "which runs, and the two must agree where both are given.",
        None,
    )
    sdk: SdkConfig = _doc("rLLM's SDK (agent_run_func through an OpenAI-compatible endpoint; training/sdk).", factory=SdkConfig)

    @property
    def retries(self) -> int:
        """Retries of a failed episode: rllm.workflow.retry_limit - 1 where set, else rllm.agent.retries."""
        limit = self.workflow.retry_limit
        return limit - 1 if limit is not None else self.engine_retries

    @property
    def engine_retries(self) -> int:
        limit = self.agent.engine_args.get("retry_limit")
        return int(limit) - 1 if limit is not None else self.agent.retries

    @property
    def n_parallel_tasks(self) -> int:
        return self.workflow.n_parallel_tasks or self.agent.n_parallel_tasks


@dataclass(frozen=True)
class OverlongBufferConfig:
    enable: bool = _doc("Penalize responses that run into the last `len` tokens of data.max_response_length (DAPO).", False)
    len: int = _doc("Tokens before data.max_response_length where the penalty starts.", 0)
    penalty_factor: float = _doc("Penalty at data.max_response_length; it grows linearly over the buffer.", 1.0)

    def __post_init__(self) -> None:
        key = "reward_model.overlong_buffer"
        _check(not self.enable or self.len >= 1, f"{key}.len", "must be at least 1 token when the buffer is enabled.")
        _check(self.penalty_factor >= 0, f"{key}.penalty_factor", "must not be negative.")


@dataclass(frozen=True)
class RewardModelConfig:
    overlong_buffer: OverlongBufferConfig = _doc("Soft overlong punishment (verl's DAPO reward shaping).", factory=OverlongBufferConfig)


REMOTE_LOSSES = ("importance_sampling", "ppo")


@dataclass(frozen=True)
class RemoteConfig:
    base_url: str | None = _doc(
        "URL of the remote training service (tinker, fireworks); None: the SDK's default "
        "(TINKER_BASE_URL or Tinker's service; https://api.fireworks.ai).",
        None, location=True,
    )
    loss_fn: str = _doc("Loss the service computes: importance_sampling or ppo (clipped by actor.clip_ratio).", "importance_sampling")
    adam_beta1: float = _doc("Adam beta1 sent with each optimizer step.", 0.9)
    adam_beta2: float = _doc("Adam beta2 sent with each optimizer step.", 0.95)
    adam_eps: float = _doc("Adam epsilon sent with each optimizer step.", 1e-8)
    region: str | None = _doc("Fireworks region of the trainer job and deployment; None: Fireworks chooses.", None)
    training_shape: str | None = _doc(
        "Fireworks training shape (accounts/<a>/trainingShapes/<s>); None: Fireworks selects one.", None
    )
    accelerator_type: str | None = _doc("Fireworks deployment accelerator when no deployment shape applies.", None)
    lora_train_unembed: bool = _doc("Train the LoRA adapter on the output embedding too (rLLM's model.train_unembed).", True)
    lora_train_attn: bool = _doc("Train the LoRA adapter on the attention layers (rLLM's model.train_attn).", True)
    lora_train_mlp: bool = _doc("Train the LoRA adapter on the MLP layers (rLLM's model.train_mlp).", True)
    poll_interval_s: float = _doc("Seconds between readiness polls of remote jobs and deployments.", 5.0)
    ready_timeout_s: float = _doc("Seconds a remote trainer job or deployment may take to become ready.", 1800.0)

    def __post_init__(self) -> None:
        _check(self.loss_fn in REMOTE_LOSSES, "remote.loss_fn", f"must be one of {', '.join(REMOTE_LOSSES)}, not {self.loss_fn!r}.")
        _check(0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1, "remote.adam_beta1", "betas must be in [0, 1).")
        _check(self.adam_eps > 0, "remote.adam_eps", "must be greater than 0.")
        _check(self.poll_interval_s > 0, "remote.poll_interval_s", "must be greater than 0 seconds.")
        _check(self.lora_train_unembed or self.lora_train_attn or self.lora_train_mlp, "remote.lora_train_mlp",
               "the adapter must train on something: remote.lora_train_unembed, lora_train_attn and lora_train_mlp are all false.")
        _check(self.ready_timeout_s > 0, "remote.ready_timeout_s", "must be greater than 0 seconds.")


@dataclass(frozen=True)
class Config:
    """The whole training configuration. Build it with ``Config.build(overrides)``."""

    data: DataConfig = _doc("Data.", factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = _doc("Model, update and sampling.", factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = _doc("Advantages.", factory=AlgorithmConfig)
    reward_model: RewardModelConfig = _doc("Reward shaping (verl's names).", factory=RewardModelConfig)
    trainer: TrainerConfig = _doc("The training loop.", factory=TrainerConfig)
    rllm: RllmConfig = _doc("Agent-loop settings (rLLM's names).", factory=RllmConfig)
    remote: RemoteConfig = _doc("Remote training services (tinker, fireworks).", factory=RemoteConfig)

    def __post_init__(self) -> None:
        overlong = self.reward_model.overlong_buffer
        _check(
            not overlong.enable or overlong.len < self.data.max_response_length,
            "reward_model.overlong_buffer.len",
            f"must be shorter than data.max_response_length ({self.data.max_response_length}); got {overlong.len}.",
        )
        mini = self.actor_rollout_ref.actor.ppo_mini_batch_size
        if mini is not None:
            _check(
                1 <= mini <= self.data.train_batch_size and self.data.train_batch_size % mini == 0,
                "actor_rollout_ref.actor.ppo_mini_batch_size",
                f"must divide data.train_batch_size ({self.data.train_batch_size}); got {mini}.",
            )

    @classmethod
    def build(cls, overrides: "ConfigInput" = None, base: dict[str, Any] | None = None) -> "Config":
        """Defaults, then ``base`` (e.g. a backend's or platform's defaults), then ``overrides``."""
        merged = to_dict(cls())
        trl_origin: dict[str, str] = {}  # our key -> the TRL GRPOConfig name that set it
        ignored: dict[str, tuple[Any, str]] = {}  # another backend's settings with no effect here, and why
        given: set[str] = set()  # our keys that ``overrides`` sets (``base`` is the caller's, not the user's)
        ours = valid_keys()
        for layer in (base, overrides):
            # Hydra's "+key" adds a key; our dict-valued keys (env_args, ...) take new entries as they are.
            flat = {key.removeprefix("+"): value for key, value in parse_overrides(layer).items()}
            flat = translate_unified_names(flat)
            if any("." not in key for key in flat):
                flat = names.translate_undotted(flat, merged, trl_origin, ignored)
            for key, value in flat.items():
                elsewhere = None if key in ours else names.foreign_elsewhere(key, value, flat)
                if elsewhere is not None and elsewhere.kind == "not_given":
                    logger.info("%s=null: %s; not given", key, elsewhere.why)
                elif elsewhere is not None:
                    logger.warning("%s=%r has no effect on this backend: %s; recorded under ignored_keys", key, value, elsewhere.why)
                    ignored[key] = (value, elsewhere.why)
                else:
                    _set_dotted(merged, key, value)
                    if layer is overrides:
                        given.update(k for k in ours if k == key or k.startswith(key + "."))
        try:
            config = from_dict(cls, merged, prefix="")
        except ConfigError as exc:
            if exc.key in trl_origin:
                raise ConfigError(trl_origin[exc.key], f"{exc.message} (TRL's {trl_origin[exc.key]} sets {exc.key})") from exc
            raise
        object.__setattr__(config, "_ignored_keys", ignored)
        object.__setattr__(config, "_given_keys", frozenset(given))
        return config

    @property
    def ignored_keys(self) -> dict[str, tuple[Any, str]]:
        """Another backend's settings that were given but change nothing here (memory, parallelism,
        logging of verl's), so they were accepted, said and left out: key -> (value, why)."""
        return dict(self.__dict__.get("_ignored_keys", {}))

    @property
    def given_keys(self) -> frozenset[str]:
        """Our keys that the overrides set (under any of their names), as against defaults and a
        backend's or platform's base layer."""
        return self.__dict__.get("_given_keys", frozenset())

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def get(self, dotted_key: str) -> Any:
        value: Any = self
        for part in dotted_key.split("."):
            value = getattr(value, part)
        return value

    def replace(self, overrides: "ConfigInput") -> "Config":
        """A new validated Config with ``overrides`` applied (this one is left as it is)."""
        return Config.build(overrides, base=flatten(self.to_dict()))


ConfigInput = typing.Union[None, str, Path, dict, list, Config]

# rLLM main's unified config (rllm/trainer/config/unified.yaml with rllm/base.yaml, the cookbooks'
# train_*.sh) names these settings so; they are ours under the names on the right. (Tinker- and
# Fireworks-only names of that config are the remote backends' business.)
UNIFIED_NAMES: dict[str, str] = {
    "rllm/backend": "rllm.backend",
    "model.name": "actor_rollout_ref.model.path",
    "training.group_size": "actor_rollout_ref.rollout.n",
    "validation.group_size": "actor_rollout_ref.rollout.val_kwargs.n",
    "rllm.rollout.n": "actor_rollout_ref.rollout.n",
    "rllm.rollout.n_val": "actor_rollout_ref.rollout.val_kwargs.n",
    "rllm.rollout.train.temperature": "actor_rollout_ref.rollout.temperature",
    "rllm.rollout.train.top_p": "actor_rollout_ref.rollout.top_p",
    "rllm.rollout.val.temperature": "actor_rollout_ref.rollout.val_kwargs.temperature",
    "rllm.rollout.val.top_p": "actor_rollout_ref.rollout.val_kwargs.top_p",
}
# Whole sections of rLLM's base.yaml that are ours one level up: rllm.trainer.test_freq is trainer.test_freq.
UNIFIED_SECTIONS = ("rllm.trainer.", "rllm.data.")


def translate_unified_names(flat: dict[str, Any]) -> dict[str, Any]:
    """Keys of rLLM main's unified config under our names (logged); other keys as they are.
    Where both names are given, ours wins."""
    out: dict[str, Any] = {}
    renamed: dict[str, Any] = {}
    for key, value in flat.items():
        ours = UNIFIED_NAMES.get(key)
        if ours is None and key.startswith(UNIFIED_SECTIONS):
            ours = key.removeprefix("rllm.")
        if ours is None:
            out[key] = value
            continue
        logger.info("%s=%r: rLLM's unified config name of %s", key, value, ours)
        renamed[ours] = value
    return {**renamed, **out}


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """A config dataclass's field types, read once: ``typing.get_type_hints`` evaluates each string
    annotation anew, and the keys are looked up several times for every run a form or the API checks."""
    return typing.get_type_hints(cls)


def valid_keys(cls: type = Config, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every dotted key of the configuration, with its dataclass field (for docs and suggestions)."""
    keys: dict[str, dataclasses.Field] = {}
    hints = _field_types(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            keys.update(valid_keys(hints[f.name], key + "."))
        else:
            keys[key] = f
    return keys


def location_keys() -> list[str]:
    """The keys whose values name a file, directory, interpreter or service (``location=True``)."""
    return [key for key, f in valid_keys().items() if f.metadata.get("location")]


def parse_overrides(overrides: ConfigInput) -> dict[str, Any]:
    """Turn any accepted override form into a flat dict of dotted keys."""
    if overrides is None:
        return {}
    if isinstance(overrides, Config):
        return flatten(overrides.to_dict())
    if isinstance(overrides, Path) or (isinstance(overrides, str) and overrides.endswith((".yaml", ".yml"))):
        path = Path(overrides)
        if not path.is_file():
            raise ConfigError("config", f"file {path} does not exist.")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError("config", f"{path} must hold a mapping of keys to values.")
        return flatten(loaded)
    if isinstance(overrides, str):
        overrides = [line for line in overrides.splitlines() if line.strip() and not line.strip().startswith("#")]
    if isinstance(overrides, (list, tuple)):
        flat: dict[str, Any] = {}
        for item in overrides:
            if not isinstance(item, str) or "=" not in item:
                raise ConfigError("config", f"override {item!r} is not of the form key=value.")
            key, _, raw = item.partition("=")
            flat[key.strip()] = _parse_value(raw.strip())
        return flat
    if isinstance(overrides, dict):
        return flatten(overrides)
    if type(overrides).__module__.startswith("omegaconf"):  # hydra's DictConfig, as rLLM's scripts pass it
        from omegaconf import OmegaConf

        return flatten(OmegaConf.to_container(overrides, resolve=True))
    raise ConfigError("config", f"expected a dict, a hydra DictConfig, a list of 'key=value' strings or a YAML path, got {type(overrides).__name__}.")


def flatten(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c.d": 2}`` -> ``{"a.b": 1, "c.d": 2}``."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value and full not in _DICT_VALUED_KEYS:
            flat.update(flatten(value, full + "."))
        else:
            flat[full] = value
    return flat


_DICT_VALUED_KEYS: set[str] = set()


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def from_dict(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """Build dataclass ``cls`` from nested ``data``, checking keys and types."""
    hints = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise unknown_key(prefix + key)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        key, value, hint = prefix + f.name, data[f.name], hints[f.name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(key, f"is a section; set its keys, e.g. {key}.{dataclasses.fields(hint)[0].name}=...")
            kwargs[f.name] = from_dict(hint, value, key + ".")
        else:
            kwargs[f.name] = _coerce(key, value, hint)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # comparisons on a value of the wrong type in __post_init__
        raise ConfigError(prefix.rstrip(".") or "config", str(exc)) from exc


def unknown_key(key: str) -> ConfigError:
    """The error for a key the config does not have: another backend's setting is said to be one, a
    misspelling gets the nearest key."""
    owner = names.foreign_owner(key)
    if owner is not None:
        return ConfigError(
            key,
            f"is a {owner} setting that this trainer does not implement: it takes effect with backend={owner} "
            f"(passed to {owner} as it is); on other backends remove it.",
        )
    close = close_key(key, valid_keys())
    hint = f" Did you mean '{close}'?" if close else ""
    return ConfigError(key, f"unknown config key.{hint}")


def close_key(key: str, keys: Iterable[str]) -> str | None:
    """The key of ``keys`` that ``key`` is most likely a misspelling of, or None when none is near:
    a suggestion far from what was typed (``foo.bar`` -> ``remote.base_url``) misleads more than none."""
    keys, leaf = list(keys), key.rsplit(".", 1)[-1]

    def leaf_of(candidate: str) -> str:
        return candidate.rsplit(".", 1)[-1]

    # Alike as a whole and in the last part: a shared section (``trainer.``) alone is no likeness.
    for candidate in difflib.get_close_matches(key, keys, n=5, cutoff=0.6):
        if difflib.SequenceMatcher(None, leaf, leaf_of(candidate)).ratio() >= 0.5:
            return candidate
    return next((k for k in keys if leaf_of(k) == leaf), None)  # a right leaf in a wrong section: ``rollout.n``


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the field's type; accept ints for floats and strings of numbers."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        errors = []
        for arg in non_none:
            try:
                return _coerce(key, value, arg)
            except ConfigError as exc:
                errors.append(exc.message)
        raise ConfigError(key, errors[0])
    if hint is dict:  # keyword arguments (rllm.env.env_args, ...); null means none
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping of argument names to values, got {value!r}.")
        return dict(value)
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {value!r}.")
        return [_coerce(key, v, args[0]) for v in value] if args else list(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(key, f"expected true or false, got {value!r}.")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected a whole number, got {value!r}.")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(key, f"expected a whole number, got {value!r}.")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(key, f"expected a number, got {value!r}.")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(key, f"expected a string, got {value!r}.")
    return value


def _parse_value(raw: str) -> Any:
    """Parse the right side of ``key=value`` the way Hydra does: YAML scalars, lists, null."""
    try:
        return yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        return raw


def _set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = target
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if not isinstance(child, dict):
            if part in node:  # a leaf used as a section
                raise ConfigError(".".join(parts[: i + 1]), f"is a value, not a section; set it directly ({'.'.join(parts[: i + 1])}=...).")
            raise unknown_key(dotted)
        node = child
    if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict) and not (value is None and dotted in valid_keys()):
        raise ConfigError(dotted, "is a section; set one of its keys instead.")
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        for sub_key, sub_value in flatten(value).items():
            _set_dotted(node[parts[-1]], sub_key, sub_value)
        return
    node[parts[-1]] = value
