"""What a person may ask the playground: every field bounded (members are untrusted), every error
named. Token counts are checked again by the worker, which has the tokenizer."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from webapp.playground.models import PlaygroundRequest
from webapp.runs import downloads
from webapp.runs.models import Run

MAX_MESSAGES = 40
MAX_PROMPT_CHARS = 16_000
MAX_ROW_INDEX = 10_000_000
ROLES = ("system", "user", "assistant")
SPLITS = ("train", "test")


def model_choices(run: Run) -> list[tuple[str, str]]:
    """The run's saved models, newest first (the final model, then checkpoints by step)."""
    found = downloads.archives(run)
    return [(a["name"], a["label"]) for a in reversed(found)]


class AskForm(forms.Form):
    kind = forms.ChoiceField(choices=PlaygroundRequest.Kind.choices, initial=PlaygroundRequest.Kind.CHAT)
    model = forms.ChoiceField(label="Weights", help_text="Which of the run's saved models answers.")
    messages = forms.JSONField(required=False, help_text="Chat: the conversation, the last message the person's.")
    split = forms.ChoiceField(choices=[(s, s) for s in SPLITS], required=False, initial="test")
    row = forms.IntegerField(required=False, min_value=0, max_value=MAX_ROW_INDEX, label="Row")
    temperature = forms.FloatField(min_value=0, max_value=2, initial=0, required=False,
                                   help_text="0: greedy (the same answer every time).")

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run
        self.fields["model"].choices = model_choices(run)
        limit = settings.PLAYGROUND_MAX_NEW_TOKENS  # read per form: tests and admins change it
        self.fields["max_new_tokens"] = forms.IntegerField(
            min_value=1, max_value=limit, initial=min(64, limit), label="Max new tokens", help_text=f"At most {limit}.",
        )

    def clean_messages(self) -> list[dict[str, str]]:
        value = self.cleaned_data.get("messages")
        if value in (None, ""):
            return []
        if not isinstance(value, list):
            raise forms.ValidationError("The conversation is a list of {role, content} messages.")
        if len(value) > MAX_MESSAGES:
            raise forms.ValidationError(f"At most {MAX_MESSAGES} messages; start a new conversation.")
        messages, size = [], 0
        for number, message in enumerate(value, 1):
            if not isinstance(message, dict) or set(message) - {"role", "content"} \
                    or message.get("role") not in ROLES or not isinstance(message.get("content"), str):
                raise forms.ValidationError(
                    f"Message {number}: a message is {{\"role\": one of {', '.join(ROLES)}, \"content\": text}}."
                )
            if message["role"] == "system" and number != 1:
                raise forms.ValidationError(f"Message {number}: only the first message may be the system prompt.")
            size += len(message["content"])
            messages.append({"role": message["role"], "content": message["content"]})
        if size > MAX_PROMPT_CHARS:
            raise forms.ValidationError(f"The conversation is {size} characters; at most {MAX_PROMPT_CHARS}. Start a new one.")
        return messages

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        kind = cleaned.get("kind")
        if kind == PlaygroundRequest.Kind.CHAT:
            messages = cleaned.get("messages") or []
            if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
                self.add_error("messages", "Write a message first: the conversation must end with yours.")
        elif kind == PlaygroundRequest.Kind.ROW:
            if cleaned.get("row") is None:
                self.add_error("row", "Give the index of the dataset row (0 is the first).")
            if not cleaned.get("split"):
                cleaned["split"] = "test"
            if self.run.kind != Run.Kind.PLATFORM or self.run.agent_id is None or self.run.dataset_id is None:
                self.add_error("kind", "This run was trained outside the platform: it has no agent or dataset to run here.")
        if cleaned.get("temperature") is None:
            cleaned["temperature"] = 0.0
        return cleaned

    def save(self, user) -> PlaygroundRequest:
        data = self.cleaned_data
        chat = data["kind"] == PlaygroundRequest.Kind.CHAT
        return PlaygroundRequest.objects.create(
            run=self.run, user=user, kind=data["kind"], model_name=data["model"],
            messages=data["messages"] if chat else [], split="" if chat else data["split"],
            row_index=None if chat else data["row"], max_new_tokens=data["max_new_tokens"],
            temperature=data["temperature"], queue=playground_queue(self.run),
        )


def playground_queue(run: Run) -> str:
    """Where a question to ``run`` goes: the playground's own queue when the platform has one
    (``PLAYGROUND_QUEUE``: it answers while runs train), else a slot of the queue its runs use."""
    return settings.PLAYGROUND_QUEUE or (run.backend.queue if run.backend else "cpu")
