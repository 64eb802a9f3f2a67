"""The reward-health alert rules a project turns on (``webapp.monitors.health`` computes what they
watch)."""

from __future__ import annotations

from django.conf import settings
import math

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

# The widest window a rule may average over (steps); the monitors read at most MAX_MONITOR_STEPS.
MAX_WINDOW = 100
# A threshold is a share, a ratio or a reward difference: anything past this is a typing slip.
MAX_THRESHOLD = 1e6


def check_threshold(value: float) -> None:
    """The form's and the API's check of a rule's threshold."""
    if value is None or not math.isfinite(value) or abs(value) > MAX_THRESHOLD:
        raise ValidationError(f"must be a finite number between -{MAX_THRESHOLD:g} and {MAX_THRESHOLD:g}.")


class Monitor(models.TextChoices):
    """What a monitor measures at each step; a rule fires where that value is above its threshold."""

    RESPONSE_LENGTH_DRIFT = "response_length_drift", "Response length drift"
    ALL_EQUAL_GROUPS = "all_equal_groups", "All-equal-reward groups"
    ENTROPY_COLLAPSE = "entropy_collapse", "Entropy collapse"
    KL_SPIKE = "kl_spike", "KL spike"
    CLIP_FRACTION_SPIKE = "clip_fraction_spike", "Clip-fraction spike"
    COMPONENT_DOMINANCE = "component_dominance", "One reward component dominates"
    VALIDATION_DIVERGENCE = "validation_divergence", "Validation below training reward"


class MonitorRule(models.Model):
    """One alert rule of a project: ``monitor`` above ``threshold``, the monitor computed over a
    ``window`` of steps. One rule per monitor and project."""

    project = models.ForeignKey("teams.Project", on_delete=models.CASCADE, related_name="monitor_rules")
    monitor = models.CharField(max_length=40, choices=Monitor.choices)
    threshold = models.FloatField(validators=[check_threshold])
    window = models.PositiveIntegerField(default=5, validators=[MinValueValidator(1), MaxValueValidator(MAX_WINDOW)])
    enabled = models.BooleanField(default=True)
    # Where a crossing is also delivered: one of the project's alert rules (its target). None: the
    # rule is shown on the run page only.
    alert = models.ForeignKey("integrations.AlertRule", on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="monitor_rules",
                              help_text="The project's alert rule whose target is told; empty: shown on the run page only.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "monitor"]
        constraints = [models.UniqueConstraint(fields=["project", "monitor"], name="one_rule_per_monitor")]

    def __str__(self) -> str:
        return f"{self.get_monitor_display()} > {self.threshold} over {self.window} step(s) in {self.project}"


class MonitorCheck(models.Model):
    """How far the housekeeping's monitor check has read a run: its ``metrics_at`` when last read, so
    a run with no new metric point is not computed again."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="monitor_check")
    metrics_at = models.DateTimeField()
    checked_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"monitors of run {self.run_id} read through {self.metrics_at}"
