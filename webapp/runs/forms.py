"""The run creation form: registry choices, a model, and config overrides, validated by the same
``AgentTrainer`` construction the worker will do, so a run that would fail validation is never queued."""

from __future__ import annotations

import re
import tempfile
from typing import Any

import yaml
from django import forms

from webapp.registry.models import Agent, Backend, Dataset, RewardFunction
from webapp.runs.models import Run
from webapp.runs.trainer_args import ADMIN_ONLY_KEYS, MODEL_KEY, field_for_error, trainer_kwargs
from webapp.teams.models import Project

_KEY_VALUE_LINE = re.compile(r"^\s*[A-Za-z_][\w.\-]*\s*=")


def parse_overrides_text(text: str) -> dict[str, Any]:
    """``key=value`` lines (values parsed as YAML scalars, like Hydra) or a YAML mapping -> flat dotted keys.

    Raises ``forms.ValidationError`` saying which line is wrong.
    """
    from training.config import ConfigError, flatten, parse_overrides

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


def overrides_text(overrides: dict[str, Any]) -> str:
    """Flat overrides as the YAML mapping ``parse_overrides_text`` reads back to the same values."""
    return yaml.safe_dump(overrides, default_flow_style=False, sort_keys=False) if overrides else ""


def parse_tags(text: str) -> list[str]:
    """``"a, b,,a"`` -> ``["a", "b"]`` (order kept, duplicates dropped)."""
    return list(dict.fromkeys(tag.strip() for tag in text.split(",") if tag.strip()))


class RunEditForm(forms.ModelForm):
    """What can change on an existing run: its tags, notes and who sees it."""

    tags = forms.CharField(max_length=500, required=False, help_text="Comma separated.")

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


class BackendChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, backend: Backend) -> str:
        suffix = "" if backend.enabled else " (disabled)"
        return f"{backend.name} — {backend.processor}, {backend.queue} queue{suffix}"


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
        max_length=500, required=False,
        help_text="Hub id or path of the policy model ('tiny-char' builds a tiny model in code); empty: the backend's default.",
    )
    overrides = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
        help_text="One key=value per line (data.train_batch_size=4) or a YAML mapping.",
    )
    tags = forms.CharField(max_length=500, required=False, help_text="Comma separated.")
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args: Any, user=None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.final_config: dict[str, Any] | None = None
        if user is not None:  # the registry entries and projects this user may use
            from webapp.runs.access import projects_for

            for name, model in (("agent", Agent), ("dataset", Dataset), ("reward", RewardFunction)):
                self.fields[name].queryset = model.objects.visible_to(user)
            self.fields["project"].queryset = projects_for(user, "run")

    @staticmethod
    def initial_from(run: Run) -> dict[str, Any]:
        """A run's choices and config as the initial data of a new run (clone)."""
        return {
            "name": f"{run.name or f'run {run.pk}'} (copy)", "project": run.project_id, "visibility": run.visibility,
            "agent": run.agent_id, "dataset": run.dataset_id, "reward": run.reward_id, "backend": run.backend_id,
            "model": run.model, "overrides": overrides_text(run.config_overrides), "tags": ", ".join(run.tags),
            "notes": run.notes,
        }

    def clean_visibility(self) -> str:
        return self.cleaned_data.get("visibility") or Run.Visibility.PRIVATE

    def clean_tags(self) -> list[str]:
        return parse_tags(self.cleaned_data.get("tags", ""))

    def clean_backend(self) -> Backend:
        backend = self.cleaned_data["backend"]
        if not backend.enabled:
            raise forms.ValidationError(f"Backend '{backend.name}' is disabled by an administrator; choose another.")
        return backend

    def clean_overrides(self) -> dict[str, Any]:
        overrides = parse_overrides_text(self.cleaned_data.get("overrides", ""))
        if MODEL_KEY in overrides and self.data.get("model"):
            raise forms.ValidationError(f"{MODEL_KEY} is set both here and in Model; keep one.")
        for key, what in ADMIN_ONLY_KEYS.items():
            if key in overrides:
                raise forms.ValidationError(f"{key}: {what} is chosen by the backend's administrator, not per run.")
        return overrides

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if cleaned.get("visibility") == Run.Visibility.TEAM and not cleaned.get("project"):
            self.add_error("visibility", "A run without a project has no team to share it with; choose a project.")
        if not self.errors:
            self._validate_with_trainer(cleaned)
        return cleaned

    def save(self, owner) -> Run:
        """Create the validated run for ``owner`` and queue it."""
        data = self.cleaned_data
        run = Run.objects.create(
            owner=owner, name=data["name"], project=data.get("project"), visibility=data["visibility"],
            agent=data["agent"], dataset=data["dataset"], reward=data["reward"], backend=data["backend"],
            model=data["model"], config_overrides=data["overrides"], tags=data["tags"], notes=data["notes"],
            status=Run.Status.QUEUED,
        )
        run.enqueue()
        return run

    def _validate_with_trainer(self, cleaned: dict[str, Any]) -> None:
        """Build the AgentTrainer exactly as the worker will (in a scratch directory) and put each
        problem next to its field."""
        from training.trainer import AgentTrainer

        with tempfile.TemporaryDirectory(prefix="run-validate-") as scratch:
            kwargs = trainer_kwargs(
                agent=cleaned["agent"], dataset=cleaned["dataset"], reward=cleaned.get("reward"),
                backend=cleaned["backend"], model=cleaned.get("model", ""),
                overrides=cleaned.get("overrides") or {}, run_path=scratch,
            )
            try:
                trainer = AgentTrainer(**kwargs)
            except ValueError as exc:
                self.add_error(field_for_error(exc), str(exc))
                return
            except Exception as exc:  # user code imported during validation can raise anything
                self.add_error(field_for_error(exc), f"Validation raised {exc.__class__.__name__}: {exc}")
                return
            final = trainer.final_config
            self.final_config = final.to_dict() if hasattr(final, "to_dict") else None
