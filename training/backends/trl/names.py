"""TRL's ``GRPOConfig`` names in a training config, mapped onto this trainer's keys.

A config dict written for TRL (``{"learning_rate": 1e-5, "num_generations": 4, ...}``, as AWorld's
TRL trainer takes it) works here: each name is translated to our key, and the translation is
logged. A GRPOConfig name that cannot be honoured is refused, named, with why; one set to TRL's own
default asks for nothing and is accepted. Keys without a dot are TRL's (ours all have one).

Batch sizes follow TRL's arithmetic: an optimizer step sees ``per_device_train_batch_size x
gradient_accumulation_steps`` completions and a generation round ``per_device_train_batch_size x
steps_per_generation`` (default: ``gradient_accumulation_steps``), in groups of ``num_generations``
completions per prompt. So ``data.train_batch_size`` (prompts per round) is the round's completions
divided by ``num_generations``, and ``actor_rollout_ref.actor.ppo_mini_batch_size`` the step's.
"""

from __future__ import annotations

import dataclasses
import difflib
from functools import lru_cache
from typing import Any

from training.config import Config, unknown_key
from training.config.names import register_undotted_names
from training.errors import ConfigError
from training.log import logger
from training.utils import is_trl_available

# verl's actor.loss_agg_mode -> TRL's loss_type (the same aggregation of token losses).
TRL_LOSS_TYPES = {
    "token-mean": "dapo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum": "luspo",
    "seq-mean-token-sum-norm": "dr_grpo",
}
# verl's actor.policy_loss.loss_mode -> TRL's importance_sampling_level.
TRL_IMPORTANCE_SAMPLING = {"vanilla": "token", "gspo": "sequence"}

# TRL name -> our key, the value carried over as it is.
DIRECT = {
    "learning_rate": "actor_rollout_ref.actor.optim.lr",
    "weight_decay": "actor_rollout_ref.actor.optim.weight_decay",
    "warmup_steps": "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "lr_scheduler_type": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "max_grad_norm": "actor_rollout_ref.actor.grad_clip",
    "epsilon": "actor_rollout_ref.actor.clip_ratio",
    "epsilon_high": "actor_rollout_ref.actor.clip_ratio_high",
    "num_iterations": "actor_rollout_ref.actor.ppo_epochs",
    "gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing",
    "entropy_coef": "actor_rollout_ref.actor.entropy_coeff",
    "num_generations": "actor_rollout_ref.rollout.n",
    "temperature": "actor_rollout_ref.rollout.temperature",
    "top_p": "actor_rollout_ref.rollout.top_p",
    "top_k": "actor_rollout_ref.rollout.top_k",
    "num_generations_eval": "actor_rollout_ref.rollout.val_kwargs.n",
    "max_completion_length": "data.max_response_length",
    "max_prompt_length": "data.max_prompt_length",  # older TRL releases
    "shuffle_dataset": "data.shuffle",
    "max_steps": "trainer.total_training_steps",
    "num_train_epochs": "trainer.total_epochs",
    "logging_steps": "trainer.log_freq",
    "seed": "trainer.seed",
    "run_name": "trainer.experiment_name",
    # AWorld's TRL config names the model 'model' (where a platform pins the model, the built
    # config is checked against its value, whatever name set it).
    "model": "actor_rollout_ref.model.path",
}
BATCH_NAMES = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size")
# Names handled below with a rule of their own: what each sets.
_BATCHES = "data.train_batch_size and actor_rollout_ref.actor.ppo_mini_batch_size (TRL's batch arithmetic, above)"
SPECIAL = {
    "beta": "actor_rollout_ref.actor.kl_loss_coef, and actor_rollout_ref.actor.use_kl_loss when above 0",
    "scale_rewards": "algorithm.norm_adv_by_std_in_grpo ('group': true, 'none': false)",
    "save_strategy": "trainer.save_freq ('no': -1; 'steps': save_steps)",
    "save_steps": "trainer.save_freq",
    "save_total_limit": "trainer.max_checkpoints",
    "eval_strategy": "trainer.test_freq ('steps': eval_steps, else logging_steps)",
    "eval_steps": "trainer.test_freq",
    "use_cpu": "trainer.device=cpu",
    "report_to": "trainer.logger (wandb, tensorboard, mlflow, swanlab)",
    "loss_type": "actor_rollout_ref.actor.loss_agg_mode",
    "importance_sampling_level": "actor_rollout_ref.actor.policy_loss.loss_mode",
    **dict.fromkeys(BATCH_NAMES, _BATCHES),
}
# Names with no bearing on what is trained (this trainer sets them itself).
NO_EFFECT = {"remove_unused_columns", "disable_tqdm", "dataloader_num_workers", "logging_dir", "overwrite_output_dir",
             "log_completions", "num_completions_to_print", "logging_first_step"}
NO_EFFECT_WHY = "TRL's own logging, data loading and output folder, which this trainer sets itself"
# Names refused whatever their value, with what to do instead.
REFUSED_ALWAYS = {
    "output_dir": "the run writes under run_path (checkpoints in <run_path>/checkpoints); give run_path (a config "
                  "dict's output_dir becomes the run path when run_path is not given), or set trainer.default_local_dir "
                  "for the checkpoints",
    "trust_remote_code": "set actor_rollout_ref.model.trust_remote_code instead",
    "reward_model": "reward models are not supported; give reward_func",
}
# Why some values cannot be honoured (other names get a generic reason).
REASONS = {
    "fp16": "mixed precision is not available on the trl backend; actor_rollout_ref.model.dtype=float16 loads the weights in half precision",
    "bf16": "mixed precision is not available on the trl backend; actor_rollout_ref.model.dtype=bfloat16 loads the weights in bfloat16",
    "use_vllm": "generation with vLLM belongs to the verl backend; choose backend=verl",
    "warmup_ratio": "give warmup_steps instead",
}


@lru_cache(maxsize=1)
def grpo_defaults() -> dict[str, Any]:
    """Every GRPOConfig field with its default (empty when TRL is not installed)."""
    if not is_trl_available():
        return {}
    from trl import GRPOConfig

    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def translate_trl_names(
    flat: dict[str, Any], current: dict[str, Any], origin: dict[str, str], ignored: dict[str, tuple[Any, str]],
) -> dict[str, Any]:
    """``flat`` with every TRL name replaced by our keys. ``current`` is the nested config so far
    (for ``num_generations`` when a layer sets batch sizes alone); ``origin`` collects our key ->
    TRL name, so errors can name what the user wrote; ``ignored`` the names without effect here, with
    why. Raises ConfigError for what cannot be honoured."""
    sections = {f.name for f in dataclasses.fields(Config)}  # a whole section given as {} or a value
    names = {key: value for key, value in flat.items() if "." not in key and key not in sections}
    out = {key: value for key, value in flat.items() if key not in names}
    defaults = grpo_defaults()
    mapped: dict[str, tuple[str, Any]] = {}  # our key -> (TRL name, value)

    def put(trl_name: str, key: str, value: Any) -> None:
        mapped[key] = (trl_name, value)

    for name, value in names.items():
        if name in DIRECT:
            put(name, DIRECT[name], value)
        elif name in REFUSED_ALWAYS:
            raise ConfigError(name, f"{name} cannot be used here: {REFUSED_ALWAYS[name]}.")
        elif name in NO_EFFECT:
            logger.warning("config: TRL's %s=%r has no effect here (%s); recorded under ignored_keys", name, value, NO_EFFECT_WHY)
            ignored[name] = (value, NO_EFFECT_WHY)
        elif name in SPECIAL:
            continue
        elif name in defaults:
            if _same(value, defaults[name]):
                logger.info("config: TRL's %s=%r is TRL's default; nothing to set", name, value)
                continue
            reason = REASONS.get(name, "this trainer has no equivalent; remove it")
            raise ConfigError(name, f"TRL's GRPOConfig option {name}={value!r} cannot be honoured: {reason}.")
        else:
            raise _unknown(name, defaults)

    if "beta" in names:
        beta = names["beta"]
        put("beta", "actor_rollout_ref.actor.kl_loss_coef", beta)
        put("beta", "actor_rollout_ref.actor.use_kl_loss", isinstance(beta, (int, float)) and beta > 0)
    if "scale_rewards" in names:
        scale = names["scale_rewards"]
        if scale not in (True, False, "group", "none"):
            raise ConfigError("scale_rewards", f"{scale!r} cannot be honoured: use 'group' (divide by the group's std) or 'none'.")
        put("scale_rewards", "algorithm.norm_adv_by_std_in_grpo", scale in (True, "group"))
    _saving(names, put)
    _evaluation(names, put)
    if names.get("use_cpu") is True:
        put("use_cpu", "trainer.device", "cpu")
    _loss(names, put)
    if names.get("report_to", "none") not in ("none", [], ["none"], None):
        report_to = names["report_to"]
        tools = [report_to] if isinstance(report_to, str) else list(report_to)
        refused = [tool for tool in tools if tool not in ("wandb", "tensorboard", "mlflow", "swanlab")]
        if refused:
            raise ConfigError("report_to", f"{refused} cannot be honoured: trainer.logger takes wandb, tensorboard, mlflow and swanlab.")
        put("report_to", "trainer.logger", list(dict.fromkeys([*current["trainer"]["logger"], *tools])))
    if any(name in names for name in BATCH_NAMES):
        _batch_sizes(names, current, defaults, put)

    for key, (trl_name, value) in mapped.items():
        logger.info("config: TRL's %s=%r -> %s=%r", trl_name, names.get(trl_name), key, value)
        origin[key] = trl_name
        out[key] = value
    return out


def _same(value: Any, default: Any) -> bool:
    """Whether ``value`` asks for what TRL's default does (a None default means off or automatic,
    which False or 0 also ask for: ``bf16=False`` needs nothing)."""
    if default is None and value in (False, 0):
        return True
    try:
        return bool(value == default)
    except Exception:  # an odd value that cannot be compared is not the default
        return False


def _saving(names: dict[str, Any], put: Any) -> None:
    strategy = names.get("save_strategy")
    if strategy not in (None, "no", "steps"):
        raise ConfigError("save_strategy", f"{strategy!r} cannot be honoured: use 'steps' (with save_steps) or 'no'.")
    if strategy == "no":
        put("save_strategy", "trainer.save_freq", -1)
    elif "save_steps" in names or strategy == "steps":
        put("save_steps" if "save_steps" in names else "save_strategy", "trainer.save_freq", names.get("save_steps", 500))
    if "save_total_limit" in names:
        put("save_total_limit", "trainer.max_checkpoints", names["save_total_limit"] or 0)


def _loss(names: dict[str, Any], put: Any) -> None:
    """TRL's loss_type and importance_sampling_level as verl's loss keys (the trl backend maps them back)."""
    if "loss_type" in names:
        modes = {trl: verl for verl, trl in TRL_LOSS_TYPES.items()}
        if names["loss_type"] not in modes:
            raise ConfigError(
                "loss_type", f"{names['loss_type']!r} cannot be honoured: use one of {', '.join(modes)} "
                "(verl's actor_rollout_ref.actor.loss_agg_mode), or the verl backend's policy_loss.loss_mode.",
            )
        put("loss_type", "actor_rollout_ref.actor.loss_agg_mode", modes[names["loss_type"]])
    if "importance_sampling_level" in names:
        levels = {trl: verl for verl, trl in TRL_IMPORTANCE_SAMPLING.items()}
        if names["importance_sampling_level"] not in levels:
            raise ConfigError("importance_sampling_level", f"{names['importance_sampling_level']!r} cannot be honoured: use 'token' or 'sequence'.")
        put("importance_sampling_level", "actor_rollout_ref.actor.policy_loss.loss_mode", levels[names["importance_sampling_level"]])


def _evaluation(names: dict[str, Any], put: Any) -> None:
    strategy = names.get("eval_strategy", "no")
    if strategy not in ("no", "steps"):
        raise ConfigError("eval_strategy", f"{strategy!r} cannot be honoured: use 'steps' (with eval_steps) or 'no'.")
    if strategy == "steps":
        every = names.get("eval_steps") or names.get("logging_steps") or 10  # TRL's fallback: logging_steps
        put("eval_steps" if names.get("eval_steps") else "eval_strategy", "trainer.test_freq", every)


def _batch_sizes(names: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any], put: Any) -> None:
    """Prompts per generation round and per optimizer step, from TRL's completion counts."""
    generations = names.get("num_generations", current["actor_rollout_ref"]["rollout"]["n"])
    per_device = names.get("per_device_train_batch_size", defaults.get("per_device_train_batch_size", 8))
    accumulation = names.get("gradient_accumulation_steps", 1)
    if names.get("generation_batch_size") is not None:
        if names.get("steps_per_generation") is not None:
            raise ConfigError("generation_batch_size", "give generation_batch_size or steps_per_generation, not both (as in TRL).")
        round_size = names["generation_batch_size"]
    else:
        round_size = per_device * (names.get("steps_per_generation") or accumulation)
    step_size = per_device * accumulation
    for value, what in ((generations, "num_generations"), (per_device, "per_device_train_batch_size"), (accumulation, "gradient_accumulation_steps")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(what, f"must be a whole number of at least 1, got {value!r}.")
    for size, what in ((step_size, "per_device_train_batch_size x gradient_accumulation_steps"), (round_size, "the generation batch")):
        if size % generations:
            raise ConfigError(
                "per_device_train_batch_size",
                f"{what} = {size} completions must be a multiple of num_generations ({generations}), as in TRL: "
                f"each prompt's completions form one group.",
            )
    prompts, mini = round_size // generations, step_size // generations
    source = next(name for name in BATCH_NAMES if name in names)
    put(source, "data.train_batch_size", prompts)
    put(source, "actor_rollout_ref.actor.ppo_mini_batch_size", None if mini == prompts else mini)


def _unknown(name: str, defaults: dict[str, Any]):
    """A near-miss of a TRL name is pointed to it; anything else gets our keys' suggestion."""
    known = sorted({*DIRECT, *SPECIAL, *REFUSED_ALWAYS, *defaults})
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if close:
        return ConfigError(name, f"unknown config key. Did you mean '{close[0]}' (TRL's GRPOConfig name)?")
    return unknown_key(name)


register_undotted_names(translate_trl_names)
