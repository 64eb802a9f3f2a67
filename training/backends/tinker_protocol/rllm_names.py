"""rLLM's tinker and fireworks config names beyond the plain renames (``RLLM_REMOTE_ALIASES``):
each is mapped onto our keys (the mapping logged) or refused with why.

The names come from rLLM's tinker configs (v0.2.1.post1 ``rllm/trainer/config/tinker_rl_trainer.yaml``
and ``tinker_sft_trainer.yaml``; HEAD ``rllm/trainer/config/rllm/backend/tinker.yaml`` and
``fireworks.yaml``, which ``unified.yaml`` composes) and their example scripts. rLLM's generic unified
names (``rllm.*``, ``model.name``, ``training.group_size``, ...) are handled with the rest of rLLM's
names; this table holds what only its tinker and fireworks trainers read.

A rule is one of:

- ``Rename(ours)``: the value is given to our key ``ours``;
- ``Same(values, why)``: a setting whose accepted values are what this backend does anyway (logged
  as such), any other value refused with ``why``;
- ``Refuse(why)``: refused whatever the value (``None``, "not set", is accepted where rLLM's
  default is None);
- a function ``(value, flat overrides, backend) -> {our key: value}``, raising ``ConfigError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from training.errors import ConfigError
from training.log import logger
from training.config import Config


# rLLM's tinker and fireworks config names (rllm/trainer/config/rllm/backend/*.yaml) -> ours.
RLLM_REMOTE_ALIASES = {
    "model.name": "actor_rollout_ref.model.path",
    "model.tokenizer_model": "actor_rollout_ref.model.tokenizer_path",
    "model.lora_rank": "actor_rollout_ref.model.lora_rank",
    "training.group_size": "actor_rollout_ref.rollout.n",
    "training.learning_rate": "actor_rollout_ref.actor.optim.lr",
    "training.lr_schedule": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "training.weight_decay": "actor_rollout_ref.actor.optim.weight_decay",
    "training.grad_clip_norm": "actor_rollout_ref.actor.grad_clip",
    "training.beta1": "remote.adam_beta1",
    "training.beta2": "remote.adam_beta2",
    "training.eps": "remote.adam_eps",
    "training.default_local_dir": "trainer.default_local_dir",
    "training.resume_mode": "trainer.resume_mode",
    "validation.group_size": "actor_rollout_ref.rollout.val_kwargs.n",
    "agent.max_steps": "rllm.agent.max_steps",
    "sampling.temperature": "actor_rollout_ref.rollout.temperature",
    "sampling.top_p": "actor_rollout_ref.rollout.top_p",
    "tinker_base_url": "remote.base_url",
    "fireworks_base_url": "remote.base_url",
}
# rLLM's warm-up as a share of the run: turned into actor.optim.lr_warmup_steps (int(ratio x steps), as rLLM does).
RLLM_WARMUP_RATIO = "training.warmup_steps_ratio"


@dataclass(frozen=True)
class Rename:
    ours: str
    only: str | None = None  # the one backend it applies to; the other refuses it with ``elsewhere``
    elsewhere: str = ""


@dataclass(frozen=True)
class Same:
    values: tuple[Any, ...]
    why: str


@dataclass(frozen=True)
class Refuse:
    why: str


Rule = Rename | Same | Refuse | Callable[[Any, dict[str, Any], str], dict[str, Any]]

NOT_SFT = ("belongs to rLLM's tinker SFT trainer (tinker_sft_trainer.yaml); supervised fine-tuning is not a "
           "backend here: the tinker and fireworks backends train with RL")
RESUME_OWN = ("resume here is from the newest checkpoint recorded in the run's own folder "
              "(trainer.resume_mode=auto, rLLM's training.resume_mode); starting from a checkpoint chosen by {what} "
              "is not offered")


def _num_minibatches(value: Any, flat: dict[str, Any], backend: str) -> dict[str, Any]:
    """rLLM splits each step's batch into ``num_minibatches`` optimizer steps: our
    ``actor.ppo_mini_batch_size`` (prompts per optimizer step) is the batch divided by it."""
    count = int(value)
    batch = int(flat.get("data.train_batch_size", Config().data.train_batch_size))
    if count < 1 or batch % count:
        raise ConfigError("training.num_minibatches", f"must divide data.train_batch_size ({batch}) into equal "
                          f"mini-batches of prompts, got {value!r}.")
    return {"actor_rollout_ref.actor.ppo_mini_batch_size": batch // count}


def _max_length(value: Any, flat: dict[str, Any], backend: str) -> dict[str, Any]:
    """rLLM drops sequences longer than ``max_length``. Ours are never longer than the prompt and
    response limits together, so a limit at or above those has nothing to drop; one below is refused."""
    if value is None:
        return {}
    data = Config().data
    prompt = int(flat.get("data.max_prompt_length", data.max_prompt_length))
    response = int(flat.get("data.max_response_length", data.max_response_length))
    if int(value) < prompt + response:
        raise ConfigError("training.max_length", f"is {value}, below data.max_prompt_length + data.max_response_length "
                          f"({prompt} + {response}); lower those instead, which bound every training sequence here.")
    logger.info("training.max_length=%s: every sequence is at most data.max_prompt_length + data.max_response_length "
                "= %d tokens, so none is dropped", value, prompt + response)
    return {}


def _grouping_level(value: Any, flat: dict[str, Any], backend: str) -> dict[str, Any]:
    if value == "trajectory":
        logger.info("algorithm.grouping_level=trajectory: advantages compare the trajectories of one task's "
                    "episodes, as this backend does")
        return {}
    raise ConfigError("algorithm.grouping_level", f"{value!r} is not offered: advantages are grouped by trajectory "
                      "here; per-step training of multi-step trajectories is rllm.stepwise_advantage.* (docs/rllm.md).")


RLLM_REMOTE_NAMES: dict[str, Rule] = {
    # -- implemented: mapped onto our keys ---------------------------------------------------
    "training.num_minibatches": _num_minibatches,
    "training.max_length": _max_length,
    "algorithm.grouping_level": _grouping_level,
    "model.train_unembed": Rename("remote.lora_train_unembed"),
    "model.train_attn": Rename("remote.lora_train_attn"),
    "model.train_mlp": Rename("remote.lora_train_mlp"),
    "rollout_engine.accumulate_reasoning": Rename("rllm.accumulate_reasoning"),
    "rollout_engine.disable_thinking": Rename("rllm.disable_thinking"),
    "workflow.n_parallel_tasks": Rename("rllm.workflow.n_parallel_tasks"),
    "workflow.retry_limit": Rename("rllm.workflow.retry_limit"),
    "agent.agent_args": Rename("rllm.agent.agent_args"),
    "env.env_args": Rename("rllm.env.env_args"),
    "fireworks_config.policy_trainer_shape_id": Rename(
        "remote.training_shape", only="fireworks", elsewhere="is a Fireworks training shape; the tinker service places its jobs itself",
    ),
    # -- settings whose accepted values are what these backends do ------------------------------
    "fuse_forward_backward_and_optim_step": Same((False,), (
        "tinker-only knob with no effect on our loss: it sends forward_backward and optim_step as one request; "
        "here optim_step is queued right behind forward_backward without waiting for it (the same update, one "
        "round trip apart), and Fireworks' trainer needs them apart anyway")),
    "rollout_engine.bypass_render_with_parser": Same((True,), (
        "false renders prompts with a tinker-cookbook renderer; here prompts are always rendered with the "
        "tokenizer's chat template (what true does)")),
    "rollout_engine.renderer_name": Same((None,), (
        "names a tinker-cookbook renderer; none is used here: prompts are rendered with the tokenizer's chat template")),
    "rollout_engine.reasoning_effort": Refuse(
        "is the tinker-cookbook renderer's reasoning effort for gpt-oss prompts; prompts are rendered here with "
        "the tokenizer's chat template, which is given no reasoning effort"),
    "fireworks_config.policy_trainer_replica_count": Same((1,), "each run's trainer job has one replica here"),
    "fireworks_config.rollout_deployment_replica_count": Same((1,), "each run's rollout deployment has one replica here"),
    "fireworks_config.reference_trainer_shape_id": Refuse(
        "a reference trainer serves full-parameter training with a KL term; these backends train LoRA adapters, "
        "whose reference is the frozen base model"),
    "fireworks_config.reference_trainer_replica_count": Same((0,), (
        "a reference trainer serves full-parameter training with a KL term; these backends train LoRA adapters")),
    "training.client_timeout": Refuse(
        "sets a per-call timeout of rLLM's Fireworks trainer; here the SDK's own timeouts and retries apply and a call "
        "that fails fails the run, naming the call and step"),
    "training.resume_from_path": Refuse(RESUME_OWN.format(what="path")),
    "trainer.resume_from_tinker_id": Refuse(RESUME_OWN.format(what="tinker:// id")),
    "training.resume_from_fireworks_job_id": Refuse(RESUME_OWN.format(what="another trainer job's id")),
    "training.resume_from_dcp_checkpoint": Refuse(RESUME_OWN.format(what="DCP checkpoint name")),
    # -- rLLM's tinker SFT trainer ---------------------------------------------------------------
    "data.max_length": Refuse(NOT_SFT),
    "data.renderer_name": Refuse(NOT_SFT),
    "data.rllm.tokenize_and_mask_method": Refuse(NOT_SFT),
}

# Whole sections, by prefix.
RLLM_REMOTE_SECTIONS: dict[str, Refuse] = {
    "optim.": Refuse(NOT_SFT + " (its optimizer is actor_rollout_ref.actor.optim.* and remote.adam_* here)"),
    "fireworks_infra.": Refuse(
        "is rLLM's provisioning section for Fireworks ('do not change'); the trainer job and deployment are "
        "provisioned by the backend from actor_rollout_ref.model.* and remote.* (remote.training_shape, remote.region)"),
    "concurrency.": Refuse(
        "is the Fireworks cookbook's adaptive sampling window, which this backend does not use: the rollout engine "
        "sends each episode's next turn to the deployment as it comes"),
    "hydra.": Refuse("configures Hydra, which does not read this configuration; a run writes to its own run folder"),
}


def rule_for(key: str) -> Rule | None:
    if key in RLLM_REMOTE_NAMES:
        return RLLM_REMOTE_NAMES[key]
    for prefix, rule in RLLM_REMOTE_SECTIONS.items():
        if key.startswith(prefix):
            return rule
    return None


def translate(flat: dict[str, Any], backend: str) -> dict[str, Any]:
    """``flat`` overrides with rLLM's tinker/fireworks names applied (each mapping logged) or refused
    (``ConfigError`` naming the key and why). Our own keys pass through untouched."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        rule = rule_for(key)
        if rule is None:
            out[key] = value
            continue
        if isinstance(rule, Rename):
            if rule.only is not None and rule.only != backend:
                raise ConfigError(key, f"{rule.elsewhere} (rLLM's {rule.only} name), so it has no meaning on the {backend} backend.")
            mapped = {rule.ours: value}
        elif isinstance(rule, Same):
            if value not in rule.values:
                raise ConfigError(key, f"{value!r} is not offered on the {backend} backend: {rule.why}.")
            logger.info("rLLM's %s=%r: what the %s backend does (%s)", key, value, backend, rule.why)
            mapped = {}
        elif isinstance(rule, Refuse):
            if value is not None:
                raise ConfigError(key, f"is not offered on the {backend} backend: it {rule.why}.")
            mapped = {}
        else:
            mapped = rule(value, flat, backend)
        for ours, given in mapped.items():
            if ours in flat and flat[ours] != given:
                raise ConfigError(key, f"is rLLM's name for {ours}={given!r}, which is also set to {flat[ours]!r}; give one.")
            logger.info("rLLM's %s=%r -> %s=%r", key, value, ours, given)
            out[ours] = given
    return out
