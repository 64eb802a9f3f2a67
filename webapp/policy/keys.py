"""Which config keys a run may set: those only the platform sets (paths, interpreters, service
URLs, the model), with why, and the one rule that refuses them wherever a config comes in (run
form, API, sweeps, clones, registry defaults, the worker's merge)."""

from __future__ import annotations

import re
from typing import Any

from training.config import location_keys
from webapp.policy import limits

MODEL_KEY = "actor_rollout_ref.model.path"
TRUST_KEY = "actor_rollout_ref.model.trust_remote_code"
CHECKPOINT_DIR_KEY = "trainer.default_local_dir"
PYTHON_KEY = "trainer.python"
# A run's model choice naming another run's trained model (``run:<id>``) or the weights of one of
# its published checkpoints (``run:<id>@<step>``: a fork, ``webapp.runs.forks``).
RUN_MODEL = re.compile(r"^run:(\d{1,18})(?:@(\d{1,10}))?$")

# Keys a run's overrides never set, with why. The platform sets each itself (from the chosen Model
# entry, the Backend an admin configured, and the run's own folder): a path reaches other people's
# files, an interpreter or a model's own code runs code, a service URL receives the platform's API key.
# Every key the library marks as naming a location is one of them (``training.config.location_keys``).
_WHY_PLATFORM_SET = {
    MODEL_KEY: "the model is chosen in the Model field, among those an administrator registered",
    "actor_rollout_ref.model.tokenizer_path": "the tokenizer comes with the chosen model",
    TRUST_KEY: "a model's own code runs only for a model an administrator marked trusted",
    CHECKPOINT_DIR_KEY: "checkpoints are always written in the run's own folder",
    "trainer.ray_address": "the Ray cluster is chosen by the backend's administrator",
    PYTHON_KEY: "the interpreter is chosen by the backend's administrator",
    "remote.base_url": "the remote service's URL is chosen by the backend's administrator (it would receive the platform's API key)",
    "actor_rollout_ref.rollout.server_url": "the vLLM server is chosen by the backend's administrator (workers connect where it points)",
    "trainer.wandb_entity": "the W&B entity comes from the project's tracking targets (it would receive the project's W&B key)",
}


RAY_ADDRESS_KEY = "trainer.ray_address"
REMOTE_RAY_REFUSED = (
    "trainer.ray_address joins a Ray cluster the training process did not start, whose jobs the platform "
    "cannot stop yet: a superseded attempt's workers there would go on training and saving. Leave "
    "trainer.ray_address empty (each training process then starts its own Ray cluster on its machine), "
    "or train on that cluster outside the platform."
)


def remote_ray_refusal(config: dict[str, Any]) -> str | None:
    """Why a run with ``config`` (dotted keys) may not train on the platform: a remote Ray cluster
    (``trainer.ray_address``), where an attempt's jobs are not fenced (docs/platform.md). None when it may."""
    return REMOTE_RAY_REFUSED if config.get(RAY_ADDRESS_KEY) else None


def platform_set_keys() -> dict[str, str]:
    """Every key only the platform sets -> why, in words for the person who tried to set it."""
    why = {key: "it names a location on the workers, which the platform chooses" for key in location_keys()}
    return {**why, **_WHY_PLATFORM_SET}


# verl's keys that name a run's inputs by a path on the worker (a data file, a reward's Python file),
# which the library reads as AWorld's AgentTrainer does (``training.trainer.CONFIG_INPUT_KEYS``). A
# run's data and reward are chosen among the registry's entries; a member's config is data, never a path.
_WHY_REGISTRY_INPUTS = {
    "data.train_files": "the training data is chosen in the Dataset field, among the registered datasets",
    "data.val_files": "the test data comes with the chosen dataset's entry",
    "custom_reward_function": "the reward is chosen in the Reward field, among the registered reward functions",
    "reward.custom_reward_function": "the reward is chosen in the Reward field, among the registered reward functions",
}

# Dict-valued keys (rLLM's) whose entries become arguments of registry code: set by the agent's entry.
_ARGUMENT_PREFIXES = ("rllm.agent.agent_args", "rllm.agent.engine_args", "rllm.env.env_args", "rllm.workflow.workflow_args")
_WHY_ARGUMENTS = "the arguments of the agent, environment or workflow come from the agent's registry entry"


def refused_overrides(overrides: dict[str, Any]) -> dict[str, str]:
    """The rule of what a member's config may set, for every place that takes one (run form, API,
    sweeps, clones, the worker's merge): each key it sets that a run may not -> a message naming it.

    Judged on the keys the trainer reads (``limits.config_leaves``: ``rllm.workflow={"workflow_args":
    {...}}`` is the keys under ``rllm.workflow.workflow_args``), and on what lies under or above
    them: a value under a platform-set key (``trainer.python.x``), and a section that holds one
    (``actor_rollout_ref.model=null`` or ``{}`` stands for the keys under it)."""
    return {leaf: message for leaf, _, message in _refusals(overrides)}


def permitted_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` without each key (as written, whole) that sets something ``refused_overrides`` refuses."""
    refused = {written for _, written, _ in _refusals(overrides)}
    return {key: value for key, value in overrides.items() if key not in refused}


def _refusals(overrides: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(leaf key, the key as written, message) for each key of ``overrides`` a run may not set."""
    walled = {**platform_set_keys(), **dict.fromkeys(_ARGUMENT_PREFIXES, _WHY_ARGUMENTS), **_WHY_REGISTRY_INPUTS}
    refusals = []
    for leaf, (written, _) in limits.config_leaves(overrides).items():
        why = None
        for wall, reason in walled.items():
            if leaf == wall or leaf.startswith(wall + "."):
                why = reason
                break
            if wall.startswith(leaf + "."):  # a section given whole: it stands for every key under it
                why = f"it holds {wall}, which cannot be set per run ({reason}); set the keys under it one by one"
                break
        if why is not None:
            how = "" if written == leaf else f" (set by {written})"
            refusals.append((leaf, written, f"{leaf}{how} cannot be set per run: {why}."))
    return refusals
