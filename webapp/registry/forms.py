"""What project members add to the registry from the browser: datasets (an uploaded file, its
columns mapped, a test share held out) and chat agents written without code (AWorld's agent YAML
fields). Code (agent classes, rewards, backends, tools) stays with administrators."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from webapp.registry import uploads
from webapp.registry.models import Agent, Dataset, Model, PendingUpload, Tool

# Column names that usually hold each role, to start the mapping with a good guess.
GUESSES = {
    "prompt": ("prompt", "question", "input", "instruction", "query", "problem", "text"),
    "ground_truth": ("ground_truth", "answer", "output", "target", "label", "solution", "response"),
}


# A chat agent's text is sent with every episode and shown on pages: bounded like a run's notes.
MAX_SYSTEM_PROMPT_CHARS = 20_000
MAX_DESCRIPTION_CHARS = 2_000


def _free_name(name: str, model, project) -> str:
    """``name`` unless an entry of ``project`` or a shared one has it (entries of other projects
    do not count, and are never mentioned)."""
    clash = model.objects.usable_in(project).filter(name=name).first()
    if clash is None:
        return name
    raise ValidationError(f"The name {name!r} is taken {'in this project' if clash.project_id else 'by a shared entry'}; "
                          "choose another.")


class DatasetUploadForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="Letters, digits, hyphens and underscores; how runs name it.")
    description = forms.CharField(max_length=MAX_DESCRIPTION_CHARS, required=False, widget=forms.Textarea(attrs={"rows": 2}))
    file = forms.FileField(help_text="A .csv (first line: column names), .jsonl (one JSON object per line) or .parquet file.")

    def __init__(self, *args: Any, project, owner, too_large: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.project, self.owner, self.too_large = project, owner, too_large
        self.fields["file"].help_text += f" At most {settings.DATASET_UPLOAD_MAX_BYTES / 1024 / 1024:.0f} MB " \
                                         f"and {settings.DATASET_UPLOAD_MAX_ROWS:,} rows."
        self.kind = ""

    def clean_name(self) -> str:
        return _free_name(self.cleaned_data["name"], Dataset, self.project)

    def clean_file(self):
        upload = self.cleaned_data["file"]
        try:
            self.kind = uploads.format_of(upload.name)
        except uploads.UploadError as exc:
            raise ValidationError(str(exc)) from None
        return upload

    def clean(self) -> dict[str, Any]:
        if self.too_large:  # the handler stopped reading it: the field saw no file
            self.errors.pop("file", None)
            self.add_error("file", f"The file is larger than the limit of {settings.DATASET_UPLOAD_MAX_BYTES:,} bytes.")
        waiting = uploads.pending_count(self.owner)
        if waiting >= uploads.PENDING_PER_PERSON:
            raise ValidationError(
                f"You have {waiting} uploads waiting for their columns, the limit of {uploads.PENDING_PER_PERSON}: "
                "map or discard one of them (listed below) first; they are deleted after a day.")
        return self.cleaned_data

    def receive(self) -> PendingUpload | None:
        """The upload, read and kept until its columns are mapped (``PendingUpload``); None, with
        the error under the file field, when the file is refused."""
        data = self.cleaned_data
        try:
            return uploads.receive(data["file"], self.kind, owner=self.owner, project=self.project,
                                   name=data["name"], description=data["description"])
        except uploads.UploadError as exc:
            self.add_error("file", str(exc))
            return None


class ColumnMappingForm(forms.Form):
    prompt = forms.ChoiceField(help_text="What the agent is asked: single-turn and chat agents read this column.")
    ground_truth = forms.ChoiceField(
        required=False,
        help_text="What the reward compares the answer against (exact-match, math, char-accuracy). Empty: none.",
    )
    test_percent = forms.IntegerField(
        min_value=0, max_value=50, initial=10, label="Test share (%)",
        help_text="Rows held out (at random, the same every time) to score the model on; 0: no test set.",
    )

    def __init__(self, *args: Any, pending: PendingUpload, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending = pending
        choices = [(column, column) for column in pending.columns]
        self.fields["prompt"].choices = choices
        self.fields["ground_truth"].choices = [("", "— none —")] + choices
        for role, names in GUESSES.items():
            guess = next((c for name in names for c in pending.columns if c.lower() == name), None)
            if guess is not None:
                self.fields[role].initial = guess
        self.test: set[int] = set()

    def mapping(self) -> dict[str, str]:
        return {role: self.cleaned_data[role] for role in ("prompt", "ground_truth") if self.cleaned_data.get(role)}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        if cleaned.get("ground_truth") and cleaned["ground_truth"] == cleaned["prompt"]:
            self.add_error("ground_truth", "The answer column must differ from the prompt column.")
            return cleaned
        try:
            _free_name(self.pending.name, Dataset, self.pending.project)
        except ValidationError:
            raise ValidationError(f"The name {self.pending.name!r} was taken meanwhile; upload again with another name.") from None
        try:
            uploads.check_mapping(self.pending, self.mapping())
            self.test = uploads.test_rows(self.pending.row_count, cleaned["test_percent"] / 100)
        except uploads.UploadError as exc:
            raise ValidationError(str(exc)) from None
        return cleaned


class ModelChoiceByName(forms.ModelChoiceField):
    def label_from_instance(self, model: Model) -> str:
        return f"{model.name} ({model.identifier})"


class ChatAgentForm(forms.ModelForm):
    """A chat agent without code: AWorld's agent YAML fields (name, description, system_prompt,
    llm_config's llm_model_name and llm_temperature, tool_names among the administrators' tools)."""

    model = ModelChoiceByName(
        Model.objects.none(), to_field_name="name",
        help_text="llm_model_name: the policy trained; the run form starts with it. Administrators register models.",
    )
    temperature = forms.FloatField(
        min_value=0.01, max_value=5, initial=1.0, label="Temperature",
        help_text="llm_temperature: sampling temperature while training.",
    )

    system_prompt = forms.CharField(
        max_length=MAX_SYSTEM_PROMPT_CHARS, widget=forms.Textarea(attrs={"rows": 6}),
        help_text=f"system_prompt: the agent's instructions, sent first in every episode (at most {MAX_SYSTEM_PROMPT_CHARS:,} characters).",
    )
    description = forms.CharField(max_length=MAX_DESCRIPTION_CHARS, required=False, widget=forms.Textarea(attrs={"rows": 2}))

    class Meta:
        model = Agent
        fields = ["name", "description", "system_prompt", "model", "temperature", "tools"]
        widgets = {"tools": forms.CheckboxSelectMultiple}
        help_texts = {"tools": "tool_names: functions the agent may call, as administrators registered them."}

    def __init__(self, *args: Any, user=None, project=None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.project = project
        self.fields["model"].queryset = Model.objects.visible_to(user)
        self.fields["tools"].queryset = Tool.objects.all()
        self.fields["tools"].label_from_instance = lambda tool: f"{tool.name}: {tool.description or tool.path}"

    def clean_name(self) -> str:
        return _free_name(self.cleaned_data["name"], Agent, self.project)

    def save_for_project(self) -> Agent:
        """The agent in the form's project: its model config in AWorld's names."""
        agent = self.save(commit=False)
        agent.project = self.project
        agent.llm_config = {"llm_model_name": self.cleaned_data["model"].name,
                            "llm_temperature": self.cleaned_data["temperature"]}
        agent.full_clean()
        agent.save()
        self.save_m2m()
        return agent
