"""What every backend does with every key the config accepts: the audit behind ``docs/keys.md``.

Each of our keys (``training.config.valid_keys``) has one row here, and each row says for every
built-in backend one of:

- ``applied``: the backend trains with it as documented (a note may name a condition);
- ``mapped``: it reaches the backend's engine under another name or in another form (said where);
- ``no effect``: accepted, and changes nothing on that backend (why); given in a run's config it is
  said at construction (a warning) and recorded under ``ignored_keys`` in the run's ``config.yaml``
  and in ``TrainResult.ignored_keys``;
- ``refused``: a value other than the ones it accepts stops the run at construction, naming the key
  and what to do (``unless``: the accepted values, which ask for nothing; the check here refuses the
  rest, beside the backend's own checks).

Other dialects' names are tabled where they are translated (TRL's GRPOConfig names in
``training.backends.trl.names``, verl's keys in ``training.backends.verl.names``, rLLM's unified names
in ``training.config.schema``, rLLM's tinker and fireworks names in
``training.backends.tinker_protocol``); ``audit_markdown`` gathers them with these rows into one
table. ``python -m training.backends.keys > docs/keys.md`` writes it; a test keeps the two equal and
fails when a key of the schema has no row.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from training.backends.processor import BUILTIN_PROCESSORS
from training.backends.tinker_protocol.rllm_names import (
    RLLM_REMOTE_ALIASES, RLLM_REMOTE_NAMES, RLLM_REMOTE_SECTIONS, RLLM_WARMUP_RATIO, Refuse, Rename, Same,
)
from training.backends.trl.names import DIRECT, NO_EFFECT, NO_EFFECT_WHY, REFUSED_ALWAYS, SPECIAL
from training.backends.verl.names import VERL_FILLED_LATER, VERL_NO_EFFECT
from training.config import UNIFIED_NAMES, UNIFIED_SECTIONS, Config, valid_keys
from training.errors import ConfigError
from training.log import logger

BACKENDS = ("trl", "verl", "swift", "tinker", "fireworks")
REMOTE = ("tinker", "fireworks")
KINDS = ("applied", "mapped", "no_effect", "refused")


@dataclass(frozen=True)
class Effect:
    """What one backend does with one key."""

    kind: str  # one of KINDS
    note: str = ""  # mapped: to what; no_effect, refused: why (and what to do); applied: a condition
    unless: tuple | None = None  # refused: the values accepted (they ask for nothing); None: checked by the backend

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"an effect is one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.kind in ("mapped", "no_effect", "refused") and not self.note:
            raise ValueError(f"a {self.kind} effect says {'to what' if self.kind == 'mapped' else 'why'}")

    def cell(self) -> str:
        """The table cell of docs/keys.md."""
        if self.kind == "refused" and self.unless:
            head = f"refused unless {' or '.join(map(_shown, self.unless))}"
        else:
            head = {"applied": "applied", "mapped": "mapped", "no_effect": "no effect", "refused": "refused"}[self.kind]
        return f"{head}: {self.note}" if self.note else head


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value)


APPLIED = Effect("applied")


# verl's keys naming a run's inputs that AgentTrainer itself reads, before any backend (training.trainer's
# CONFIG_INPUT_KEYS), and the argument each stands for.
READ_BY_THE_TRAINER = {"data.train_files": "train_dataset", "data.val_files": "test_dataset",
                       "custom_reward_function.path": "reward_func", "custom_reward_function.name": "reward_func"}


def applied(note: str = "") -> Effect:
    return Effect("applied", note)


def mapped(to: str) -> Effect:
    return Effect("mapped", to)


def no_effect(why: str) -> Effect:
    return Effect("no_effect", why)


def refused(why: str, unless: tuple | None = None) -> Effect:
    return Effect("refused", why, unless)


def row(default: Effect = APPLIED, *, remote: Effect | None = None, **backends: Effect) -> dict[str, Effect]:
    """One key's effects: ``default`` on every backend but those named (``remote``: tinker and fireworks)."""
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise ValueError(f"no backend named {', '.join(sorted(unknown))}")
    if remote is not None:
        backends = {**dict.fromkeys(REMOTE, remote), **backends}
    return {name: backends.get(name, default) for name in BACKENDS}


# -- reasons shared by several rows ------------------------------------------------------------
NO_TEST_SCORING = no_effect("the swift backend scores no test dataset during training")
VERL_ENGINE = "the verl backend's rollout engine (vLLM or SGLang)"
SERVICE_PLACES = "the service places and sizes the job itself"
ONE_DEVICE = no_effect("the trl backend trains on one device (trainer.device); more GPUs are the verl backend's")
SWIFT_ONE_DEVICE = no_effect("ms-swift trains here on one device in its own process")
REMOTE_ONLY = no_effect("a setting of the remote training services (tinker, fireworks)")
FIREWORKS_ONLY = no_effect("a Fireworks setting (its trainer jobs and deployments); the tinker service has none")
LABEL = no_effect("a label of rLLM's registry: the class given to AgentTrainer is what runs; the label is not used")
NOT_USED_HERE = no_effect("rLLM's setting of what this trainer does anyway: it learns from the sampled tokens themselves")
TINY_ON_SERVICE = no_effect("the service holds the model; model.path=tiny-char lends it only its tokenizer here")
SDK_ENDPOINT = no_effect("the trainer serves its own OpenAI-compatible endpoint for the run (training/sdk)")
ROWS_ONLY = "needs the trainer's own layout of episodes into rows (trl with an agent, tinker, fireworks)"
SWIFT_ROWS = refused(f"ms-swift lays out its own rows; this {ROWS_ONLY}", unless=(False,))
VERL_ROWS = refused(f"verl trains one sequence per episode; this {ROWS_ONLY}")
RECIPE = "cannot be honoured by the {0} backend; remove it or use the verl or trl backend"
ONLY_WITH = "used only with {0}, which this backend refuses"


def _recipe(backend: str, unless: tuple) -> Effect:
    return refused(RECIPE.format(backend), unless=unless)


def _remote_recipe(unless: tuple) -> Effect:
    return refused("the service computes its own loss (remote.loss_fn); remove it or use the verl or trl backend", unless=unless)


KEY_EFFECTS: dict[str, dict[str, Effect]] = {
    # -- data --------------------------------------------------------------------------------
    "data.train_batch_size": row(),
    "data.val_batch_size": row(verl=no_effect("verl scores the whole test dataset"), swift=NO_TEST_SCORING),
    "data.max_prompt_length": row(),
    "data.max_response_length": row(),
    "data.prompt_key": row(),
    "data.answer_key": row(),
    "data.shuffle": row(),
    # -- the model ---------------------------------------------------------------------------
    "actor_rollout_ref.model.path": row(),
    "actor_rollout_ref.model.tokenizer_path": row(swift=refused(
        "ms-swift loads the tokenizer from the model's own directory; leave it unset (or equal to model.path)")),
    "actor_rollout_ref.model.trust_remote_code": row(),
    "actor_rollout_ref.model.dtype": row(
        verl=mapped("verl's actor_rollout_ref.rollout.dtype (and the verl backend's default bfloat16)"),
        swift=mapped("ms-swift's torch_dtype"),
        remote=no_effect("the service holds the weights in its own precision")),
    "actor_rollout_ref.model.enable_gradient_checkpointing": row(
        trl=mapped("TRL's gradient_checkpointing"), swift=mapped("ms-swift's gradient_checkpointing"),
        remote=no_effect("the service trains on its own machines")),
    "actor_rollout_ref.model.tiny_layers": row(applied("with model.path=tiny-char"), remote=TINY_ON_SERVICE),
    "actor_rollout_ref.model.tiny_hidden_size": row(applied("with model.path=tiny-char"), remote=TINY_ON_SERVICE),
    "actor_rollout_ref.model.lora_rank": row(remote=applied("at least 1: the services train LoRA adapters")),
    "actor_rollout_ref.model.lora_alpha": row(remote=refused("the service chooses the adapter's other settings itself; leave it unset")),
    "actor_rollout_ref.model.target_modules": row(
        swift=mapped("ms-swift's target_modules"),
        remote=refused("the service chooses the adapter's layers (remote.lora_train_* choose among them); leave it unset")),
    "actor_rollout_ref.model.exclude_modules": row(
        swift=refused("ms-swift's LoRA takes no list of layers to leave out; name the layers in target_modules"),
        remote=refused("the service chooses the adapter's layers (remote.lora_train_* choose among them); leave it unset")),
    # -- the policy update -------------------------------------------------------------------
    "actor_rollout_ref.actor.optim.lr": row(),
    "actor_rollout_ref.actor.optim.weight_decay": row(),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": row(),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": row(),
    "actor_rollout_ref.actor.ppo_mini_batch_size": row(
        swift=refused("ms-swift takes one optimizer step per generation round here; leave it unset", unless=(None,))),
    "actor_rollout_ref.actor.ppo_epochs": row(swift=mapped("ms-swift's num_iterations")),
    "actor_rollout_ref.actor.clip_ratio": row(
        trl=mapped("TRL's epsilon"), swift=mapped("ms-swift's epsilon"), remote=applied("with remote.loss_fn=ppo")),
    "actor_rollout_ref.actor.clip_ratio_low": row(
        trl=mapped("TRL's epsilon"), swift=_recipe("swift", (None,)),
        remote=refused("taken with remote.loss_fn=ppo; the importance-sampling loss has no clip range")),
    "actor_rollout_ref.actor.clip_ratio_high": row(
        trl=mapped("TRL's epsilon_high"), swift=_recipe("swift", (None,)),
        remote=refused("taken with remote.loss_fn=ppo; the importance-sampling loss has no clip range")),
    "actor_rollout_ref.actor.loss_agg_mode": row(
        trl=mapped("TRL's loss_type (token-mean: dapo, seq-mean-token-mean: grpo, seq-mean-token-sum: luspo, "
                   "seq-mean-token-sum-norm: dr_grpo)"),
        swift=_recipe("swift", ("token-mean",)), remote=_remote_recipe(("token-mean",))),
    "actor_rollout_ref.actor.policy_loss.loss_mode": row(
        trl=mapped("TRL's importance_sampling_level (vanilla: token, gspo: sequence; others refused)"),
        swift=_recipe("swift", ("vanilla",)), remote=_remote_recipe(("vanilla",))),
    "actor_rollout_ref.actor.entropy_coeff": row(
        swift=refused("ms-swift's GRPO loss has no entropy bonus; leave it at 0 or use the trl or verl backend", unless=(0, 0.0)),
        remote=refused("the service's loss has no entropy bonus; leave it at 0 or use the trl or verl backend", unless=(0, 0.0))),
    "actor_rollout_ref.actor.use_kl_loss": row(
        trl=mapped("TRL's beta (kl_loss_coef when on, else 0)"), swift=mapped("ms-swift's beta (kl_loss_coef when on, else 0)"),
        remote=refused("the service's loss has no KL penalty (a LoRA adapter's reference is its frozen base model); "
                       "leave it false or use the trl or verl backend", unless=(False,))),
    "actor_rollout_ref.actor.kl_loss_coef": row(
        trl=mapped("TRL's beta (when use_kl_loss is on)"), swift=mapped("ms-swift's beta (when use_kl_loss is on)"),
        remote=no_effect(ONLY_WITH.format("actor_rollout_ref.actor.use_kl_loss"))),
    "actor_rollout_ref.actor.grad_clip": row(trl=mapped("TRL's max_grad_norm"), swift=mapped("ms-swift's max_grad_norm")),
    # -- sampling ----------------------------------------------------------------------------
    "actor_rollout_ref.rollout.n": row(applied("2 or more (GRPO's group)")),
    "actor_rollout_ref.rollout.temperature": row(),
    "actor_rollout_ref.rollout.top_p": row(),
    "actor_rollout_ref.rollout.top_k": row(remote=refused(
        "the service's sampler is not given a top-k here; leave it at -1 (off) and use top_p")),
    "actor_rollout_ref.rollout.name": row(no_effect(VERL_ENGINE), verl=APPLIED),
    "actor_rollout_ref.rollout.server_url": row(
        no_effect("the trl backend's vLLM server; this backend samples with its own engine"), trl=APPLIED),
    "actor_rollout_ref.rollout.gpu_memory_utilization": row(no_effect(f"the share of GPU memory of {VERL_ENGINE}"), verl=APPLIED),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": row(no_effect(f"the tensor parallelism of {VERL_ENGINE}"), verl=APPLIED),
    "actor_rollout_ref.rollout.val_kwargs.temperature": row(swift=NO_TEST_SCORING),
    "actor_rollout_ref.rollout.val_kwargs.top_p": row(swift=NO_TEST_SCORING),
    "actor_rollout_ref.rollout.val_kwargs.top_k": row(swift=NO_TEST_SCORING, remote=refused(
        "the service's sampler is not given a top-k here; leave it at -1 (off) and use top_p")),
    "actor_rollout_ref.rollout.val_kwargs.n": row(swift=NO_TEST_SCORING),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": row(swift=NO_TEST_SCORING),
    # -- advantages and reward shaping ---------------------------------------------------------
    "algorithm.adv_estimator": row(
        applied("the estimators the backend can feed (others refused, naming what they need)"),
        swift=refused("ms-swift computes GRPO advantages itself; use the trl or verl backend", unless=("grpo",))),
    "algorithm.norm_adv_by_std_in_grpo": row(swift=mapped("ms-swift's scale_rewards (group / none)")),
    "algorithm.gamma": row(swift=no_effect("the discount of REINFORCE-style estimators; ms-swift computes GRPO advantages")),
    "algorithm.filter_groups.enable": row(swift=refused(
        "ms-swift trains every group it generates; set it to false or use the trl or verl backend", unless=(False,))),
    "reward_model.overlong_buffer.enable": row(swift=_recipe("swift", (False,))),
    "reward_model.overlong_buffer.len": row(swift=no_effect(ONLY_WITH.format("reward_model.overlong_buffer.enable"))),
    "reward_model.overlong_buffer.penalty_factor": row(swift=no_effect(ONLY_WITH.format("reward_model.overlong_buffer.enable"))),
    # -- the training loop ---------------------------------------------------------------------
    "trainer.total_training_steps": row(),
    "trainer.total_epochs": row(
        swift=no_effect("ms-swift's run is bounded by trainer.total_training_steps (its max_steps)"),
        remote=no_effect("the run is bounded by trainer.total_training_steps; the tasks are drawn again as needed")),
    "trainer.save_freq": row(),
    "trainer.test_freq": row(swift=refused(
        "the swift backend does not score a test dataset during training; set it to -1, or use the trl or verl backend",
        unless=(-1, 0))),
    "trainer.val_before_train": row(swift=NO_TEST_SCORING),
    "trainer.log_freq": row(verl=no_effect("verl reports every step")),
    "trainer.resume_mode": row(),
    "trainer.project_name": row(),
    "trainer.experiment_name": row(),
    "trainer.logger": row(verl=mapped("verl's trainer.logger: its file logger (read into the run's sinks) and the trackers named")),
    "trainer.wandb_dir": row(),
    "trainer.wandb_entity": row(),
    "trainer.tensorboard_dir": row(),
    "trainer.mlflow_tracking_uri": row(),
    "trainer.system_metrics_interval": row(),
    "trainer.default_local_dir": row(),
    "trainer.seed": row(),
    "trainer.nnodes": row(
        refused("this backend runs on one machine; leave it at 1 or use the verl backend", unless=(1,)), verl=APPLIED,
        remote=refused(f"{SERVICE_PLACES}; leave it at 1", unless=(1,))),
    "trainer.n_gpus_per_node": row(trl=ONE_DEVICE, verl=APPLIED, swift=SWIFT_ONE_DEVICE, remote=no_effect(SERVICE_PLACES)),
    "trainer.device": row(
        verl=no_effect("verl trains on CUDA GPUs"), swift=no_effect("ms-swift chooses the device"),
        remote=no_effect("the model lives on the service")),
    "trainer.ray_address": row(no_effect("the Ray cluster of the verl backend"), verl=APPLIED),
    "trainer.python": row(no_effect("the interpreter of the swift backend's training process"), swift=APPLIED),
    "trainer.cpu_threads": row(verl=no_effect("verl's Ray workers set their own threads")),
    "trainer.max_checkpoints": row(),
    "trainer.metric_for_best_model": row(
        refused("the best checkpoints by a metric are kept on the trl backend only; remove it or use the trl backend",
                unless=(None,)),
        trl=applied("the checkpoints it keeps survive trainer.max_checkpoints' rotation of the published ones")),
    "trainer.greater_is_better": row(no_effect(ONLY_WITH.format("trainer.metric_for_best_model")), trl=APPLIED),
    "trainer.keep_best_checkpoints": row(no_effect(ONLY_WITH.format("trainer.metric_for_best_model")), trl=APPLIED),
    "trainer.max_episode_error_rate": row(),
    **{key: row(no_effect("the episode store is filled by the trl backend today; this backend sends its sample episodes only"),
                trl=APPLIED)
       for key in ("trainer.log_episodes", "trainer.log_episodes_fraction", "trainer.log_episodes_per_step")},
    # -- the agent loop (rLLM's names) ---------------------------------------------------------
    "rllm.agent.name": row(LABEL),
    "rllm.agent.max_steps": row(),
    "rllm.agent.max_tokens_per_turn": row(),
    "rllm.agent.trajectory_timeout": row(),
    "rllm.agent.retries": row(swift=applied("refused above 0 with an agent and environment: ms-swift's rollout does not retry")),
    "rllm.agent.n_parallel_tasks": row(
        verl=no_effect("verl's agent-loop workers set how many episodes run at once"),
        swift=no_effect("ms-swift's rollout sets how many episodes run at once")),
    "rllm.agent.overlong_filter": row(verl=VERL_ROWS, swift=refused(
        "ms-swift trains every episode it generates; set it to false, or use the trl backend", unless=(False,))),
    "rllm.agent.agent_args": row(),
    "rllm.agent.engine_args": row(applied("only retry_limit (others refused)")),
    "rllm.env.name": row(LABEL),
    "rllm.env.env_args": row(),
    "rllm.workflow.use_workflow": row(applied("checked against what was given")),
    "rllm.workflow.name": row(LABEL),
    "rllm.workflow.workflow_args": row(),
    "rllm.workflow.n_parallel_tasks": row(
        verl=no_effect("verl's agent-loop workers set how many episodes run at once"),
        swift=no_effect("ms-swift's rollout sets how many episodes run at once")),
    "rllm.workflow.retry_limit": row(),
    "rllm.stepwise_advantage.enable": row(verl=VERL_ROWS, swift=SWIFT_ROWS),
    **{f"rllm.stepwise_advantage.{name}": row(
        verl=no_effect(ONLY_WITH.format("rllm.stepwise_advantage.enable")),
        swift=no_effect(ONLY_WITH.format("rllm.stepwise_advantage.enable"))) for name in ("mode", "normalize_by_steps")},
    "rllm.compact_filtering.enable": row(verl=VERL_ROWS, swift=SWIFT_ROWS),
    **{f"rllm.compact_filtering.{name}": row(
        verl=no_effect(ONLY_WITH.format("rllm.compact_filtering.enable")),
        swift=no_effect(ONLY_WITH.format("rllm.compact_filtering.enable")))
       for name in ("mask_max_prompt_length_exceeded", "mask_max_response_length_exceeded", "mask_env_done",
                    "mask_max_turns_exceeded", "mask_timeout", "mask_unknown", "mask_error")},
    "rllm.rejection_sample.enable": row(verl=VERL_ROWS, swift=SWIFT_ROWS),
    "rllm.rejection_sample.multiplier": row(
        refused("sampling extra tasks to refill rejected ones is not available; set it to 1 (rejected tasks are masked)",
                unless=(1, 1.0)),
        verl=no_effect(ONLY_WITH.format("rllm.rejection_sample.enable")),
        swift=no_effect(ONLY_WITH.format("rllm.rejection_sample.enable"))),
    "rllm.mask_truncated_samples": row(verl=VERL_ROWS, swift=SWIFT_ROWS),
    "rllm.filter_token_mismatch": row(NOT_USED_HERE),
    "rllm.accumulate_reasoning": row(NOT_USED_HERE),
    "rllm.disable_thinking": row(refused(
        "not implemented: chat templates are rendered as the tokenizer defines them; set it to false", unless=(False,))),
    "rllm.backend": row(applied("must name the backend that runs")),
    "rllm.sdk.store.path": row(no_effect("rLLM's trace database: an episode's calls are kept in memory here")),
    "rllm.sdk.processing.groupby_key": row(refused(
        "not implemented: every call of an episode is one trajectory unless the function returns TrajectoryView lists",
        unless=(None,))),
    "rllm.sdk.processing.traj_name_key": row(refused("not implemented; leave it null", unless=(None,))),
    **{f"rllm.sdk.proxy.{name}": row(SDK_ENDPOINT) for name in ("host", "port", "mode", "admin_token")},
    # -- remote training services ----------------------------------------------------------------
    "remote.base_url": row(REMOTE_ONLY, remote=APPLIED),
    "remote.loss_fn": row(REMOTE_ONLY, remote=APPLIED),
    "remote.adam_beta1": row(REMOTE_ONLY, remote=APPLIED),
    "remote.adam_beta2": row(REMOTE_ONLY, remote=APPLIED),
    "remote.adam_eps": row(REMOTE_ONLY, remote=APPLIED),
    "remote.region": row(REMOTE_ONLY, tinker=FIREWORKS_ONLY, fireworks=APPLIED),
    "remote.training_shape": row(REMOTE_ONLY, tinker=FIREWORKS_ONLY, fireworks=APPLIED),
    "remote.accelerator_type": row(REMOTE_ONLY, tinker=FIREWORKS_ONLY, fireworks=APPLIED),
    "remote.lora_train_unembed": row(REMOTE_ONLY, remote=APPLIED),
    "remote.lora_train_attn": row(REMOTE_ONLY, remote=APPLIED),
    "remote.lora_train_mlp": row(REMOTE_ONLY, remote=APPLIED),
    "remote.poll_interval_s": row(REMOTE_ONLY, tinker=FIREWORKS_ONLY, fireworks=APPLIED),
    "remote.ready_timeout_s": row(REMOTE_ONLY, tinker=FIREWORKS_ONLY, fireworks=APPLIED),
}


def effect(backend: str, key: str) -> Effect | None:
    """What ``backend`` does with our ``key`` (None for a backend or key without a row)."""
    return KEY_EFFECTS.get(key, {}).get(backend)


def without_effect(backend: str, config: Config) -> dict[str, tuple[Any, str]]:
    """The keys the run's overrides gave (``Config.given_keys``) that change nothing on ``backend``:
    key -> (value, why)."""
    found = {}
    for key in sorted(config.given_keys):
        found_effect = effect(backend, key)
        if found_effect is not None and found_effect.kind == "no_effect":
            found[key] = (config.get(key), found_effect.note)
    return found


def check_refused(backend: str, config: Config) -> None:
    """Raise ``ConfigError`` for the first key whose value ``backend`` refuses (its row's ``unless``
    lists what it accepts; rows without one are checked by the backend itself)."""
    for key, effects in KEY_EFFECTS.items():
        found = effects.get(backend)
        if found is None or found.kind != "refused" or found.unless is None:
            continue
        value = config.get(key)
        if value not in found.unless:
            raise ConfigError(key, f"{value!r} is refused on the {backend} backend: {found.note}.")


def say_without_effect(backend: str, config: Config) -> dict[str, dict[str, Any]]:
    """Every setting of this run that has no effect on ``backend`` (another backend's keys, other
    dialects' names, our keys this backend does not use), each said once as a warning: key ->
    {value, why}, as the run's config.yaml and ``TrainResult.ignored_keys`` record them."""
    ours = without_effect(backend, config)
    for key, (value, why) in ours.items():
        logger.warning("%s=%r has no effect on the %s backend: %s; recorded under ignored_keys", key, value, backend, why)
    return {key: {"value": value, "why": why} for key, (value, why) in {**config.ignored_keys, **ours}.items()}


# -- the table of docs/keys.md ----------------------------------------------------------------------

def _dialect_rows() -> list[tuple[str, str, dict[str, Effect]]]:
    """(name, where it comes from, effects) of other dialects' names, from the tables that translate them."""
    rows: list[tuple[str, str, dict[str, Effect]]] = []
    not_verl = refused("neither ours nor verl's: give our key (the verl backend takes ours and verl's)")
    trl = "TRL GRPOConfig"
    for name, ours in DIRECT.items():
        rows.append((name, trl, row(mapped(ours), verl=not_verl)))
    for name, what in SPECIAL.items():
        rows.append((name, trl, row(mapped(what), verl=not_verl)))
    for name in sorted(NO_EFFECT):
        rows.append((name, trl, row(no_effect(NO_EFFECT_WHY), verl=not_verl)))
    for name, why in REFUSED_ALWAYS.items():
        rows.append((name, trl, row(refused(why), verl=not_verl)))
    rows.append(("any other GRPOConfig field", trl, row(
        refused("unless set to TRL's default (which asks for nothing): this trainer has no equivalent"), verl=not_verl)))

    unified = "rLLM unified config"
    for name, ours in UNIFIED_NAMES.items():
        rows.append((name, unified, row(mapped(ours), verl=not_verl)))
    for prefix in UNIFIED_SECTIONS:
        rows.append((f"{prefix}*", unified, row(mapped(prefix.removeprefix("rllm.") + "*"), verl=not_verl)))

    remote_source = "rLLM tinker / fireworks"
    for name, ours in RLLM_REMOTE_ALIASES.items():
        elsewhere = mapped(UNIFIED_NAMES[name]) if name in UNIFIED_NAMES else refused("rLLM's tinker and fireworks name; give our key")
        rows.append((name, remote_source, row(elsewhere, verl=not_verl, remote=mapped(ours))))
    rows.append((RLLM_WARMUP_RATIO, remote_source, row(
        refused("rLLM's tinker and fireworks name; give actor_rollout_ref.actor.optim.lr_warmup_steps"),
        remote=mapped("actor_rollout_ref.actor.optim.lr_warmup_steps (ratio x trainer.total_training_steps)"))))
    elsewhere = refused("rLLM's tinker and fireworks name; it has no meaning on this backend")
    for name, rule in RLLM_REMOTE_NAMES.items():
        rows.append((name, remote_source, row(elsewhere, remote=_remote_rule(rule))))
    for prefix, rule in RLLM_REMOTE_SECTIONS.items():
        rows.append((f"{prefix}*", remote_source, row(elsewhere, remote=_remote_rule(rule))))

    verl = "verl PPO trainer"
    for pattern, harmless, why in VERL_NO_EFFECT:
        note = why if harmless is None else f"{why} (at {' or '.join(map(_shown, harmless))}; other values refused)"
        rows.append((pattern, verl, row(no_effect(note), verl=mapped("passed to verl as it is"))))
    for name, filled_by in VERL_FILLED_LATER.items():
        if name.removeprefix("reward.") in READ_BY_THE_TRAINER:
            argument = READ_BY_THE_TRAINER[name.removeprefix("reward.")]
            rows.append((name, verl, row(mapped(
                f"AgentTrainer's {argument} where that argument is None (AWorld's route: the file is loaded; null: not "
                "given); refused per run on the platform, where the registry chooses a run's inputs"))))
            continue
        rows.append((name, verl, row(
            refused(f"a verl setting; null is accepted as not given ({filled_by} fills it)", unless=(None,)),
            verl=applied(f"passed to verl; null: not given ({filled_by} fills it)"))))
    rows.append(("<section>.enable: false, and the keys of that section", verl, row(
        no_effect("a verl section switched off"), verl=mapped("passed to verl as it is"))))
    rows.append(("any other key of verl's config", verl, row(
        refused("a verl setting that this trainer does not implement: use backend=verl, or remove it"),
        verl=mapped("passed to verl as it is"))))
    return rows


def _remote_rule(rule: Any) -> Effect:
    if isinstance(rule, Rename):
        return mapped(rule.ours if rule.only is None else f"{rule.ours} (fireworks; refused on tinker: {rule.elsewhere})")
    if isinstance(rule, Same):
        return refused(rule.why, unless=rule.values)
    if isinstance(rule, Refuse):
        return refused(rule.why, unless=(None,))
    doc = inspect.getdoc(rule) or rule.__name__
    return mapped(" ".join(doc.split()))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def audit_markdown() -> str:
    """docs/keys.md: every key the config accepts and what each backend does with it."""
    head = "| Key | " + " | ".join(BACKENDS) + " |"
    rule = "|" + "---|" * (len(BACKENDS) + 1)
    lines = [
        "# Every config key, per backend",
        "",
        "Generated from `training/backends/keys.py` (`python -m training.backends.keys > docs/keys.md`); a test fails",
        "when this file is out of date or when a key of the schema has no row. Each cell is one of:",
        "",
        "- **applied**: the backend trains with it as documented;",
        "- **mapped**: it reaches the backend's engine under another name or form (said);",
        "- **no effect**: accepted and unused on that backend; a run that sets it says so at construction (a",
        "  warning) and records it under `ignored_keys` (value and why) in the run's `config.yaml` and in",
        "  `TrainResult.ignored_keys`;",
        "- **refused**: construction stops, naming the key and what to do (`refused unless X`: X is accepted",
        "  and asks for nothing).",
        "",
        "No key is silently ignored: a key that is in none of these tables is refused as unknown, with the",
        "nearest key as a suggestion.",
        "",
        "## Our keys",
        "",
        head,
        rule,
    ]
    for key in valid_keys():
        effects = KEY_EFFECTS[key]
        lines.append(f"| `{key}` | " + " | ".join(_cell(effects[b].cell()) for b in BACKENDS) + " |")
    lines += [
        "",
        "## Other dialects' names",
        "",
        "The names of TRL's GRPOConfig, rLLM's configs and verl's PPO trainer, as the tables that translate",
        "them say.",
        "",
        "| Name | Dialect | " + " | ".join(BACKENDS) + " |",
        "|" + "---|" * (len(BACKENDS) + 2),
    ]
    for name, source, effects in _dialect_rows():
        lines.append(f"| `{_cell(name)}` | {source} | " + " | ".join(_cell(effects[b].cell()) for b in BACKENDS) + " |")
    return "\n".join(lines) + "\n"


def missing_rows() -> list[str]:
    """Keys of the schema without a row, or a row without every built-in backend (the test's check)."""
    problems = [f"{key}: no row" for key in valid_keys() if key not in KEY_EFFECTS]
    problems += [f"{key}: a row but no such key" for key in KEY_EFFECTS if key not in valid_keys()]
    problems += [f"{key}: no effect for {b}" for key, effects in KEY_EFFECTS.items() for b in BUILTIN_PROCESSORS if b not in effects]
    return problems


if __name__ == "__main__":
    print(audit_markdown(), end="")
