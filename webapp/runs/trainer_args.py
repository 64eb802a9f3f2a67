"""From registry rows and a run's overrides to ``AgentTrainer(...)`` arguments, and from the
library's validation errors back to the form field at fault.

Resolved once: the run form builds the arguments, validates them in the sandbox and stores them on
the run (its spec, ``run_spec``); each attempt of the worker builds the trainer from that spec
(``attempt_kwargs``), so what was validated is what runs, whatever the registry rows say later.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from training.config import flatten
from webapp.registry.models import Agent, Backend, Dataset, RewardFunction
from webapp.runs import limits

MODEL_KEY = "actor_rollout_ref.model.path"
TRUST_KEY = "actor_rollout_ref.model.trust_remote_code"
CHECKPOINT_DIR_KEY = "trainer.default_local_dir"
PYTHON_KEY = "trainer.python"
RUN_MODEL = re.compile(r"^run:(\d{1,18})$")

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


def platform_set_keys() -> dict[str, str]:
    """Every key only the platform sets -> why, in words for the person who tried to set it."""
    from training.config import location_keys

    why = {key: "it names a location on the workers, which the platform chooses" for key in location_keys()}
    return {**why, **_WHY_PLATFORM_SET}


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
    walled = {**platform_set_keys(), **dict.fromkeys(_ARGUMENT_PREFIXES, _WHY_ARGUMENTS)}
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


def load_training_plugins() -> None:
    """Import ``settings.TRAINING_PLUGINS`` (they register datasets, rewards, backends by name).
    Only in processes that run registry code (the training process, the checks' sandbox), never the web server."""
    for module in settings.TRAINING_PLUGINS:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImproperlyConfigured(f"TRAINING_PLUGINS: cannot import {module!r}: {exc}") from exc


def model_config(choice: str, user=None) -> dict[str, Any]:
    """The model keys of a run that chose ``choice``: a registered ``Model`` entry's name, or
    ``run:<id>``, the model a run ``user`` may see trained. ValueError naming the choice otherwise."""
    from webapp.registry.models import Model
    from webapp.runs.models import Run

    match = RUN_MODEL.match(choice.strip())
    if match:
        from webapp.runs.access import can

        run = Run.objects.filter(pk=int(match.group(1))).first()
        if run is None or user is None or not can(user, run, "view"):
            raise ValueError(f"model {choice!r}: there is no run {match.group(1)} that you may see.")
        from webapp.runs import artifacts

        if artifacts.shared():  # on the store: the worker fetches it into its own folder for that run
            stored = run.status == Run.Status.SUCCEEDED and artifacts.final_model_key(run)
            trained = artifacts.scratch_folder(run) / "final_model" if stored else None
            if trained is None:
                raise ValueError(f"model {choice!r}: run {run.pk} ({run.status}) left no trained model in the artifact store.")
            return {MODEL_KEY: str(trained), "actor_rollout_ref.model.tokenizer_path": None, TRUST_KEY: False}
        trained = run.folder() / "final_model" if run.run_path else None
        if run.status != Run.Status.SUCCEEDED or trained is None or not (trained / "config.json").is_file():
            raise ValueError(f"model {choice!r}: run {run.pk} ({run.status}) left no trained model on the workers.")
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


def model_defaults(choice: str) -> dict[str, Any]:
    """The config a run of the model ``choice`` gets under its own overrides: the registered entry's
    ``default_config``; for ``run:<id>``, that of the model the run trained from (the settings it learns with)."""
    from webapp.registry.models import Model
    from webapp.runs.models import Run

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


def check_spec(kwargs: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """What ``training.probe`` checks for a run with these ``AgentTrainer`` kwargs: the platform-set
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
    """``training.probe.check_isolated`` with the platform's limits: the run's code never runs here.
    Each check's data is linked under ``VAR_DIR/run-checks`` (beside the uploads: links, not copies).
    The answer's message reaches the run's owner: the registry's arguments are taken out of it."""
    from training import probe

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
    from training import secrets
    from training.utils import leaves

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
    from training import probe

    probe.use_inbox(settings.VAR_DIR / "run-checks")
    probe.warm()


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
    from webapp.registry.models import Model, path_under_model_roots

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
    from webapp.runs.models import Run

    if run.spec is None:
        kwargs = run_trainer_kwargs(run, run_path)
        run.spec = run_spec(kwargs, run.dataset)
        Run.objects.filter(pk=run.pk, spec__isnull=True).update(spec=run.spec)
        run.spec = Run.objects.values_list("spec", flat=True).get(pk=run.pk)
    problems = revocations(run)
    if problems:
        raise Revoked(" ".join(problems) + " It was not trained.")
    kwargs = copy.deepcopy(run.spec["trainer"])
    kwargs["run_path"] = run_path
    field = Dataset._meta.get_field("file")
    for key, name in run.spec.get("stored_files", {}).items():
        if not field.storage.exists(name):
            raise Revoked(f"The dataset file this run was validated with ({name}, of dataset '{run.dataset.name}') "
                          "was deleted since it was queued. It was not trained.")
        from webapp.registry.models import local_path

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
