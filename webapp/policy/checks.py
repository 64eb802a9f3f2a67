"""Registry code runs only in a sandbox: the check of a run's spec (``training.platform.probe`` in its jail,
with the platform's limits), the plugins a training process loads, and the registry's arguments
taken out of whatever text a member reads (check errors, a run's error and log)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from training.platform import probe

from training.config import secrets
from training.config import flatten
from training.utils import leaves
from webapp.policy import limits
from webapp.policy.keys import MODEL_KEY, platform_set_keys

def load_training_plugins() -> None:
    """Import ``settings.TRAINING_PLUGINS`` (they register datasets, rewards, backends by name).
    Only in processes that run registry code (the training process, the checks' sandbox), never the web server."""
    for module in settings.TRAINING_PLUGINS:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImproperlyConfigured(f"TRAINING_PLUGINS: cannot import {module!r}: {exc}") from exc


def check_spec(kwargs: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """What ``training.platform.probe`` checks for a run with these ``AgentTrainer`` kwargs: the platform-set
    keys must come out as set, and the owner's ``overrides`` reach nothing unchecked. ``data_paths``:
    the files the check reads (the datasets, the model's folder), the only ones its jail shows it."""
    config = kwargs["config"]
    named = [kwargs.get("train_dataset"), kwargs.get("val_dataset"), config.get(MODEL_KEY),
             config.get("actor_rollout_ref.model.tokenizer_path")]
    return {
        "kwargs": kwargs,
        "plugins": list(settings.TRAINING_PLUGINS),
        "pinned": {key: config[key] for key in platform_set_keys()},
        "user_keys": sorted({*flatten(overrides), *limits.config_leaves(overrides)}),
        "load_model": True,
        "data_paths": [path for path in named if isinstance(path, str) and os.path.isabs(path) and os.path.exists(path)],
    }


def check_isolated(spec: dict[str, Any]) -> dict[str, Any]:
    """``training.platform.probe.check_isolated`` with the platform's limits: the run's code never runs here.
    Each check's data is linked under ``VAR_DIR/run-checks`` (beside the uploads: links, not copies).
    The answer's message reaches the run's owner: the registry's arguments are taken out of it."""
    probe.use_inbox(settings.VAR_DIR / "run-checks")
    answer = probe.check_isolated(spec, timeout_s=settings.RUN_CHECK_TIMEOUT_SECONDS, memory_mb=settings.RUN_CHECK_MEMORY_MB)
    hidden = private_values(spec.get("kwargs", {}))
    for said in (answer, *answer.get("problems", [])):
        if isinstance(said.get("message"), str):
            said["message"] = redact(said["message"], hidden)
    return answer


# -- what members read of registry arguments ---------------------------------------------------

ARGUMENT_KWARGS = ("agent_args", "env_args", "workflow_args")
HIDDEN = "<set by the administrator>"
_SHORTEST_HIDDEN = 8  # shorter values (a flag, a word such as "python") would blot out ordinary words


def private_values(kwargs: dict[str, Any]) -> list[str]:
    """The strings an administrator gave the run's agent, environment or workflow (a server's
    arguments and environment, paths, names), and the secrets they name, as set here: text a member
    reads (a validation error, the run's error and log) never shows them, whatever code quoted them."""
    found: set[str] = set()
    for name in ARGUMENT_KWARGS:
        for value in leaves(kwargs.get(name) or {}, whole=secrets.reference):
            secret = os.environ.get(secrets.reference(value) or "") if isinstance(value, dict) else None
            if secret or isinstance(value, str):
                found.add(secret or value)
    return sorted((v for v in found if len(v) >= _SHORTEST_HIDDEN), key=len, reverse=True)  # longest first


def redact(text: str, values: list[str]) -> str:
    """``text`` with each of ``values`` (``private_values``) replaced by a mark that says who set it."""
    for value in values:
        text = text.replace(value, HIDDEN)
    return text


def warm_checker() -> None:
    """Start this process's checking server now (a web server does at startup), in its jail with the inbox above."""
    probe.use_inbox(settings.VAR_DIR / "run-checks")
    probe.warm()
