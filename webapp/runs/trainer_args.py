"""From registry rows and a run's overrides to ``AgentTrainer(...)`` arguments, and from the
library's validation errors back to the form field at fault.

Resolved once: the run form builds the arguments, validates them in the sandbox and stores them on
the run (its spec, ``run_spec``); each attempt of the worker builds the trainer from that spec
(``attempt_kwargs``), so what was validated is what runs, whatever the registry rows say later.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

from training.rollouts.models import adapter_base, is_adapter, is_saved_model
from webapp.policy import limits
from webapp.policy.checks import ARGUMENT_KWARGS, HIDDEN, private_values, redact
from webapp.policy.keys import (
    CHECKPOINT_DIR_KEY, MODEL_KEY, PYTHON_KEY, RUN_MODEL, TRUST_KEY, permitted_overrides, platform_set_keys,
    remote_ray_refusal,
)
from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction, local_path, path_under_model_roots
from webapp.runs import artifacts, forks
from webapp.runs.access import can
from webapp.runs.models import Run



def model_config(choice: str, user=None) -> dict[str, Any]:
    """The model keys of a run that chose ``choice``: a registered ``Model`` entry's name, or
    ``run:<id>``, the model a run ``user`` may see trained. ValueError naming the choice otherwise."""
    match = RUN_MODEL.match(choice.strip())
    if match:
        run = Run.objects.filter(pk=int(match.group(1))).first()
        if run is None or user is None or not can(user, run, "view"):
            raise ValueError(f"model {choice!r}: there is no run {match.group(1)} that you may see.")
        if match.group(2) is not None:  # a fork: the weights of one of its published checkpoints
            return checkpoint_config(choice, run, int(match.group(2)))
        if artifacts.shared():  # on the store: the worker fetches it into its own folder for that run
            stored = run.status == Run.Status.SUCCEEDED and artifacts.final_model_key(run)
            trained = artifacts.scratch_folder(run) / "final_model" if stored else None
            if trained is None:
                raise ValueError(f"model {choice!r}: run {run.pk} ({run.status}) left no trained model in the artifact store.")
            return {MODEL_KEY: str(trained), "actor_rollout_ref.model.tokenizer_path": None, TRUST_KEY: False}
        trained = run.folder() / "final_model" if run.run_path else None
        if run.status != Run.Status.SUCCEEDED or trained is None or not is_saved_model(trained):
            raise ValueError(f"model {choice!r}: run {run.pk} ({run.status}) left no trained model on the workers.")
        problem = adapter_base_problem(run, adapter_base(trained)) if is_adapter(trained) else None
        if problem:
            raise ValueError(f"model {choice!r}: {problem}")
        return {MODEL_KEY: str(trained), "actor_rollout_ref.model.tokenizer_path": None, TRUST_KEY: False}
    entries = Model.objects.visible_to(user) if user is not None else Model.objects.all()
    entry = entries.filter(name=choice.strip()).first()
    if entry is None:
        names = ", ".join(entries.values_list("name", flat=True)[:20]) or "none yet"
        raise ValueError(
            f"model {choice!r} is not a model registered on this platform; choose one of: {names} "
            "(or run:<id>, a run's trained model). An administrator registers models."
        )
    return entry.trainer_config()


def checkpoint_config(choice: str, run: Run, step: int) -> dict[str, Any]:
    """The model keys of a fork of ``run`` from its checkpoint of ``step`` (``choice``: ``run:<id>@<step>``),
    found among the checkpoints it published, never at a path anyone gives. ValueError saying why not."""
    problem = forks.step_problem(run, step)
    if problem:
        raise ValueError(f"model {choice!r}: {problem}")
    folder = forks.checkpoint_folder(run, step)
    if not artifacts.shared():  # a shared store's copy is fetched by the worker; locally the folder is there to read
        if any(path.is_symlink() for path in folder.rglob("*")):
            # Written by the run's own process: a link would load another run's (or person's) files as the fork's weights.
            raise ValueError(f"model {choice!r}: run {run.pk}'s checkpoint of step {step} holds links to files "
                             "outside it; a fork loads only the files a checkpoint holds.")
        if not is_saved_model(folder):
            raise ValueError(f"model {choice!r}: run {run.pk}'s checkpoint of step {step} holds no weights in the "
                             "Hugging Face format a fork loads (config.json or a LoRA adapter); its backend saves "
                             "checkpoints only it can resume from.")
        problem = adapter_base_problem(run, adapter_base(folder)) if is_adapter(folder) else None
        if problem:
            raise ValueError(f"model {choice!r}: {problem}")
    return {MODEL_KEY: str(folder), "actor_rollout_ref.model.tokenizer_path": None, TRUST_KEY: False}


def adapter_base_problem(run: Run, base: str) -> str | None:
    """Why the base model that ``run``'s LoRA adapter names may not be loaded, or None. The name is in a
    file the run's own process wrote: only the run's own base (inside its folder), a model under
    MODEL_ROOTS, or a hub id (read from the workers' cache) is loaded."""
    path = Path(base)
    if not path.is_absolute() and not path.exists():
        return None
    if path.resolve().is_relative_to(run.folder().resolve()):
        return None
    try:
        path_under_model_roots(base, "the adapter's base model")
    except ValueError as exc:
        return f"run {run.pk}'s adapter was trained on {base!r}, which is neither in the run's folder nor a registered model: {exc}"
    return None


def model_defaults(choice: str) -> dict[str, Any]:
    """The config a run of the model ``choice`` gets under its own overrides: the registered entry's
    ``default_config``; for ``run:<id>`` (or a fork's ``run:<id>@<step>``), that of the model the run trained
    from (the settings it learns with)."""
    match = RUN_MODEL.match(choice.strip())
    if match:
        choice = Run.objects.filter(pk=int(match.group(1))).values_list("model", flat=True).first() or ""
        if RUN_MODEL.match(choice):
            return {}
    entry = Model.objects.filter(name=choice.strip()).first()
    return dict(entry.default_config or {}) if entry else {}


def platform_config(backend: Backend, model: dict[str, Any]) -> dict[str, Any]:
    """The value of every platform-set key for one run: the model's, the admin's (Backend), else none."""
    admin = {k: v for k, v in (backend.default_config or {}).items() if k in platform_set_keys()}
    fixed = {key: None for key in platform_set_keys()}
    fixed.update(admin)
    fixed.update(model)
    fixed[CHECKPOINT_DIR_KEY] = None  # the run's own folder (<run_path>/checkpoints), even if an admin set one
    if backend.python:
        fixed[PYTHON_KEY] = backend.python
    return fixed


def merged_config(backend: Backend, dataset: Dataset, overrides: dict[str, Any], fixed: dict[str, Any],
                  model: dict[str, Any] | None = None, agent: Agent | None = None) -> dict[str, Any]:
    """Backend defaults, then the model's (``model_defaults``: the settings it learns with), then the
    agent's (what its task needs: turns, tokens per turn), then the dataset's column mapping, then
    the owner's overrides, then the platform-set keys (``fixed``), which nothing below them changes."""
    config: dict[str, Any] = {}
    config.update(backend.default_config or {})
    for defaults in (model or {}, (agent.default_config if agent is not None else None) or {}):
        config.update(permitted_overrides(defaults))
    config.update(dataset.config_overrides())
    config.update(permitted_overrides(overrides))  # the form refuses them too
    config.update(fixed)
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
    user=None,
) -> dict[str, Any]:
    """``AgentTrainer(...)`` arguments of a run. Builds nothing and imports no registry code."""
    fixed = platform_config(backend, model_config(model, user))
    return {
        **agent.trainer_kwargs(),
        **dataset.trainer_kwargs(),
        "reward_func": reward.path if reward else None,
        "backend": backend.processor,
        "config": merged_config(backend, dataset, overrides, fixed, model_defaults(model), agent),
        "run_path": run_path,
    }


def run_trainer_kwargs(run, run_path: str) -> dict[str, Any]:
    return trainer_kwargs(
        agent=run.agent, dataset=run.dataset, reward=run.reward, backend=run.backend,
        model=run.model, overrides=run.config_overrides, run_path=run_path, user=run.owner,
    )


# -- a run's spec: resolved once, at submission ------------------------------------------------

class Revoked(Exception):
    """An administrator withdrew something a queued run was validated with (its backend disabled,
    its model unregistered, no longer trusted or moved out of the model roots): the run is not trained."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.summary = message  # the run's error, as the worker records a library failure's


def run_spec(kwargs: dict[str, Any], dataset: Dataset) -> dict[str, Any]:
    """What a run trains, from the ``AgentTrainer`` kwargs its check validated: all of them but
    where it runs (``run_path``). An uploaded dataset's rows are named by their stored file, which
    no later upload replaces, so every attempt reads the rows that were validated."""
    trainer = copy.deepcopy({key: value for key, value in kwargs.items() if key != "run_path"})
    stored = {}
    for key, split in (("train_dataset", dataset.train_split), ("val_dataset", dataset.val_split)):
        file = dataset.stored_file(split) if trainer.get(key) else None
        if file:
            stored[key] = file.name
            trainer[key] = None  # a path of the process that checked it; each attempt finds its own
    return {"trainer": trainer, "stored_files": stored}


def revocations(run) -> list[str]:
    """What an administrator withdrew since ``run`` was validated, each in words for its owner.
    Revocations only: settings changed since (a row's defaults, a dataset's mapping) are not read."""
    since = "since this run was queued"
    problems = []
    backend = Backend.objects.get(pk=run.backend_id)
    if not backend.enabled:
        problems.append(f"Backend '{backend.name}' was disabled by an administrator {since}; clone the run onto another backend.")
    if RUN_MODEL.match(run.model or ""):
        return problems  # the trained model is looked up again at each attempt (``attempt_kwargs``)
    config = run.spec["trainer"]["config"]
    entry = Model.objects.filter(name=run.model).first()
    if entry is None:
        problems.append(f"Model '{run.model}' was removed from the registry by an administrator {since}.")
        return problems
    if config.get(TRUST_KEY) and not entry.trust_remote_code:
        problems.append(f"Model '{run.model}' is no longer trusted to run its own code (an administrator turned "
                        f"trust_remote_code off {since}).")
    for key, what in ((MODEL_KEY, "model"), ("actor_rollout_ref.model.tokenizer_path", "tokenizer")):
        value = config.get(key)
        if isinstance(value, str) and os.path.isabs(value):
            try:
                path_under_model_roots(value, what)
            except ValueError as exc:
                problems.append(f"Model '{run.model}': {exc}")
    return problems


def attempt_kwargs(run, run_path: str) -> dict[str, Any]:
    """``AgentTrainer(...)`` arguments of this attempt of ``run``: its stored spec, with where it runs
    filled in (``run_path``, this worker's copy of the dataset's file, of a run's trained model).
    Raises ``Revoked`` when an administrator withdrew what it was validated with. A run from before
    specs gets its spec resolved from the rows now, and stored: its later attempts train the same."""
    if run.spec is None:
        kwargs = run_trainer_kwargs(run, run_path)
        run.spec = run_spec(kwargs, run.dataset)
        Run.objects.filter(pk=run.pk, spec__isnull=True).update(spec=run.spec)
        run.spec = Run.objects.values_list("spec", flat=True).get(pk=run.pk)
    problems = revocations(run)
    if problems:
        raise Revoked(" ".join(problems) + " It was not trained.")
    kwargs = copy.deepcopy(run.spec["trainer"])
    refusal = remote_ray_refusal(kwargs.get("config") or {})
    if refusal:  # validated before remote Ray clusters were refused
        raise Revoked(f"{refusal} It was not trained.")
    kwargs["run_path"] = run_path
    field = Dataset._meta.get_field("file")
    for key, name in run.spec.get("stored_files", {}).items():
        if not field.storage.exists(name):
            raise Revoked(f"The dataset file this run was validated with ({name}, of dataset '{run.dataset.name}') "
                          "was deleted since it was queued. It was not trained.")
        kwargs[key] = local_path(field.attr_class(run.dataset, field, name))
    if RUN_MODEL.match(run.model or ""):  # its folder on this worker, and still one the owner may see
        try:
            kwargs["config"].update(model_config(run.model, run.owner))
        except ValueError as exc:
            raise Revoked(f"{exc} It was not trained.") from None
    return kwargs


def clone_overrides(run) -> dict[str, Any]:
    """Overrides that give a new run of ``run``'s choices the config ``run`` was validated with:
    its own, and each key whose value the registry rows give differently now (an agent's or a
    backend's default an administrator changed since). The registry's arguments are the rows' own."""
    own = dict(run.config_overrides or {})  # as written: a key the form refuses is refused by name again
    if not run.spec:
        return own
    validated = permitted_overrides(run.spec["trainer"]["config"])
    now = merged_config(run.backend, run.dataset, {}, {}, model_defaults(run.model), run.agent)
    written = {*own, *limits.config_leaves(own)}
    changed = {key: value for key, value in validated.items() if key not in written and (key not in now or now[key] != value)}
    return {**own, **changed}


def shown_spec(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's spec as its viewers read it: the registry's arguments (``ARGUMENT_KWARGS``) hidden,
    as in its errors and log, and an uploaded dataset named by its stored file, not a worker's path."""
    if not spec:
        return None
    trainer = copy.deepcopy(spec["trainer"])
    hidden = private_values(trainer)
    for name in ARGUMENT_KWARGS:
        if trainer.get(name):
            trainer[name] = dict.fromkeys(trainer[name], HIDDEN)

    def shown(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: shown(item) for key, item in value.items()}
        if isinstance(value, list):
            return [shown(item) for item in value]
        return redact(value, hidden) if isinstance(value, str) else value

    trainer = shown(trainer)
    for key, name in (spec.get("stored_files") or {}).items():
        trainer[key] = f"uploaded file {name}"
    return trainer


# Which form field a library error belongs to, by the name the message starts with.
_FIELD_BY_SUBJECT = [
    (re.compile(r"^model\b"), "model"),
    (re.compile(r"^(Cannot load )?(agent_class|env_class|workflow_class|agent_run_func|agent)\b"), "agent"),
    (re.compile(r"^(Cannot load )?(train_dataset|val_dataset|test_dataset)\b"), "dataset"),
    (re.compile(r"^(Cannot load )?(reward_func|reward)\b"), "reward"),
    (re.compile(r"^(Cannot load (the )?'?\w+'? backend|Unknown training backend|backend\b)"), "backend"),
]


def field_for_error(message: str, key: str | None = None) -> str | None:
    """The run-form field a validation error from ``AgentTrainer(...)`` belongs to (None: the form).
    ``key``: the config key a ``training.config.ConfigError`` names."""
    if key is not None:
        return "model" if key == MODEL_KEY else "overrides"
    message = message.strip()
    for pattern, field in _FIELD_BY_SUBJECT:
        if pattern.match(message):
            return field
    return None
