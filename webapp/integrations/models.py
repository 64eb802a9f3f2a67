"""A project's tracking targets (W&B, MLflow), alert rules (per project or per person) and the
outbox of alert deliveries.

Secrets (API keys, passwords, webhook URLs, which carry tokens) are stored sealed
(``webapp.integrations.secrets``) and never rendered back; forms only say whether one is set.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.integrations.secrets import seal, unseal
from webapp.integrations import targets


def without_credentials(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class TrackingTarget(models.Model):
    """Where a project's runs also report: a W&B project and entity, an MLflow tracking server."""

    project = models.OneToOneField("teams.Project", on_delete=models.CASCADE, related_name="tracking_target")
    wandb_project = models.CharField(max_length=200, blank=True, help_text="W&B project; empty: no W&B.")
    wandb_entity = models.CharField(max_length=200, blank=True, help_text="W&B team or user; empty: the API key's default.")
    wandb_base_url = models.URLField(blank=True, help_text="A W&B server of your own; empty: wandb.ai.")
    wandb_api_key_sealed = models.TextField(blank=True, editable=False)
    mlflow_tracking_uri = models.URLField(blank=True, help_text="MLflow tracking server (http/https); empty: no MLflow.")
    mlflow_username = models.CharField(max_length=200, blank=True)
    mlflow_password_sealed = models.TextField(blank=True, editable=False)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"tracking of {self.project}"

    @property
    def wandb_api_key(self) -> str:
        return unseal(self.wandb_api_key_sealed)

    @wandb_api_key.setter
    def wandb_api_key(self, value: str) -> None:
        self.wandb_api_key_sealed = seal(value)

    @property
    def mlflow_password(self) -> str:
        return unseal(self.mlflow_password_sealed)

    @mlflow_password.setter
    def mlflow_password(self, value: str) -> None:
        self.mlflow_password_sealed = seal(value)

    @property
    def mlflow_server(self) -> str:
        """The MLflow tracking URI without credentials (a URI with them is refused on save; one
        stored before that never reaches a page, a run's config or the tracker)."""
        return without_credentials(self.mlflow_tracking_uri)

    @property
    def wandb_server(self) -> str:
        return without_credentials(self.wandb_base_url)

    def loggers(self) -> list[str]:
        return [name for name, on in (("wandb", bool(self.wandb_project)), ("mlflow", bool(self.mlflow_tracking_uri))) if on]


class AlertRule(models.Model):
    """Who is told about which runs, when. A project's rule covers the project's runs (set by its
    owners and admins); a person's rule covers the runs they own."""

    class Event(models.TextChoices):
        FAILED = "failed", "fails"
        SUCCEEDED = "succeeded", "finishes"
        CANCELLED = "cancelled", "is cancelled"
        QUIET = "quiet", "goes quiet (no step for N minutes)"
        THRESHOLD = "threshold", "a metric crosses the threshold"

    class Op(models.TextChoices):
        BELOW = "<", "below"
        ABOVE = ">", "above"
        NAN = "nan", "is NaN or infinite"

    project = models.ForeignKey("teams.Project", on_delete=models.CASCADE, null=True, blank=True, related_name="alert_rules")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="alert_rules")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    name = models.CharField(max_length=100, blank=True)
    target_sealed = models.TextField(editable=False)
    target_label = models.CharField(max_length=200, editable=False, help_text="The target without its secret part.")
    events = models.JSONField(default=list)
    quiet_minutes = models.PositiveIntegerField(null=True, blank=True)
    metric = models.CharField(max_length=200, blank=True)
    op = models.CharField(max_length=3, choices=Op.choices, blank=True)
    threshold = models.FloatField(null=True, blank=True)
    after_step = models.PositiveIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(project__isnull=False, user__isnull=True) | models.Q(project__isnull=True, user__isnull=False),
                name="alert_rule_project_xor_user",
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"alert {self.pk} to {self.target_label}"

    @property
    def target(self) -> str:
        return unseal(self.target_sealed)

    @target.setter
    def target(self, value: str) -> None:
        self.target_sealed = seal(value)
        self.target_label = targets.target_label(value)

    @property
    def is_email(self) -> bool:
        return "://" not in self.target_label  # a webhook is always a URL (targets.check_target)

    def describe_threshold(self) -> str:
        if not self.metric:
            return ""
        condition = "is NaN or infinite" if self.op == self.Op.NAN else f"{self.op} {self.threshold:g}"
        return f"{self.metric} {condition}" + (f" after step {self.after_step}" if self.after_step else "")


class AlertDelivery(models.Model):
    """The outbox: one row per (rule, run, event), delivered at least once, retried with backoff."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"  # every attempt failed; shown on the project page

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="deliveries")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="alert_deliveries")
    # "failed", "threshold", ...; a monitor rule's crossing: "monitor:<rule id>@<step>" (one row per crossing).
    event = models.CharField(max_length=40)
    title = models.CharField(max_length=300)
    body = models.TextField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["rule", "run", "event"], name="one_delivery_per_rule_run_event")]

    def __str__(self) -> str:
        return f"{self.event} of run {self.run_id} to {self.rule.target_label}: {self.status}"
