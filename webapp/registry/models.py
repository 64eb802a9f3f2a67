"""What a run is made of: agents, datasets, reward functions and training backends.

Rows hold import paths and names, never code: the worker turns them into ``AgentTrainer``
arguments (``webapp.runs.trainer_args``).
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models.signals import post_delete
from django.dispatch import receiver

from training.compat.aworld.agents import ModelConfig
from training.config import Config
from training.errors import ConfigError
from training.backends.processor import get_processor_class
from training.config.secrets import reference
from training.utils import leaves
from webapp.policy.checks import check_isolated
from webapp.policy.keys import refused_overrides, remote_ray_refusal
from webapp.policy.limits import check_limit_table
from webapp.teams.models import teams_of

# A Hugging Face hub id: "name" or "owner/name", letters, digits, '-', '_' and '.', never a path.
_HUB_ID = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")
BUILTIN_MODELS = ("tiny-char",)


def check_default_config(value: dict, whose: str) -> None:
    """An entry's ``default_config``: only keys a run may set itself, with values the config accepts."""

    refused = refused_overrides(dict(value or {}))  # judged on every key it sets, as a run's overrides are
    if refused:
        raise ValidationError({"default_config": [f"{whose} default: {message}" for message in refused.values()]})
    try:
        Config.build(dict(value or {}))
    except ConfigError as exc:
        raise ValidationError({"default_config": str(exc)}) from exc


def _dict_only(value: Any) -> None:
    if not isinstance(value, dict):
        raise ValidationError("Must be a JSON object, e.g. {\"key\": \"value\"}.")


class RegistryQuerySet(models.QuerySet):
    def visible_to(self, user) -> "RegistryQuerySet":
        """Shared entries (no project) and those of the projects of ``user``'s teams."""
        if user.is_superuser:
            return self
        return self.filter(models.Q(project__isnull=True) | models.Q(project__team__in=teams_of(user)))

    def usable_in(self, project: Any) -> "RegistryQuerySet":
        """The shared entries and those of ``project`` (a Project, its pk, or None: shared ones only):
        among these a dataset's or agent's name means one entry."""
        return self.filter(models.Q(project__isnull=True) | models.Q(project=project or None))


class RegistryEntry(models.Model):
    """What agents, datasets and rewards share: a unique name, and the project that owns the
    entry (none: shared with everyone on the platform)."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    project = models.ForeignKey(
        "teams.Project", on_delete=models.PROTECT, related_name="+", null=True, blank=True,
        help_text="Empty: shared with everyone on the platform.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = RegistryQuerySet.as_manager()

    class Meta:
        abstract = True
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ProjectEntry(RegistryEntry):
    """An entry a project's members add themselves (datasets, chat agents). Its name is unique within
    its project and among the shared entries, not platform-wide, so a taken name says nothing about
    other projects; nor may a project's entry take a shared entry's name, so that a name means one
    entry among those a run in the project may use."""

    name = models.SlugField(max_length=100)

    class Meta(RegistryEntry.Meta):
        abstract = True
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="%(app_label)s_%(class)s_name_in_project",
                                    violation_error_message="The project has an entry of this name already."),
            models.UniqueConstraint(fields=["name"], condition=models.Q(project__isnull=True),
                                    name="%(app_label)s_%(class)s_shared_name",
                                    violation_error_message="A shared entry of this name exists already."),
        ]

    def validate_unique(self, exclude: Any = None) -> None:
        super().validate_unique(exclude)
        if exclude and ({"name", "project"} & set(exclude)):  # a form that sets the project itself checks the name
            return
        others = type(self)._default_manager.filter(name=self.name).exclude(pk=self.pk)
        if self.project_id is not None and others.filter(project__isnull=True).exists():
            raise ValidationError({"name": f"A shared {self._meta.verbose_name} is named {self.name!r}; choose another name."})
        if self.project_id is None and others.filter(project__isnull=False).exists():  # only administrators share entries
            raise ValidationError({"name": f"A project's {self._meta.verbose_name} is named {self.name!r}; a shared "
                                           "one of that name would make the name ambiguous there."})


class Tool(models.Model):
    """A Python function that chat agents may call, registered by an admin by import path (code
    only ever comes from admins; people choose among these tools for their agents)."""

    name = models.SlugField(max_length=100, unique=True)
    path = models.CharField(max_length=300, help_text="Import path of the function, e.g. examples.arithmetic.add.")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The tool must load and have a schema the model can read; checked in a sandboxed child
        process, as registry code never runs in the web server."""
        answer = check_isolated({"plugins": list(settings.TRAINING_PLUGINS), "tools": [self.path]})
        if not answer["ok"]:
            raise ValidationError({"path": answer["message"]})


class Agent(ProjectEntry):
    """An agent given as a workflow class, or as an agent class plus an environment class, by
    dotted import path; or, written without code, as a chat agent (AWorld's agent YAML fields):
    a system prompt, a model config and tools chosen among the admin-registered ones. All empty
    means a single-turn task (prompt in, answer out)."""

    workflow_class = models.CharField(max_length=300, blank=True, help_text="e.g. examples.countdown_workflow.CountdownWorkflow")
    workflow_args = models.JSONField(default=dict, blank=True, validators=[_dict_only])
    agent_class = models.CharField(max_length=300, blank=True, help_text="e.g. examples.frozenlake.FrozenLakeAgent")
    env_class = models.CharField(max_length=300, blank=True, help_text="e.g. examples.frozenlake.FrozenLakeEnv")
    agent_args = models.JSONField(default=dict, blank=True, validators=[_dict_only])
    env_args = models.JSONField(default=dict, blank=True, validators=[_dict_only])
    system_prompt = models.TextField(blank=True, help_text="A chat agent's instructions (sent first in every episode).")
    llm_config = models.JSONField(
        default=dict, blank=True, validators=[_dict_only],
        help_text='A chat agent\'s model config in AWorld\'s names, e.g. {"llm_temperature": 0.7}; '
                  "llm_model_name is the model trained unless the run names one.",
    )
    tools = models.ManyToManyField(Tool, blank=True, related_name="agents", help_text="Tools the chat agent may call.")
    default_config = models.JSONField(
        default=dict, blank=True, validators=[_dict_only],
        help_text='Config keys every run of this agent gets under its own overrides (over its model\'s and '
                  'backend\'s): what its task needs, e.g. {"rllm.agent.max_steps": 7}. The run form shows them as its defaults.',
    )

    @property
    def kind(self) -> str:
        if self.workflow_class:
            return "workflow"
        if self.agent_class or self.env_class:
            return "agent+env"
        if self.is_chat:
            return "chat"
        return "single-turn"

    @property
    def is_chat(self) -> bool:
        return bool(self.system_prompt or self.llm_config or (self.pk and self.tools.exists()))

    def secret_names(self) -> set[str]:
        """The secrets (``{"$secret": NAME}``) its arguments take, by name."""
        values = (self.workflow_args, self.agent_args, self.env_args, self.llm_config)
        return {name for value in values for item in leaves(value, whole=lambda v: reference(v) is not None)
                if (name := reference(item)) is not None}

    def clean(self) -> None:
        check_default_config(self.default_config, "an agent's")
        if self.workflow_class and (self.agent_class or self.env_class):
            raise ValidationError("Give a workflow class or an agent and environment class, not both.")
        if (self.system_prompt or self.llm_config) and (self.workflow_class or self.agent_class or self.env_class):
            raise ValidationError("A chat agent (system prompt, model config, tools) has no workflow or agent class.")
        if self.llm_config:
            try:
                ModelConfig.coerce(self.llm_config)
            except ValueError as exc:
                raise ValidationError({"llm_config": str(exc)}) from exc

    def trainer_kwargs(self) -> dict[str, Any]:
        """The agent part of ``AgentTrainer(...)``."""
        if self.workflow_class:
            return {"workflow_class": self.workflow_class, "workflow_args": dict(self.workflow_args)}
        if self.kind == "chat":  # the mapping AWorld's agent YAML holds
            fields = {
                "system_prompt": self.system_prompt,
                "llm_config": dict(self.llm_config),
                "tool_names": [tool.path for tool in self.tools.order_by("name")],
            }
            return {"agent": {"agents": {self.name: fields}}}
        return {
            "agent_class": self.agent_class or None,
            "env_class": self.env_class or None,
            "agent_args": dict(self.agent_args),
            "env_args": dict(self.env_args),
        }


class Dataset(ProjectEntry):
    """A dataset registered with the training library by name (``frozenlake``), a Hugging Face hub
    id, an uploaded file, or a path on the workers' disk."""

    class Source(models.TextChoices):
        REGISTERED = "registered", "Registered name"
        HUB = "hub", "Hugging Face hub id"
        UPLOAD = "upload", "Uploaded file"
        PATH = "path", "Path on the workers"

    # The roles a column can play; the mapping's values are this dataset's column names.
    COLUMN_ROLES = {"prompt": "data.prompt_key", "ground_truth": "data.answer_key"}

    source = models.CharField(max_length=20, choices=Source.choices, default=Source.REGISTERED)
    identifier = models.CharField(
        max_length=500, blank=True,
        help_text="Registered name or hub id (for those sources), or a path on the workers.",
    )
    file = models.FileField(upload_to="datasets/", blank=True, help_text="An uploaded dataset's training rows.")
    test_file = models.FileField(upload_to="datasets/", blank=True, help_text="An uploaded dataset's held-out rows.")
    train_split = models.CharField(max_length=50, default="train")
    val_split = models.CharField(max_length=50, blank=True, help_text="Empty: no validation set.")
    column_mapping = models.JSONField(
        default=dict, blank=True, validators=[_dict_only],
        help_text='Role to column, e.g. {"prompt": "question", "ground_truth": "answer"}.',
    )

    def clean(self) -> None:
        if self.source == self.Source.UPLOAD and not self.file:
            raise ValidationError({"file": "Upload a file for an uploaded dataset."})
        if self.source != self.Source.UPLOAD and not self.identifier:
            raise ValidationError({"identifier": "Give the registered name, hub id or path."})
        unknown = sorted(set(self.column_mapping or {}) - set(self.COLUMN_ROLES))
        if unknown:
            raise ValidationError({"column_mapping": f"Unknown role(s) {unknown}; use {sorted(self.COLUMN_ROLES)}."})

    def stored_file(self, split: str):
        """An uploaded dataset's stored file for ``split`` (None for the other sources). Its name is
        never reused (a new upload gets a new one), so it names the exact rows a run trained on."""
        if self.source != self.Source.UPLOAD:
            return None
        return self.test_file if split == self.val_split and self.test_file else self.file

    def _spec(self, split: str) -> str:
        if self.source == self.Source.UPLOAD:
            return local_path(self.stored_file(split))
        if self.source == self.Source.PATH:
            return self.identifier
        return f"{self.identifier}:{split}"

    def trainer_kwargs(self) -> dict[str, Any]:
        """The data part of ``AgentTrainer(...)``."""
        return {
            "train_dataset": self._spec(self.train_split),
            "val_dataset": self._spec(self.val_split) if self.val_split else None,
        }

    def config_overrides(self) -> dict[str, Any]:
        """Column mapping as config keys (``data.prompt_key``, ``data.answer_key``)."""
        return {self.COLUMN_ROLES[role]: column for role, column in (self.column_mapping or {}).items()}


def _new_token() -> str:
    return secrets.token_urlsafe(16)


class PendingUpload(models.Model):
    """An uploaded table, read and checked, waiting for its columns to be mapped (step 2 of an
    upload). Its rows are the JSON-lines file the child reader wrote (``webapp.registry.uploads``);
    the mapping page shows what is kept here (the columns, the first rows, cut) and never reads the
    rows. Deleted, file and all, once its dataset is saved, when discarded, or after a day."""

    token = models.CharField(max_length=32, unique=True, default=_new_token, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("teams.Project", on_delete=models.CASCADE, related_name="+")
    name = models.SlugField(max_length=100)
    description = models.TextField(blank=True)
    filename = models.CharField(max_length=200, help_text="The browser's name of the file: shown, never a path.")
    rows = models.FileField(upload_to="datasets/pending/")
    row_count = models.PositiveIntegerField()
    columns = models.JSONField(default=list)
    preview = models.JSONField(default=list, help_text="The first rows, in the columns' order, each cell cut for display.")
    first_empty = models.JSONField(default=dict, help_text="Column -> where the first row without a value in it is.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.filename}), waiting for its columns"


@receiver(post_delete, sender=PendingUpload)
@receiver(post_delete, sender=Dataset)
def _delete_stored_files(sender, instance: Dataset | PendingUpload, **kwargs: Any) -> None:
    """An uploaded dataset's files go with its row (runs that used it keep the row: it is protected),
    as a pending upload's rows go with it."""
    for field in instance._meta.fields:
        if isinstance(field, models.FileField) and getattr(instance, field.name):
            getattr(instance, field.name).delete(save=False)


def local_path(stored) -> str:
    """A path on this machine for a stored file: the storage's own where the file is there, else
    (an object store) a copy fetched once into ``VAR_DIR/stored-files``, where the training process reads it."""
    try:
        own = stored.path
    except NotImplementedError:  # a storage without local files
        own = None
    if own is not None and Path(own).is_file():
        return own
    copy = Path(settings.VAR_DIR) / "stored-files" / stored.name
    if not copy.exists():  # names are never reused (a random folder each), so a copy is never stale
        copy.parent.mkdir(parents=True, exist_ok=True)
        partial = copy.with_name(f"{copy.name}.{os.getpid()}.partial")
        with stored.open("rb") as source, open(partial, "wb") as target:
            for chunk in iter(lambda: source.read(1 << 20), b""):
                target.write(chunk)
        partial.replace(copy)
    return str(copy)


def path_under_model_roots(value: str, what: str) -> str:
    """``value`` resolved (symlinks followed); ValueError unless it lies under one of ``MODEL_ROOTS``."""
    resolved = Path(value).resolve()
    roots = [Path(root).resolve() for root in settings.MODEL_ROOTS]
    if not Path(value).is_absolute() or not any(resolved.is_relative_to(root) for root in roots):
        raise ValueError(
            f"{what} {value!r} is not under the model roots ({', '.join(map(str, roots))}); "
            "copy the model there or add its folder to MODEL_ROOTS."
        )
    return str(resolved)


class Model(RegistryEntry):
    """A policy model people may train, kept by admins: a hub id (from the workers' Hugging Face
    cache), a directory under ``MODEL_ROOTS``, or one built in code (``tiny-char``). Runs choose
    among these (or a run's trained model), never a path of their own."""

    class Source(models.TextChoices):
        BUILTIN = "builtin", "Built in code (tiny-char)"
        HUB = "hub", "Hugging Face hub id"
        PATH = "path", "Directory under MODEL_ROOTS"

    source = models.CharField(max_length=20, choices=Source.choices, default=Source.HUB)
    identifier = models.CharField(max_length=500, help_text="tiny-char, a hub id (Qwen/Qwen2.5-0.5B) or an absolute directory.")
    tokenizer = models.CharField(
        max_length=500, blank=True, help_text="Hub id or directory under MODEL_ROOTS; empty: the model's own.",
    )
    trust_remote_code = models.BooleanField(
        default=False,
        help_text="Let this model's own Python code (config.json auto_map) run on the workers. Only for code an "
                  "administrator has read: no run can turn this on.",
    )
    default_config = models.JSONField(
        default=dict, blank=True, validators=[_dict_only],
        help_text='Config keys every run of this model gets under its own overrides (over its backend\'s): the '
                  'settings it learns with, e.g. {"actor_rollout_ref.actor.optim.lr": 0.001}. The run form shows them '
                  "as its defaults.",
    )

    def clean(self) -> None:
        try:
            self.trainer_config()
        except ValueError as exc:
            raise ValidationError({"identifier" if "tokenizer" not in str(exc) else "tokenizer": str(exc)}) from exc
        check_default_config(self.default_config, "a model's")


    def trainer_config(self) -> dict[str, Any]:
        """The model keys of a run's config (path, tokenizer, trust_remote_code), checked again at use:
        a directory must still lie under ``MODEL_ROOTS`` (a symlink may have moved)."""
        if self.source == self.Source.BUILTIN:
            if self.identifier not in BUILTIN_MODELS:
                raise ValueError(f"model {self.identifier!r} is not built in; built-in models: {', '.join(BUILTIN_MODELS)}.")
            path = self.identifier
        elif self.source == self.Source.PATH:
            path = path_under_model_roots(self.identifier, "model")
        elif _HUB_ID.match(self.identifier) and not (Path(settings.BASE_DIR) / self.identifier).exists():
            path = self.identifier  # (a relative directory of that name would be loaded instead of the hub's)
        else:
            raise ValueError(f"model {self.identifier!r} is not a hub id (owner/name); for a directory choose the path source.")
        tokenizer = None
        if self.tokenizer:
            tokenizer = self.tokenizer if _HUB_ID.match(self.tokenizer) else path_under_model_roots(self.tokenizer, "tokenizer")
        return {
            "actor_rollout_ref.model.path": path,
            "actor_rollout_ref.model.tokenizer_path": tokenizer,
            "actor_rollout_ref.model.trust_remote_code": bool(self.trust_remote_code),
        }


class RewardFunction(RegistryEntry):
    """A reward built into the library (``exact_match``) or any function by dotted path."""

    path = models.CharField(max_length=300, help_text="Built-in name (exact_match) or dotted path (pkg.mod.fn).")


class Backend(models.Model):
    """A training backend as admins offer it: which processor, which worker queue, defaults, limits."""

    name = models.SlugField(max_length=100, unique=True)
    processor = models.CharField(max_length=100, help_text="Library processor name: trl, verl, or a registered one.")
    enabled = models.BooleanField(default=True)
    queue = models.SlugField(
        max_length=50, default="cpu",
        help_text="Celery queue its runs go to: cpu or gpu (or any queue a worker listens on).",
    )
    needs_gpu = models.BooleanField(default=False)
    default_config = models.JSONField(
        default=dict, blank=True, validators=[_dict_only],
        help_text='Dotted config keys applied under every run\'s overrides, e.g. {"trainer.device": "cpu"}.',
    )
    max_concurrent_runs = models.PositiveIntegerField(default=0, help_text="0: no limit.")
    config_limits = models.JSONField(
        default=dict, blank=True, validators=[check_limit_table],
        help_text='Upper bounds of numeric config keys for this backend\'s runs, over the platform\'s '
                  '(docs/security.md), e.g. {"trainer.total_training_steps": 1000000}.',
    )
    max_attempts = models.PositiveIntegerField(
        default=3, validators=[MinValueValidator(1)],
        help_text="Attempts a run gets: a run whose worker is lost is queued again (resuming from its last "
                  "checkpoint) until it has had this many.",
    )
    python = models.CharField(
        max_length=500, blank=True,
        help_text="Interpreter its training process runs in (e.g. .venv-swift/bin/python for swift); "
                  "empty: the backend's default. Set here only: runs cannot override it.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name if self.enabled else f"{self.name} (disabled)"

    def environment_status(self) -> dict[str, str | None]:
        """Whether this backend's environment imports and its credentials are set
        (``{"environment": problem or None, "credentials": problem or None}``). A backend with an
        interpreter of its own (``python``) is checked in that interpreter, by a short subprocess
        that imports what its training process needs (cached for a while); the others, and the
        credentials, in this process, whose environment the workers share."""
        try:
            processor = get_processor_class(self.processor)
        except ValueError as exc:
            return {"environment": str(exc), "credentials": None}
        status = processor.environment_status(self.python or None)
        if self.python and not processor.own_interpreter:
            status = {**status, "environment": (
                f"python is set to {self.python}, but the {self.processor} backend trains in the worker's own "
                "process and would not use it; leave python empty")}
        return status

    def clean(self) -> None:
        refusal = remote_ray_refusal(self.default_config if isinstance(self.default_config, dict) else {})
        if refusal:
            raise ValidationError({"default_config": refusal})

    def why_unusable(self) -> str | None:
        """Why a run cannot use this backend now (disabled; a remote Ray cluster; its environment or
        credentials missing here), in words for the person choosing it; None when it can."""
        if not self.enabled:
            return "disabled by an administrator"
        refusal = remote_ray_refusal(self.default_config or {})
        if refusal:
            return refusal
        return "; ".join(problem for problem in self.environment_status().values() if problem) or None

    def has_capacity(self) -> bool:
        if not self.max_concurrent_runs:
            return True
        return self.runs.filter(status="running").count() < self.max_concurrent_runs
