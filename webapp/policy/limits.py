"""What one person may ask of the platform's machines in one run: an upper bound on every numeric
config key, and size limits on what a form or the API accepts (overrides, names, notes, tags).

Every logged-in person is untrusted, so no single number may exhaust a worker
(``data.train_batch_size=1e9``) and no short text may exhaust the web process (a YAML alias bomb).
Everything here is checked before a run is queued; the run form and the API call it.

The bounds hold for every backend unless an administrator raises (or lowers) one in that
backend's ``config_limits`` (registry admin): ``{"trainer.total_training_steps": 1000000}``.
``docs/security.md`` lists them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from training.config import UNIFIED_NAMES, UNIFIED_SECTIONS, Config, flatten, to_dict, valid_keys

from training.errors import ConfigError
from training.backends.trl.names import DIRECT as TRL_NAMES
from training.backends.trl.names import translate_trl_names

# Sizes of what a person types. Overrides are short in practice (a few dozen keys).
MAX_OVERRIDES_CHARS = 20_000
MAX_OVERRIDE_KEYS = 200
MAX_KEY_CHARS = 200
MAX_NAME_CHARS = 200
MAX_NOTES_CHARS = 10_000
MAX_TAGS = 50
MAX_TAG_CHARS = 100
# An error message shown back (it may quote what was typed).
MAX_ERROR_CHARS = 1_000
# The config nests five levels deep; lists in values add one or two.
MAX_YAML_DEPTH = 16
MAX_YAML_NODES = 5_000

# The platform's upper bound of each numeric config key (``training.config``). A value above it is
# refused naming the key and the bound. Chosen so that one run fits one worker: a GPU node of
# 8 devices, a few days of steps, sequences of 32k tokens.
# Keys whose null means "no limit" in the library (rLLM's default): a bound must be a number here.
NULL_IS_UNBOUNDED = {"rllm.agent.trajectory_timeout"}
PLATFORM_LIMITS: dict[str, float] = {
    "data.train_batch_size": 1024,
    "data.val_batch_size": 4096,
    "data.max_prompt_length": 32_768,
    "data.max_response_length": 32_768,
    "actor_rollout_ref.model.tiny_layers": 16,
    "actor_rollout_ref.model.tiny_hidden_size": 1024,
    "actor_rollout_ref.model.lora_rank": 512,
    "actor_rollout_ref.model.lora_alpha": 1024,
    "actor_rollout_ref.actor.optim.lr": 1,
    "actor_rollout_ref.actor.optim.weight_decay": 1,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 100_000,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 1024,
    "actor_rollout_ref.actor.ppo_epochs": 16,
    "actor_rollout_ref.actor.clip_ratio": 1,
    "actor_rollout_ref.actor.clip_ratio_low": 1,
    "actor_rollout_ref.actor.clip_ratio_high": 10,
    "actor_rollout_ref.actor.entropy_coeff": 10,
    "actor_rollout_ref.actor.kl_loss_coef": 100,
    "actor_rollout_ref.actor.grad_clip": 1_000_000,
    "actor_rollout_ref.rollout.n": 64,
    "actor_rollout_ref.rollout.temperature": 10,
    "actor_rollout_ref.rollout.top_p": 1,
    "actor_rollout_ref.rollout.top_k": 262_144,  # a vocabulary's size at most
    "actor_rollout_ref.rollout.gpu_memory_utilization": 1,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 8,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 10,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 1,
    "actor_rollout_ref.rollout.val_kwargs.top_k": 262_144,
    "actor_rollout_ref.rollout.val_kwargs.n": 64,
    "algorithm.gamma": 1,
    "reward_model.overlong_buffer.len": 32_768,
    "reward_model.overlong_buffer.penalty_factor": 100,
    "trainer.total_training_steps": 100_000,
    "trainer.total_epochs": 100_000,
    "trainer.save_freq": 100_000,
    "trainer.test_freq": 100_000,
    "trainer.log_freq": 100_000,
    "trainer.seed": 2**32 - 1,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.max_checkpoints": 20,
    "trainer.keep_best_checkpoints": 20,
    "trainer.cpu_threads": 16,
    "trainer.max_episode_error_rate": 1,
    "trainer.log_episodes_fraction": 1,
    "trainer.log_episodes_per_step": 1_000_000,
    "trainer.system_metrics_interval": 3600,
    "rllm.agent.max_steps": 100,
    "rllm.agent.max_tokens_per_turn": 32_768,
    "rllm.agent.trajectory_timeout": 3_600,
    "rllm.agent.retries": 5,
    "rllm.agent.n_parallel_tasks": 256,
    "rllm.workflow.n_parallel_tasks": 256,
    "rllm.workflow.retry_limit": 6,
    "rllm.rejection_sample.multiplier": 8,
    "rllm.sdk.proxy.port": 65_535,
    "remote.adam_beta1": 1,
    "remote.adam_beta2": 1,
    "remote.adam_eps": 1,
    "remote.poll_interval_s": 600,
    "remote.ready_timeout_s": 7_200,
}


def numeric_keys() -> list[str]:
    """Every config key whose value is a number (int or float, optional or not)."""
    return [key for key, field in valid_keys().items()
            if {"int", "float"} & set(str(field.type).replace(" ", "").split("|"))]


def limits_for(backend) -> dict[str, float]:
    """The platform's bounds with ``backend``'s ``config_limits`` over them."""
    return {**PLATFORM_LIMITS, **(getattr(backend, "config_limits", None) or {})}


def check_limit_table(value: Any) -> None:
    """A backend's ``config_limits``: known numeric keys mapped to finite numbers."""
    if not isinstance(value, dict):
        raise ValidationError('Must be a JSON object of config keys to upper bounds, e.g. {"data.train_batch_size": 4096}.')
    known = PLATFORM_LIMITS
    for key, bound in value.items():
        if key not in known:
            raise ValidationError(f"{capped(key, 100)!r} is not a bounded config key; known: {', '.join(sorted(known))}.")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
            raise ValidationError(f"{key}: the bound must be a finite number, not {capped(repr(bound), 100)}.")


def check_overrides_text(text: str) -> None:
    """Refuse overrides text that would cost the parser more than its size: YAML anchors and
    aliases (a few hundred bytes of them expand to gigabytes), deep nesting, too many nodes.

    Each ``key=value`` line's value is parsed as YAML on its own, so it is checked on its own too."""
    if len(text) > MAX_OVERRIDES_CHARS:
        raise ValidationError(f"Overrides are at most {MAX_OVERRIDES_CHARS} characters (got {len(text)}).")
    chunks = [text] + [line.partition("=")[2] for line in text.splitlines() if "=" in line]
    for chunk in chunks:
        _check_yaml_events(chunk)


def _check_yaml_events(chunk: str) -> None:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = nodes = 0
    try:
        for event in yaml.parse(chunk, Loader=loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ValidationError(
                    "YAML anchors and aliases (&name, *name) are not accepted in overrides; write each value out."
                )
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ValidationError(f"Overrides nest at most {MAX_YAML_DEPTH} levels deep.")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            nodes += 1
            if nodes > MAX_YAML_NODES:
                raise ValidationError(f"Overrides hold at most {MAX_YAML_NODES} YAML nodes.")
    except yaml.YAMLError:
        return  # malformed: the parser proper says where


def check_json_overrides(value: dict) -> None:
    """The API's overrides (already parsed JSON): the same size limit as the form's text."""

    size = len(json.dumps(value))
    if size > MAX_OVERRIDES_CHARS:
        raise ValidationError(f"Overrides are at most {MAX_OVERRIDES_CHARS} characters of JSON (got {size}).")


def config_leaves(overrides: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Every config key that ``overrides`` set, named as the trainer reads it -> (the key as
    written, the value). What a member's config sets is judged on these, never on the keys as typed.

    A mapping value is the keys under it, flattened with the library's own ``training.config.flatten``
    (``rllm.workflow={"workflow_args": {"f": 1}}`` sets ``rllm.workflow.workflow_args.f``); Hydra's
    ``+`` is dropped; rLLM's unified names are read as the keys they set (``rllm.trainer.python`` is
    ``trainer.python``, ``model.name`` is ``actor_rollout_ref.model.path``), and so are TRL's
    (``model``, as AWorld's TRL configs name the model, is ``actor_rollout_ref.model.path``). A key ``Config.build``
    would refuse as unknown may be named here too: refusing it twice costs nothing."""

    leaves: dict[str, tuple[str, Any]] = {}
    for written, value in overrides.items():
        for leaf, leaf_value in flatten({str(written): value}).items():
            leaves[_as_read(leaf)] = (written, leaf_value)
    return leaves


def _as_read(key: str) -> str:

    key = ".".join(part.strip().lstrip("+") for part in key.split("."))
    if key in UNIFIED_NAMES:
        return UNIFIED_NAMES[key]
    if key in TRL_NAMES:  # TRL's GRPOConfig names, as AWorld's TRL configs write them ('model' is the model's path)
        return TRL_NAMES[key]
    return key.removeprefix("rllm.") if key.startswith(UNIFIED_SECTIONS) else key


def check_config_bounds(overrides: dict[str, Any], backend) -> None:
    """Refuse a run whose overrides set a numeric key above its bound (the backend's, else the
    platform's), or too many or too long keys. Judged on the keys the overrides set
    (``config_leaves``: a section's mapping is its keys); TRL's ``GRPOConfig`` names are checked
    under the keys they set."""
    for key in overrides:
        if len(str(key)) > MAX_KEY_CHARS:
            raise ValidationError(f"Config keys are at most {MAX_KEY_CHARS} characters ({capped(str(key), 60)!r}...).")
    leaves = {key: value for key, (_, value) in config_leaves(overrides).items()}
    if len(leaves) > MAX_OVERRIDE_KEYS:
        raise ValidationError(f"At most {MAX_OVERRIDE_KEYS} override keys (got {len(leaves)}).")
    bounds = limits_for(backend)
    where = f"backend {backend.name}" if backend is not None else "this platform"
    for key, value in _our_keys(leaves).items():
        bound = bounds.get(key)
        if key in NULL_IS_UNBOUNDED and (value is None or str(value).strip().lower() in ("null", "~", "none")):
            raise ValidationError(f"{key}: must be a number on {where} (at most {_format(bound)}); null would mean no limit.")
        number = _as_number(value)
        if bound is None or number is None:
            continue  # not a number: the config's own validation names the type error
        if not math.isfinite(number):
            raise ValidationError(f"{key}: must be a finite number, got {capped(str(value), 40)}.")
        if number > bound:
            raise ValidationError(
                f"{key}: at most {_format(bound)} on {where} (got {capped(str(value), 40)}); "
                "an administrator can raise the bound for a backend."
            )


def capped(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``message`` cut to ``limit`` characters (marked with an ellipsis)."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


def cap_errors(form) -> None:
    """Cut every error message of a bound ``form`` to ``MAX_ERROR_CHARS`` (they may quote input)."""
    for errors in form.errors.values():
        errors.data = [capped(message) for message in errors]


def _our_keys(overrides: dict[str, Any]) -> dict[str, Any]:
    """TRL's names (keys without a dot) translated to ours; ours kept as they are."""
    if all("." in key for key in overrides):
        return overrides

    try:
        return translate_trl_names(dict(overrides), to_dict(Config()), {}, {})
    except (ConfigError, TypeError, ValueError):
        return {key: value for key, value in overrides.items() if "." in key}


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int beyond float range
            return math.inf
    if isinstance(value, str) and len(value) < 400:
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _format(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)
