"""What the API reads and writes. Run creation goes through ``RunForm`` (the same validation as
the page: the ``AgentTrainer`` is built in a scratch directory), so these only shape JSON."""

from __future__ import annotations

import json
import math
from typing import Any

from rest_framework import serializers

from webapp.fleet.queues import QueueBoard
from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction
from webapp.policy import limits
from webapp.runs import table
from webapp.runs.models import MAX_STEP, Run, RunLog
from webapp.runs.forks import optimizer_note
from webapp.runs.trainer_args import shown_spec
from webapp.teams.models import Project

MAX_KEY_LENGTH = 200
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _no_nul(value: Any, what: str) -> None:
    """Postgres cannot store NUL characters in text or JSON; say so instead of failing with a 500."""
    if "\\u0000" in json.dumps(value):
        raise serializers.ValidationError(f"{what} must not contain NUL (\\u0000) characters.")


class ProjectSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Project
        fields = ["id", "team", "name", "description"]


class AgentSerializer(serializers.ModelSerializer):
    tools = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)

    class Meta:
        model = Agent
        fields = ["id", "name", "description", "kind", "workflow_class", "agent_class", "env_class",
                  "system_prompt", "llm_config", "tools", "project"]


class DatasetSerializer(serializers.ModelSerializer):
    class Meta:
        model = Dataset
        fields = ["id", "name", "description", "source", "identifier", "train_split", "val_split", "column_mapping", "project"]


class ModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = Model
        fields = ["id", "name", "description", "source", "identifier", "tokenizer", "trust_remote_code", "project"]


class RewardFunctionSerializer(serializers.ModelSerializer):
    class Meta:
        model = RewardFunction
        fields = ["id", "name", "description", "path", "project"]


class BackendSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField(help_text='{"environment": problem or null, "credentials": problem or null}')

    class Meta:
        model = Backend
        fields = ["id", "name", "processor", "enabled", "queue", "needs_gpu", "default_config", "max_concurrent_runs", "status"]

    def get_status(self, backend: Backend) -> dict[str, str | None]:
        return backend.environment_status()


class RunSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    agent = serializers.SlugRelatedField(slug_field="name", read_only=True)
    dataset = serializers.SlugRelatedField(slug_field="name", read_only=True)
    reward = serializers.SlugRelatedField(slug_field="name", read_only=True)
    backend = serializers.SlugRelatedField(slug_field="name", read_only=True)
    url = serializers.CharField(source="get_absolute_url", read_only=True)
    value_ranges = serializers.JSONField(
        read_only=True, help_text="Each metric's lowest and highest finite value so far: {key: {min, max}}.")
    warnings = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="A succeeded run that learnt nothing (its reward the same at every step): each names the likely cause.",
    )
    spec = serializers.SerializerMethodField(
        help_text="What the run trains, resolved and validated once when it was submitted (the AgentTrainer "
                  "arguments, the merged config among them): every attempt trains exactly this. The registry's "
                  "arguments of the agent, environment or workflow are hidden. Null: a run from before specs, "
                  "or an external run, until its first attempt.",
    )
    fork_note = serializers.SerializerMethodField(
        help_text="A fork: what it started from and what it carried over (its weights; whether its optimizer "
                  "state came too); empty for a run that is no fork.",
    )
    waiting = serializers.SerializerMethodField(
        help_text="A queued run: what it waits for (its place in its queue and the runs ahead, or that no worker "
                  "serves its queue); empty otherwise.",
    )

    class Meta:
        model = Run
        fields = [
            "id", "url", "name", "owner", "project", "visibility", "kind", "status", "tags", "notes",
            "agent", "dataset", "reward", "backend", "model", "config_overrides", "spec", "parent", "parent_step", "fork_note",
            "created_at", "started_at", "heartbeat_at", "finished_at", "cancel_requested_at",
            "worker", "steps", "error", "traceback", "warnings", "waiting", "final_metrics", "value_ranges", "remote_ids",
        ]
        read_only_fields = [f for f in fields if f not in ("visibility", "tags", "notes")]

    def get_spec(self, run: Run) -> dict | None:
        return shown_spec(run.spec)

    def get_fork_note(self, run: Run) -> str:
        return optimizer_note(run)

    def get_waiting(self, run: Run) -> str:
        if run.status != Run.Status.QUEUED:
            return ""
        if "queue_board" not in self.context:  # one read of the queues for a whole page of runs
            self.context["queue_board"] = QueueBoard.load()
        request = self.context.get("request")
        return self.context["queue_board"].run_waiting(run, request.user if request else None)


class RunUpdateSerializer(serializers.ModelSerializer):
    """PATCH: what may change on an existing run."""

    tags = serializers.ListField(child=serializers.CharField(max_length=100), max_length=50, required=False)
    notes = serializers.CharField(max_length=limits.MAX_NOTES_CHARS, required=False, allow_blank=True)

    class Meta:
        model = Run
        fields = ["visibility", "tags", "notes"]

    def validate_visibility(self, value: str) -> str:
        if value == Run.Visibility.TEAM and not self.instance.project_id:
            raise serializers.ValidationError("A run without a project has no team to share it with.")
        return value


class RunCreateSerializer(serializers.Serializer):
    """A platform run (validated and queued like the form) or an external one (trained elsewhere,
    reported through the metrics/logs/finish endpoints)."""

    kind = serializers.ChoiceField(choices=Run.Kind.choices, default=Run.Kind.PLATFORM)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    project = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    visibility = serializers.ChoiceField(choices=Run.Visibility.choices, default=Run.Visibility.PRIVATE)
    agent = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="Agent name.")
    dataset = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="Dataset name.")
    reward = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="Reward function name.")
    backend = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="Backend name.")
    model = serializers.CharField(
        max_length=100, required=False, allow_blank=True, default="",
        help_text="A registered model's name (GET /api/models/) or run:<id>, the model a run you may see trained.",
    )
    overrides = serializers.DictField(
        required=False, default=dict,
        help_text='Config overrides, flat dotted keys or nested: {"trainer.total_training_steps": 3}.',
    )
    tags = serializers.ListField(child=serializers.CharField(max_length=100), max_length=50, required=False, default=list)
    notes = serializers.CharField(max_length=limits.MAX_NOTES_CHARS, required=False, allow_blank=True, default="")

    def validate_overrides(self, value: dict) -> dict:
        _no_nul(value, "overrides")
        limits.check_json_overrides(value)
        return value


class RunForkSerializer(serializers.Serializer):
    """A fork of a run from one of its stored checkpoints: the parent's choices and config, each
    changed where given."""

    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP, help_text="The step of the parent's checkpoint to start from.")
    overrides = serializers.DictField(
        required=False, default=dict,
        help_text='Config keys changed from the parent\'s, flat dotted keys or nested: {"actor_rollout_ref.actor.optim.lr": 1e-6}.',
    )
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="", help_text="Default: '<parent> fork @<step>'.")
    project = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=2**62,
        help_text="Project id of the fork; null: a personal run; left out: the parent's project.",
    )
    visibility = serializers.ChoiceField(choices=Run.Visibility.choices, required=False,
                                         help_text="Default: the parent's in its project, else private.")
    agent = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="Agent name or id; default: the parent's.")
    dataset = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="Dataset name or id; default: the parent's.")
    reward = serializers.CharField(max_length=100, required=False, allow_blank=True, default="", help_text="Reward function name; default: the parent's.")
    notes = serializers.CharField(max_length=limits.MAX_NOTES_CHARS, required=False, allow_blank=True, default="")

    def validate_overrides(self, value: dict) -> dict:
        _no_nul(value, "overrides")
        limits.check_json_overrides(value)
        return value


class MetricStepSerializer(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP)
    metrics = serializers.DictField(child=serializers.FloatField(allow_null=True), allow_empty=False)

    def validate_metrics(self, value: dict) -> dict:
        for key in value:
            if not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
                raise serializers.ValidationError(f"Metric names are 1 to {MAX_KEY_LENGTH} characters, without NUL.")
        return value


class MetricsIngestSerializer(serializers.Serializer):
    steps = MetricStepSerializer(many=True, allow_empty=False, max_length=10000)


class LogLineSerializer(serializers.ModelSerializer):
    level = serializers.ChoiceField(choices=LOG_LEVELS, default="INFO")

    class Meta:
        model = RunLog
        fields = ["id", "time", "level", "message"]
        read_only_fields = ["id", "time"]


class LogsIngestSerializer(serializers.Serializer):
    lines = LogLineSerializer(many=True, allow_empty=False, max_length=5000)


class FinishSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[s.value for s in Run.FINAL])
    error = serializers.CharField(required=False, allow_blank=True, default="")
    final_metrics = serializers.DictField(child=serializers.FloatField(allow_null=True), required=False, default=dict)

    def validate_final_metrics(self, value: dict) -> dict:
        _no_nul(value, "final_metrics")
        return value


class HeartbeatSerializer(serializers.Serializer):
    status = serializers.CharField()
    cancel_requested = serializers.BooleanField()


class RunListQuerySerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Run.Status.choices, required=False)
    kind = serializers.ChoiceField(choices=Run.Kind.choices, required=False)
    project = serializers.IntegerField(required=False, min_value=1, max_value=2**62)
    parent = serializers.IntegerField(required=False, min_value=1, max_value=2**62, help_text="Only the forks of this run.")
    tag = serializers.CharField(required=False, max_length=100)
    q = serializers.CharField(required=False, max_length=200)
    ordering = serializers.CharField(
        required=False, max_length=250,
        help_text="As the runs table sorts: created (default -created), name, status, steps, ..., "
                  "metric:<key>:latest|max|min or config:<dotted key>; '-' in front for descending. Empty values last.",
    )

    def validate_ordering(self, value: str) -> str:
        try:
            table.parse_sort(value)
        except table.BadColumn as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class SeriesQuerySerializer(serializers.Serializer):
    keys = serializers.CharField(required=False, allow_blank=True, help_text="Comma-separated metric names; default: all.")
    start = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP)
    end = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP)
    points = serializers.IntegerField(required=False, min_value=8, max_value=5000, default=1500)


class AfterQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(required=False, default=0, min_value=-1, max_value=2**62)


# The bounds of the episode store's filters (``GET /api/runs/<id>/episodes/``).
MAX_EPISODE_PAGE = 500
MAX_EPISODE_OFFSET = 1_000_000
MAX_EPISODE_REWARD = 1e12
MAX_EPISODE_TEXT = 200


class EpisodeQuerySerializer(serializers.Serializer):
    """The episode store's filters and page, each bounded: a value out of bounds is a 400 naming it."""

    split = serializers.ChoiceField(choices=["train", "val"], required=False, help_text="train or val; default both.")
    step_min = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP)
    step_max = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP)
    reward_min = serializers.FloatField(required=False, min_value=-MAX_EPISODE_REWARD, max_value=MAX_EPISODE_REWARD)
    reward_max = serializers.FloatField(required=False, min_value=-MAX_EPISODE_REWARD, max_value=MAX_EPISODE_REWARD)
    termination = serializers.ChoiceField(
        choices=["env_done", "max_turns", "max_prompt_length", "max_response_length", "timeout", "error", "unknown"],
        required=False, help_text="The termination reason.")
    data_source = serializers.CharField(required=False, max_length=200)
    group = serializers.CharField(required=False, max_length=64, help_text="The prompt's group (its uid).")
    row_index = serializers.IntegerField(required=False, min_value=0, max_value=2**62,
                                         help_text="The task's row in the dataset: one prompt across training.")
    drift = serializers.BooleanField(required=False, allow_null=True, default=None,
                                     help_text="true: episodes whose conversation, rendered again through the chat "
                                               "template, gives back other token ids than those generated; false: "
                                               "checked and equal.")
    q = serializers.CharField(required=False, max_length=MAX_EPISODE_TEXT,
                              help_text="Text in the conversation (its first 2,000 characters), case-insensitive.")
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=MAX_EPISODE_PAGE)
    offset = serializers.IntegerField(required=False, default=0, min_value=0, max_value=MAX_EPISODE_OFFSET)
    format = serializers.ChoiceField(choices=["json", "jsonl", "parquet"], required=False, default="json",
                                     help_text="json: a page; jsonl or parquet: the whole filtered set, streamed.")
    after_id = serializers.IntegerField(required=False, min_value=0, max_value=2**63 - 1, help_text=(
        "Only episodes whose id is above it: where an export cut at its time limit goes on (its note's last_id)."))
    cursor = serializers.RegexField(r"^[0-9]{1,10}:(train|val):[0-9]{1,10}$", required=False, help_text=(
        "step:split:position of the last episode listed: the page after it (a page's next link carries it)."))
    share = serializers.CharField(required=False, max_length=100, help_text="A share link's token (read-only access).")

    def validate(self, data):
        errors = {}
        for low, high in (("step_min", "step_max"), ("reward_min", "reward_max")):
            if data.get(low) is not None and data.get(high) is not None and data[low] > data[high]:
                errors[low] = [f"must not be above {high} ({data[high]})."]
        for name in ("reward_min", "reward_max"):
            if data.get(name) is not None and not math.isfinite(data[name]):
                errors[name] = ["must be a finite number."]
        for name in ("data_source", "group", "q"):
            if "\x00" in data.get(name, ""):
                errors[name] = ["must not contain a NUL character."]
        if data.get("cursor"):
            step, split, position = data["cursor"].split(":")
            if int(step) > MAX_STEP or int(position) > 2**31 - 1:
                errors["cursor"] = [f"step must not be above {MAX_STEP}, position not above {2**31 - 1}."]
            data["cursor"] = (int(step), split, int(position))
        if errors:
            raise serializers.ValidationError(errors)
        return data


MAX_HISTOGRAM_BINS = 100


class HistogramQuerySerializer(serializers.Serializer):
    """One step's reward histogram (``GET /api/runs/<id>/episodes/histogram/``)."""

    step = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP,
                                    help_text="The step; default: the last step stored.")
    split = serializers.ChoiceField(choices=["train", "val"], required=False, default="train")
    bins = serializers.IntegerField(required=False, default=20, min_value=1, max_value=MAX_HISTOGRAM_BINS)
    share = serializers.CharField(required=False, max_length=100, help_text="A share link's token (read-only access).")


class LedgerQuerySerializer(serializers.Serializer):
    """The ledger's step window (at most ``webapp.dashboard.ledger.MAX_LEDGER_STEPS`` steps)."""

    step_min = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP,
                                        help_text="The window's first step; default: the last steps stored.")
    step_max = serializers.IntegerField(required=False, min_value=0, max_value=MAX_STEP)
    share = serializers.CharField(required=False, max_length=100, help_text="A share link's token (read-only access).")

    def validate(self, data):
        if data.get("step_min") is not None and data.get("step_max") is not None and data["step_min"] > data["step_max"]:
            raise serializers.ValidationError({"step_min": [f"must not be above step_max ({data['step_max']})."]})
        return data
