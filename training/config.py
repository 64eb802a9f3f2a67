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
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value or key is wrong. ``key`` names the dotted key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def _doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


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
        None,
    )
    tokenizer_path: str | None = _doc("Tokenizer id or directory; None uses model.path.", None)
    trust_remote_code: bool = _doc("Allow the model repository's own code to run.", False)
    dtype: str = _doc("Weights dtype: float32, bfloat16 or float16.", "float32")
    tiny_layers: int = _doc("Layers of the 'tiny-char' model.", 2)
    tiny_hidden_size: int = _doc("Hidden size of the 'tiny-char' model.", 64)
    lora_rank: int = _doc(
        "LoRA rank of the trained adapter; 0 trains all weights where the backend can (tinker and "
        "fireworks train LoRA adapters and default to 32).",
        0,
    )

    def __post_init__(self) -> None:
        _check(self.lora_rank >= 0, "actor_rollout_ref.model.lora_rank", "must be 0 (no LoRA) or more.")
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


@dataclass(frozen=True)
class ActorConfig:
    optim: OptimConfig = _doc("Optimizer settings.", factory=OptimConfig)
    ppo_mini_batch_size: int | None = _doc(
        "Prompts per optimizer step; None uses data.train_batch_size (one update per step).", None
    )
    ppo_epochs: int = _doc("Passes over each generated batch.", 1)
    clip_ratio: float = _doc("PPO clip range epsilon.", 0.2)
    entropy_coeff: float = _doc("Weight of the entropy bonus.", 0.0)
    use_kl_loss: bool = _doc("Add a KL penalty to the reference model.", False)
    kl_loss_coef: float = _doc("Weight of the KL penalty when use_kl_loss is on.", 0.001)
    grad_clip: float = _doc("Clip gradients to this global norm.", 1.0)

    def __post_init__(self) -> None:
        _check(self.ppo_epochs >= 1, "actor_rollout_ref.actor.ppo_epochs", "must be at least 1.")
        _check(0 < self.clip_ratio < 1, "actor_rollout_ref.actor.clip_ratio", "must be between 0 and 1.")
        _check(self.kl_loss_coef >= 0, "actor_rollout_ref.actor.kl_loss_coef", "must not be negative.")


@dataclass(frozen=True)
class ValKwargsConfig:
    temperature: float = _doc("Validation sampling temperature (used when do_sample is true).", 0.0)
    top_p: float = _doc("Validation nucleus sampling threshold (used when do_sample is true).", 1.0)
    n: int = _doc("Episodes per validation task; pass@n is reported beside pass@1.", 1)
    do_sample: bool = _doc("Sample during validation; false decodes greedily (verl's default).", False)

    def __post_init__(self) -> None:
        key = "actor_rollout_ref.rollout.val_kwargs"
        _check(self.n >= 1, f"{key}.n", "must be at least 1.")
        _check(0 < self.top_p <= 1, f"{key}.top_p", "must be in (0, 1].")
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
    name: str = _doc("Rollout engine of verl: vllm or sglang (ignored by trl).", "vllm")
    gpu_memory_utilization: float = _doc("Share of GPU memory the rollout engine may take (verl).", 0.5)
    tensor_model_parallel_size: int = _doc("Tensor-parallel size of the rollout engine (verl).", 1)
    val_kwargs: ValKwargsConfig = _doc("Sampling when scoring the test dataset (verl's names).", factory=ValKwargsConfig)

    def __post_init__(self) -> None:
        _check(self.n >= 1, "actor_rollout_ref.rollout.n", "must be at least 1 (2 or more for GRPO).")
        _check(self.temperature > 0, "actor_rollout_ref.rollout.temperature", "must be greater than 0.")
        _check(0 < self.top_p <= 1, "actor_rollout_ref.rollout.top_p", "must be in (0, 1].")


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    model: ModelConfig = _doc("The policy model.", factory=ModelConfig)
    actor: ActorConfig = _doc("The policy update.", factory=ActorConfig)
    rollout: RolloutConfig = _doc("Sampling.", factory=RolloutConfig)


@dataclass(frozen=True)
class FilterGroupsConfig:
    enable: bool = _doc("Drop groups whose rewards are all equal (they carry no signal).", False)


ADV_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus")


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = _doc("Advantage estimator: grpo, rloo or reinforce_plus_plus.", "grpo")
    norm_adv_by_std_in_grpo: bool = _doc("Divide GRPO advantages by the group's reward std.", True)
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
        "Score the test dataset every N steps and after the last (-1 or 0: never); metrics val/<data_source>/...", -1
    )
    val_before_train: bool = _doc("Score the test dataset before the first step (when there is one).", True)
    log_freq: int = _doc("Report metrics every N steps.", 1)
    resume_mode: str = _doc("auto (resume from the latest checkpoint if any) or disable.", "auto")
    project_name: str = _doc("Project name, for grouping runs.", "agent-trainer")
    experiment_name: str = _doc("Run name.", "run")
    logger: list[str] = _doc("Metric sinks: console, jsonl.", factory=lambda: ["console", "jsonl"])
    default_local_dir: str | None = _doc("Checkpoint directory; None puts them under the run path.", None)
    seed: int = _doc("Random seed.", 42)
    nnodes: int = _doc("Machines in the job (verl).", 1)
    n_gpus_per_node: int = _doc("GPUs per machine (verl).", 1)
    device: str = _doc("auto, cpu or cuda.", "auto")
    ray_address: str | None = _doc("Join this Ray cluster (verl); None starts a local one.", None)
    max_checkpoints: int = _doc("Keep at most this many checkpoints (0: keep all).", 2)
    python: str | None = _doc(
        "Interpreter of the training process, for backends that train in an environment of their own "
        "(swift); None: the backend's default.",
        None,
    )
    cpu_threads: int = _doc(
        "Torch threads when training on the CPU; 0 keeps torch's default. Tiny models on a few "
        "shared cores run several times faster with 1.",
        0,
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
        _check(self.resume_mode in ("auto", "disable"), "trainer.resume_mode", "must be 'auto' or 'disable'.")
        _check(self.device in ("auto", "cpu", "cuda"), "trainer.device", "must be auto, cpu or cuda.")
        _check(self.cpu_threads >= 0, "trainer.cpu_threads", "must be 0 (torch's default) or more.")
        _check(
            0 <= self.max_episode_error_rate <= 1,
            "trainer.max_episode_error_rate",
            f"must be between 0 (no errors allowed) and 1 (never fail), got {self.max_episode_error_rate}.",
        )
        unknown = [name for name in self.logger if name not in ("console", "jsonl")]
        _check(not unknown, "trainer.logger", f"unknown sink(s) {unknown}; choose from console, jsonl.")


@dataclass(frozen=True)
class AgentLoopConfig:
    max_steps: int = _doc("Most turns per episode; then it ends with max_turns.", 5)
    max_tokens_per_turn: int = _doc("Most tokens the model may write in one turn.", 64)
    trajectory_timeout: float = _doc("Seconds an episode may take; then it ends with timeout.", 60.0)
    retries: int = _doc("Retries of an episode that raised, before it counts as an error.", 0)
    n_parallel_tasks: int = _doc("Episodes run concurrently.", 128)

    def __post_init__(self) -> None:
        _check(self.max_steps >= 1, "rllm.agent.max_steps", "must be at least 1.")
        _check(self.max_tokens_per_turn >= 1, "rllm.agent.max_tokens_per_turn", "must be at least 1.")
        _check(self.trajectory_timeout > 0, "rllm.agent.trajectory_timeout", "must be greater than 0 seconds.")
        _check(self.retries >= 0, "rllm.agent.retries", "must not be negative.")
        _check(self.n_parallel_tasks >= 1, "rllm.agent.n_parallel_tasks", "must be at least 1.")


@dataclass(frozen=True)
class RllmConfig:
    agent: AgentLoopConfig = _doc("The agent loop.", factory=AgentLoopConfig)


REMOTE_LOSSES = ("importance_sampling", "ppo")


@dataclass(frozen=True)
class RemoteConfig:
    base_url: str | None = _doc(
        "URL of the remote training service (tinker, fireworks); None: the SDK's default "
        "(TINKER_BASE_URL or Tinker's service; https://api.fireworks.ai).",
        None,
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
    poll_interval_s: float = _doc("Seconds between readiness polls of remote jobs and deployments.", 5.0)
    ready_timeout_s: float = _doc("Seconds a remote trainer job or deployment may take to become ready.", 1800.0)

    def __post_init__(self) -> None:
        _check(self.loss_fn in REMOTE_LOSSES, "remote.loss_fn", f"must be one of {', '.join(REMOTE_LOSSES)}, not {self.loss_fn!r}.")
        _check(0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1, "remote.adam_beta1", "betas must be in [0, 1).")
        _check(self.adam_eps > 0, "remote.adam_eps", "must be greater than 0.")
        _check(self.poll_interval_s > 0, "remote.poll_interval_s", "must be greater than 0 seconds.")
        _check(self.ready_timeout_s > 0, "remote.ready_timeout_s", "must be greater than 0 seconds.")


@dataclass(frozen=True)
class Config:
    """The whole training configuration. Build it with ``Config.build(overrides)``."""

    data: DataConfig = _doc("Data.", factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = _doc("Model, update and sampling.", factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = _doc("Advantages.", factory=AlgorithmConfig)
    trainer: TrainerConfig = _doc("The training loop.", factory=TrainerConfig)
    rllm: RllmConfig = _doc("Agent-loop settings (rLLM's names).", factory=RllmConfig)
    remote: RemoteConfig = _doc("Remote training services (tinker, fireworks).", factory=RemoteConfig)

    def __post_init__(self) -> None:
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
        for layer in (base, overrides):
            flat = parse_overrides(layer)
            if any("." not in key for key in flat):
                from training.trl_names import translate_trl_names

                flat = translate_trl_names(flat, merged, trl_origin)
            for key, value in flat.items():
                _set_dotted(merged, key, value)
        try:
            return from_dict(cls, merged, prefix="")
        except ConfigError as exc:
            if exc.key in trl_origin:
                raise ConfigError(trl_origin[exc.key], f"{exc.message} (TRL's {trl_origin[exc.key]} sets {exc.key})") from exc
            raise

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


def valid_keys(cls: type = Config, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every dotted key of the configuration, with its dataclass field (for docs and suggestions)."""
    keys: dict[str, dataclasses.Field] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            keys.update(valid_keys(hints[f.name], key + "."))
        else:
            keys[key] = f
    return keys


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
    raise ConfigError("config", f"expected a dict, a list of 'key=value' strings or a YAML path, got {type(overrides).__name__}.")


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
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise _unknown_key(prefix + key)
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


def _unknown_key(key: str) -> ConfigError:
    keys = list(valid_keys())
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not close:  # a wrong section with a right leaf: compare the last part only
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
        close = by_leaf[:1] or difflib.get_close_matches(key, keys, n=1, cutoff=0.4)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return ConfigError(key, f"unknown config key.{hint}")


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
            raise _unknown_key(dotted)
        node = child
    if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
        raise ConfigError(dotted, "is a section; set one of its keys instead.")
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        for sub_key, sub_value in flatten(value).items():
            _set_dotted(node[parts[-1]], sub_key, sub_value)
        return
    node[parts[-1]] = value
