"""The run creation form: registry choices, a model, and config overrides, validated by the same
``AgentTrainer`` construction the worker will do, so a run that would fail validation is never queued."""

from __future__ import annotations

import re
from typing import Any

import yaml
from django import forms

from training.config import Config, flatten, parse_overrides

from training.errors import ConfigError
from webapp.policy import limits
from webapp.policy.checks import check_isolated, check_spec
from webapp.policy.keys import permitted_overrides, refused_overrides
from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction
from webapp.runs.access import entry_problem, usable_entries
from webapp.runs.config_fields import config_fields
from webapp.runs.forks import fork_choice, lineage
from webapp.runs.models import Run
from webapp.runs.submission import quota_problem, submit
from webapp.runs.trainer_args import clone_overrides, field_for_error, model_config, model_defaults, run_spec, trainer_kwargs
from webapp.teams.access import projects_for
from webapp.teams.models import Project

_KEY_VALUE_LINE = re.compile(r"^\s*[A-Za-z_][\w.\-]*\s*=")
# The run form's own fields for the most changed config keys.
COMMON_FIELDS = {
    "steps": "trainer.total_training_steps", "batch_size": "data.train_batch_size",
    "group_size": "actor_rollout_ref.rollout.n", "learning_rate": "actor_rollout_ref.actor.optim.lr",
    "max_turns": "rllm.agent.max_steps",
}
# The choices the backend's check builds the run from: with one of them wrong there is nothing to check.
CHECK_NEEDS = ("agent", "dataset", "reward", "backend", "model")


def parse_overrides_text(text: str) -> dict[str, Any]:
    """``key=value`` lines (values parsed as YAML scalars, like Hydra) or a YAML mapping -> flat dotted keys.

    Raises ``forms.ValidationError`` saying which line is wrong.
    """

    lines = [line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not lines:
        return {}
    if all(_KEY_VALUE_LINE.match(line) for line in lines):
        try:
            return parse_overrides(lines)
        except ConfigError as exc:
            raise forms.ValidationError(str(exc)) from None
    if not any(":" in line for line in lines):
        bad = next(line for line in lines if not _KEY_VALUE_LINE.match(line))
        raise forms.ValidationError(f"{bad.strip()!r} is not of the form key=value (or write a YAML mapping).")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise forms.ValidationError(f"Not valid YAML ({where}{getattr(exc, 'problem', exc)}); write key=value lines or a YAML mapping.") from None
    if not isinstance(loaded, dict):
        raise forms.ValidationError("Write key=value lines or a YAML mapping of keys to values.")
    return flatten(loaded)


def check_each_key(overrides: dict[str, Any], text: str) -> tuple[dict[str, Any], list[str]]:
    """Each override checked on its own against the config's keys, types and bounds: the ones that
    pass, and one message per one that does not (``line 3: trainer.total_training_steps: ...``)."""

    def error(keys: dict[str, Any]) -> ConfigError | None:
        try:
            Config.build(keys)
        except ConfigError as exc:
            return exc
        return None

    if error(overrides) is None:
        return overrides, []
    lines = {line.split("=", 1)[0].strip(): number for number, line in enumerate(text.splitlines(), 1)
             if _KEY_VALUE_LINE.match(line)}
    suspects = {key for key, value in overrides.items() if error({key: value})}
    # A key that only fails against the defaults (a mini-batch above the default batch) is fine next to the others.
    others = {key: value for key, value in overrides.items() if key not in suspects}
    problems = {key: exc for key in suspects if (exc := error({**others, key: overrides[key]}))}
    good = {key: value for key, value in overrides.items() if key not in problems}
    if not problems:  # only the keys together are wrong: the trainer's own message says how
        return good, []
    in_order = sorted(problems, key=lambda key: lines.get(key, 0))
    return good, [f"line {lines[key]}: {problems[key]}" if key in lines else str(problems[key]) for key in in_order]


def reward_named(message: str, reward: RewardFunction | None) -> str:
    """``message`` with the reward named as the form's dropdown shows it ('char-accuracy'), not as
    the library knows it (``char_accuracy``, ``pkg.module.score``, or as "reward function score")."""
    if reward is None:
        return message
    path, named = reward.path.strip(), f"'{reward.name}'"
    message = re.sub(rf"'?(?<![\w./]){re.escape(path)}(?![\w./])'?", named, message)
    function = re.split(r"[.:]", path)[-1]
    return re.sub(rf"(reward function )'?{re.escape(function)}\b'?", lambda match: match.group(1) + named, message)


def overrides_text(overrides: dict[str, Any]) -> str:
    """Flat overrides as the YAML mapping ``parse_overrides_text`` reads back to the same values."""
    return yaml.safe_dump(overrides, default_flow_style=False, sort_keys=False) if overrides else ""


def parse_tags(text: str) -> list[str]:
    """``"a, b,,a"`` -> ``["a", "b"]`` (order kept, duplicates dropped)."""
    return list(dict.fromkeys(tag.strip() for tag in text.split(",") if tag.strip()))


class RunEditForm(forms.ModelForm):
    """What can change on an existing run: its tags, notes and who sees it."""

    tags = forms.CharField(max_length=500, required=False, help_text="Comma separated.")
    notes = forms.CharField(max_length=limits.MAX_NOTES_CHARS, required=False, widget=forms.Textarea(attrs={"rows": 3}))

    class Meta:
        model = Run
        fields = ["visibility", "tags", "notes"]
        widgets = {"notes": forms.Textarea(attrs={"rows": 3})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["tags"] = ", ".join(self.instance.tags or [])

    def clean_tags(self) -> list[str]:
        return parse_tags(self.cleaned_data.get("tags", ""))

    def clean_visibility(self) -> str:
        visibility = self.cleaned_data["visibility"]
        if visibility == Run.Visibility.TEAM and not self.instance.project_id:
            raise forms.ValidationError("A run without a project has no team to share it with.")
        return visibility


class BackendSelect(forms.Select):
    """Backends a run cannot use now are offered greyed out (a disabled option), with why."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unusable: dict[int, str] = {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        backend = getattr(value, "instance", None)
        if backend is not None and backend.pk in self.unusable:
            option["attrs"].update(disabled=True, title=self.unusable[backend.pk])
        return option


class BackendChoiceField(forms.ModelChoiceField):
    widget = BackendSelect

    def find_unusable(self) -> None:
        """Ask each offered backend whether it can run here (``Backend.why_unusable``), once per form."""
        self.widget.unusable = {backend.pk: why for backend in self.queryset if (why := backend.why_unusable())}
        if self.widget.unusable:
            names = {backend.pk: backend.name for backend in self.queryset}
            self.help_text = "Greyed out, cannot run here: " + "; ".join(
                f"{names[pk]} ({why})" for pk, why in self.widget.unusable.items()) + "."

    def label_from_instance(self, backend: Backend) -> str:
        why = self.widget.unusable.get(backend.pk)
        return f"{backend.name} — {backend.processor}, {backend.queue} queue{f' (unavailable: {why})' if why else ''}"


class RunForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, help_text="Optional; to find the run again.")
    project = forms.ModelChoiceField(
        Project.objects.none(), required=False, help_text="Empty: a personal run, private to you.",
    )
    visibility = forms.ChoiceField(
        choices=Run.Visibility.choices, required=False, initial=Run.Visibility.PRIVATE,
        help_text="Team: everyone in the project's team sees it (by role); private: only you.",
    )
    agent = forms.ModelChoiceField(Agent.objects.all())
    dataset = forms.ModelChoiceField(Dataset.objects.all())
    reward = forms.ModelChoiceField(RewardFunction.objects.all(), required=False, help_text="Needed for single-turn tasks.")
    backend = BackendChoiceField(Backend.objects.all())
    model = forms.CharField(
        max_length=100, widget=forms.Select,
        help_text="The policy model: one an administrator registered, or a model one of your visible runs trained.",
    )
    # The settings most runs change, as fields of their own (empty: the config's default, shown as a placeholder).
    steps = forms.IntegerField(required=False, min_value=1, label="Training steps")
    batch_size = forms.IntegerField(required=False, min_value=1, label="Tasks per step")
    group_size = forms.IntegerField(required=False, min_value=1, label="Episodes per task (group size)")
    learning_rate = forms.FloatField(required=False, min_value=0, label="Learning rate")
    max_turns = forms.IntegerField(required=False, min_value=1, label="Max turns per episode")
    overrides = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
        max_length=limits.MAX_OVERRIDES_CHARS, validators=[limits.check_overrides_text],
        help_text="One key=value per line (data.train_batch_size=4) or a YAML mapping.",
    )
    tags = forms.CharField(max_length=500, required=False, help_text="Comma separated.")
    notes = forms.CharField(max_length=limits.MAX_NOTES_CHARS, required=False, widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args: Any, user=None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.final_config: dict[str, Any] | None = None
        self.spec: dict[str, Any] | None = None  # the run's spec, once the sandbox validated it (``clean``)
        self.quota_full: str | None = None  # why the owner's or the project's quota refuses the run (``clean``)
        self.user = user

        fields = {f["key"]: f for f in config_fields()}
        for name, key in COMMON_FIELDS.items():
            # The placeholder is the value an empty field gives: the library's default here, the chosen
            # agent's, model's or backend's once chosen (the page's script, from ``common_defaults``).
            self.fields[name].help_text = f"{fields[key]['doc']} ({key}; empty: the default shown, the chosen agent's, model's or backend's, else {fields[key]['default']})"
            self.fields[name].widget.attrs["placeholder"] = fields[key]["default"]
            self.fields[name].widget.attrs["data-key"] = key
        if user is not None:  # the registry entries and projects this user may use
            for name, model in (("agent", Agent), ("dataset", Dataset), ("reward", RewardFunction)):
                self.fields[name].queryset = usable_entries(user, model)
            self.fields["project"].queryset = projects_for(user, "run")
        self.fields["model"].widget.choices = self._model_choices(user)
        chosen = str((self.data.get("model") if self.is_bound else self.initial.get("model")) or "").strip()
        found = lineage(chosen)
        if found:  # a fork's checkpoint is offered where it was chosen (the run page's Fork), not among every run's
            self.fields["model"].widget.choices.append(
                (chosen, f"run {found['parent_id']}: its checkpoint of step {found['parent_step']} (a fork)"))
        self.fields["backend"].find_unusable()

    @staticmethod
    def _model_choices(user) -> list[tuple[str, str]]:
        """Registered models, then the trained models of the 50 latest succeeded runs ``user`` may see."""
        entries = Model.objects.visible_to(user) if user is not None else Model.objects.all()
        choices = [("", "---------")] + [(m.name, f"{m.name} ({m.identifier})") for m in entries]
        if user is not None:
            runs = Run.objects.visible_to(user).filter(status=Run.Status.SUCCEEDED, kind=Run.Kind.PLATFORM)[:50]
            choices += [(f"run:{run.pk}", f"run {run.pk} {run.name}: its trained model".replace("  ", " ")) for run in runs]
        return choices

    def common_defaults(self) -> dict[str, dict[str, Any]]:
        """What each common field gives when left empty, per choice: ``{"backends": {pk: {key: value}},
        "models": {choice: {...}}, "agents": {pk: {...}}}``, the keys of their ``default_config`` (an
        agent's win over a model's, a model's over a backend's, as in ``trainer_args.merged_config``)."""

        keys = set(COMMON_FIELDS.values())

        def common(config: dict | None) -> dict[str, Any]:
            return {k: v for k, v in (config or {}).items() if k in keys}

        return {
            "backends": {str(b.pk): common(b.default_config) for b in self.fields["backend"].queryset},
            "models": {choice: common(model_defaults(choice)) for choice, _ in self.fields["model"].widget.choices if choice},
            "agents": {str(a.pk): common(a.default_config) for a in self.fields["agent"].queryset},
        }

    @staticmethod
    def initial_from(run: Run) -> dict[str, Any]:
        """A run's choices and the config of its spec as the initial data of a new run (clone): the
        common settings in their own fields, the other keys in the overrides."""
        overrides = clone_overrides(run)  # the config it was validated with, not what its rows give now
        common = {}
        for name, key in COMMON_FIELDS.items():
            value = overrides.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and (name == "learning_rate" or isinstance(value, int)):
                common[name] = overrides.pop(key)
        return {
            "name": f"{run.name or f'run {run.pk}'} (copy)", "project": run.project_id, "visibility": run.visibility,
            "agent": run.agent_id, "dataset": run.dataset_id, "reward": run.reward_id, "backend": run.backend_id,
            "model": run.model, **common, "overrides": overrides_text(overrides), "tags": ", ".join(run.tags),
            "notes": run.notes,
        }

    @staticmethod
    def initial_for_fork(parent: Run, step: int) -> dict[str, Any]:
        """A fork of ``parent`` from its checkpoint of ``step``: the parent's choices and config
        (``initial_from``), its model the checkpoint's weights."""
        return {**RunForm.initial_from(parent), "name": f"{parent.name or f'run {parent.pk}'} fork @{step}",
                "model": fork_choice(parent.pk, step)}

    def clean_visibility(self) -> str:
        return self.cleaned_data.get("visibility") or Run.Visibility.PRIVATE

    def clean_tags(self) -> list[str]:
        return parse_tags(self.cleaned_data.get("tags", ""))

    def clean_backend(self) -> Backend:
        backend = self.cleaned_data["backend"]
        why = self.fields["backend"].widget.unusable.get(backend.pk)
        if why:
            state = f"is {why}" if not backend.enabled else f"cannot run here: {why}"
            raise forms.ValidationError(f"Backend '{backend.name}' {state}; choose another.")
        return backend

    def clean_model(self) -> str:
        choice = self.cleaned_data["model"].strip()
        try:
            model_config(choice, self.user)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return choice

    def clean_overrides(self) -> dict[str, Any]:
        """Every problem of the overrides at once, each bad key with its line. The keys that pass
        (``checked_overrides``) still go through the backend's check, whose problems join these."""
        text = self.cleaned_data.get("overrides", "")
        overrides = parse_overrides_text(text)
        problems = []
        for name, key in COMMON_FIELDS.items():
            value = self.cleaned_data.get(name)
            if value is not None and key in overrides and overrides[key] != value:
                problems.append(f"{key} is set both in '{self.fields[name].label}' and here; keep one.")
            elif value is not None:
                overrides[key] = value
        problems += refused_overrides(overrides).values()
        limits.check_config_bounds(overrides, self.cleaned_data.get("backend"))
        self.checked_overrides, key_problems = check_each_key(permitted_overrides(overrides), text)
        if problems or key_problems:
            raise forms.ValidationError(problems + key_problems)
        return overrides

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if cleaned.get("visibility") == Run.Visibility.TEAM and not cleaned.get("project"):
            self.add_error("visibility", "A run without a project has no team to share it with; choose a project.")
        if self.user is not None:  # another project's entry: one its secrets do not go with (access.entry_problem)

            for name in ("agent", "dataset", "reward"):
                problem = cleaned.get(name) and entry_problem(self.user, cleaned[name], cleaned.get("project"))
                if problem:
                    self.add_error(name, problem)
        self.quota_full = quota_problem(self.user, cleaned.get("project")) if self.user is not None else None
        if self.quota_full is not None:  # said before the run's check, which would cost a child process for nothing
            self.add_error(None, self.quota_full)
        elif (skipped := self._why_not_checked()) is not None:
            self.add_error(None, f"The backend's check of the run did not run: {skipped}. Fix that and submit again.")
        else:  # beside the other fields' problems, so that one answer says everything
            self._validate_with_trainer({**cleaned, "overrides": getattr(self, "checked_overrides", cleaned.get("overrides"))})
        limits.cap_errors(self)
        return cleaned

    def _why_not_checked(self) -> str | None:
        """Why the run cannot be checked with the backend (a choice it builds from is wrong), or None."""
        wrong = [self[name].label.lower() for name in CHECK_NEEDS if name in self.errors]
        if wrong:
            return f"it needs a valid {', '.join(wrong)}"
        if "overrides" in self.errors and not hasattr(self, "checked_overrides"):
            return "the config overrides could not be read, or go beyond this platform's bounds"
        return None

    def save(self, owner) -> Run:
        """Create the validated run for ``owner`` and queue it (``submission.submit``: within the
        quota, which may have filled since ``clean``; ``QuotaExceeded`` then, nothing created). A fork
        (its model a run's checkpoint, ``run:<id>@<step>``) records its parent and step."""
        data = self.cleaned_data
        return submit(
            owner=owner, name=data["name"], project=data.get("project"), visibility=data["visibility"],
            agent=data["agent"], dataset=data["dataset"], reward=data["reward"], backend=data["backend"],
            model=data["model"], config_overrides=data["overrides"], tags=data["tags"], notes=data["notes"],
            spec=self.spec, **lineage(data["model"]),
        )

    def _validate_with_trainer(self, cleaned: dict[str, Any]) -> None:
        """Build the AgentTrainer exactly as the worker will, in a sandboxed child process (the
        registry code it imports never runs in this one), and put each problem next to its field."""
        overrides = cleaned.get("overrides") or {}
        try:
            kwargs = trainer_kwargs(
                agent=cleaned["agent"], dataset=cleaned["dataset"], reward=cleaned.get("reward"),
                backend=cleaned["backend"], model=cleaned["model"], overrides=overrides, run_path="", user=self.user,
            )
        except ValueError as exc:  # the chosen model changed since clean_model (moved, unregistered)
            self.add_error("model", str(exc))
            return
        answer = check_isolated(check_spec(kwargs, overrides))
        if answer["ok"]:
            self.final_config = answer["final_config"]
            self.spec = run_spec(kwargs, cleaned["dataset"])  # what every attempt trains
            return
        for problem in answer.get("problems") or [answer]:
            message = reward_named(problem["message"], cleaned.get("reward"))
            self.add_error(field_for_error(message, problem.get("key")), message)
