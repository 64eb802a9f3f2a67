"""From registry rows and a run's overrides to ``AgentTrainer(...)`` arguments, and from the
library's validation errors back to the form field at fault.

Used twice with the same inputs: by the run form (validate before queueing) and by the worker
(build the trainer that trains), so what was validated is what runs.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from webapp.registry.models import Agent, Backend, Dataset, RewardFunction

MODEL_KEY = "actor_rollout_ref.model.path"
PYTHON_KEY = "trainer.python"
# Keys only an admin sets (in a Backend's default_config or python field): an interpreter runs
# code, and a service URL would receive the platform's API key.
ADMIN_ONLY_KEYS = {PYTHON_KEY: "the interpreter", "remote.base_url": "the remote service's URL"}


def load_training_plugins() -> None:
    """Import ``settings.TRAINING_PLUGINS`` (they register datasets, rewards, backends by name)."""
    for module in settings.TRAINING_PLUGINS:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImproperlyConfigured(f"TRAINING_PLUGINS: cannot import {module!r}: {exc}") from exc


def merged_config(backend: Backend, dataset: Dataset, model: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Backend defaults, then the dataset's column mapping, then the model, then the owner's overrides."""
    config: dict[str, Any] = {}
    config.update(backend.default_config or {})
    config.update(dataset.config_overrides())
    if model:
        config[MODEL_KEY] = model
    config.update({k: v for k, v in overrides.items() if k not in ADMIN_ONLY_KEYS})  # the form refuses them too
    if backend.python:  # the admin's choice; a run's overrides never pick an interpreter
        config[PYTHON_KEY] = backend.python
    return config


def trainer_kwargs(
    *,
    agent: Agent,
    dataset: Dataset,
    reward: RewardFunction | None,
    backend: Backend,
    model: str,
    overrides: dict[str, Any],
    run_path: str,
) -> dict[str, Any]:
    load_training_plugins()
    return {
        **agent.trainer_kwargs(),
        **dataset.trainer_kwargs(),
        "reward_func": reward.path if reward else None,
        "backend": backend.processor,
        "config": merged_config(backend, dataset, model, overrides),
        "run_path": run_path,
    }


def run_trainer_kwargs(run, run_path: str) -> dict[str, Any]:
    return trainer_kwargs(
        agent=run.agent, dataset=run.dataset, reward=run.reward, backend=run.backend,
        model=run.model, overrides=run.config_overrides, run_path=run_path,
    )


# Which form field a library error belongs to, by the name the message starts with.
_FIELD_BY_SUBJECT = [
    (re.compile(r"^(Cannot load )?(agent_class|env_class|workflow_class|agent_run_func|agent)\b"), "agent"),
    (re.compile(r"^(Cannot load )?(train_dataset|val_dataset|test_dataset)\b"), "dataset"),
    (re.compile(r"^(Cannot load )?(reward_func|reward)\b"), "reward"),
    (re.compile(r"^(Cannot load (the )?'?\w+'? backend|Unknown training backend|backend\b)"), "backend"),
]


def field_for_error(exc: BaseException) -> str | None:
    """The run-form field a validation error from ``AgentTrainer(...)`` belongs to (None: the form)."""
    key = getattr(exc, "key", None)
    if key is not None:  # training.config.ConfigError
        return "model" if key == MODEL_KEY else "overrides"
    message = str(exc).strip()
    for pattern, field in _FIELD_BY_SUBJECT:
        if pattern.match(message):
            return field
    return None
