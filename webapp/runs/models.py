"""A run's whole life on its row (queued -> running -> succeeded | failed | cancelled), and what it
reports: metric points, log lines, checkpoints.

State changes are filtered ``update()`` calls that return whether the row changed, so two workers
can never both claim a run and a late writer never overwrites a final status.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.dispatch import Signal
from django.urls import reverse
from django.utils import timezone

from webapp.registry.models import Agent, Backend, Dataset, RewardFunction


# Sent after a run's status changed (kwargs: run). The dashboard pushes it to live viewers.
run_status_changed = Signal()


class RunQuerySet(models.QuerySet):
    def visible_to(self, user) -> "RunQuerySet":
        """Runs ``user`` may see: the same rule as ``access.can(user, run, "view")``, as a query."""
        from webapp.teams.models import teams_of

        if user.is_superuser:
            return self
        if not user.is_authenticated:
            return self.none()
        shared = models.Q(visibility=Run.Visibility.TEAM, project__team__in=teams_of(user))
        return self.filter(models.Q(owner=user) | shared)

    def with_tag(self, tag: str) -> "RunQuerySet":
        # The JSON text holds each tag quoted; this works on SQLite, where JSON ``contains`` does not.
        return self.filter(tags__icontains=json.dumps(tag))

    def mark_stale_failed(self) -> int:
        """Fail running runs whose worker stopped sending heartbeats (it died or lost the machine)."""
        cutoff = timezone.now() - timedelta(seconds=settings.RUN_STALE_SECONDS)
        return self.filter(status=Run.Status.RUNNING, heartbeat_at__lt=cutoff).update(
            status=Run.Status.FAILED,
            finished_at=timezone.now(),
            error=f"The worker stopped sending heartbeats for over {settings.RUN_STALE_SECONDS} s; it probably died.",
        )


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Visibility(models.TextChoices):
        PRIVATE = "private", "Private (owner only)"
        TEAM = "team", "Team (the project's team)"

    class Kind(models.TextChoices):
        PLATFORM = "platform"  # queued here, trained by a worker
        EXTERNAL = "external"  # trained anywhere (a notebook, a cluster job), reported over the API

    FINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200, blank=True)
    # No project (runs from before teams): private to the owner.
    project = models.ForeignKey("teams.Project", on_delete=models.PROTECT, related_name="runs", null=True, blank=True)
    visibility = models.CharField(max_length=10, choices=Visibility.choices, default=Visibility.PRIVATE)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.PLATFORM)
    tags = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True)
    # External runs may name no registry rows.
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs", null=True, blank=True)
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="runs", null=True, blank=True)
    reward = models.ForeignKey(RewardFunction, on_delete=models.PROTECT, related_name="runs", null=True, blank=True)
    backend = models.ForeignKey(Backend, on_delete=models.PROTECT, related_name="runs", null=True, blank=True)
    model = models.CharField(max_length=500, blank=True, help_text="Hub id or path of the policy model; empty: the backend's default.")
    config_overrides = models.JSONField(default=dict, blank=True, help_text="Flat dotted keys, as the owner entered them.")

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    task_id = models.CharField(max_length=100, blank=True)

    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    final_config = models.JSONField(null=True, blank=True)
    final_metrics = models.JSONField(default=dict, blank=True)
    steps = models.PositiveIntegerField(default=0)
    run_path = models.CharField(max_length=500, blank=True)
    checkpoint = models.CharField(max_length=500, blank=True, help_text="Latest checkpoint location.")
    remote_ids = models.JSONField(
        default=dict, blank=True,
        help_text="Ids of what a remote backend created for this run (trainer job, deployment, model).",
    )

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("runs:detail", args=[self.pk])

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL

    @property
    def duration(self) -> timedelta | None:
        if not self.started_at:
            return None
        return (self.finished_at or timezone.now()) - self.started_at

    def config_lines(self) -> str:
        return "\n".join(f"{key}={value}" for key, value in self.config_overrides.items())

    # -- lifecycle: every change is a filtered update returning whether it happened ----------
    def _transition(self, allowed: tuple[str, ...], **changes: Any) -> bool:
        changed = Run.objects.filter(pk=self.pk, status__in=allowed).update(**changes)
        if changed:
            for field, value in changes.items():
                setattr(self, field, value)
            if "status" in changes:
                run_status_changed.send(sender=Run, run=self)
        return bool(changed)

    def claim(self, worker: str) -> bool:
        """Take a queued run for ``worker``. False when another worker (or a cancel) got there first."""
        now = timezone.now()
        return self._transition(
            (self.Status.QUEUED,), status=self.Status.RUNNING, worker=worker, started_at=now, heartbeat_at=now
        )

    def heartbeat(self) -> bool:
        return self._transition((self.Status.RUNNING,), heartbeat_at=timezone.now())

    def finish(self, status: str, error: str = "", traceback: str = "", **fields: Any) -> bool:
        """Record the final status of a running run. False when it had already ended."""
        if status not in self.FINAL:
            raise ValueError(f"{status!r} is not a final status; use one of {', '.join(self.FINAL)}.")
        return self._transition(
            (self.Status.RUNNING,), status=status, error=error, traceback=traceback,
            finished_at=timezone.now(), **fields,
        )

    def request_cancel(self) -> bool:
        """Cancel: a queued run ends now; a running one is asked to stop (the worker finishes it)."""
        now = timezone.now()
        if self._transition((self.Status.QUEUED,), status=self.Status.CANCELLED, cancel_requested_at=now, finished_at=now):
            return True
        return self._transition((self.Status.RUNNING,), cancel_requested_at=now)

    def cancel_requested(self) -> bool:
        return Run.objects.filter(pk=self.pk, cancel_requested_at__isnull=False).exists()

    def enqueue(self) -> None:
        """Send the run to its backend's worker queue once the row is committed."""
        from django.db import transaction

        def send() -> None:
            from workers.tasks import execute_run_task

            result = execute_run_task.apply_async(args=[self.pk], queue=self.backend.queue)
            Run.objects.filter(pk=self.pk).update(task_id=result.id or "")

        transaction.on_commit(send)

    def log_tail(self, lines: int = 200) -> list["RunLog"]:
        return list(reversed(self.logs.order_by("-id")[:lines]))

    def latest_metrics(self) -> dict[str, float]:
        """The last value of every metric key (final metrics when the run has ended)."""
        if self.final_metrics:
            return dict(self.final_metrics)
        latest: dict[str, float] = {}
        for point in self.metrics.order_by("step"):
            latest[point.key] = point.value
        return latest


class MetricPoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    key = models.CharField(max_length=200)
    step = models.PositiveIntegerField()
    value = models.FloatField(null=True)  # NaN and inf are stored as NULL
    time = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "key", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "key", "step"], name="unique_metric_point")]

    def __str__(self) -> str:
        return f"{self.key}@{self.step}={self.value}"


class RunLog(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="logs")
    time = models.DateTimeField(default=timezone.now)
    level = models.CharField(max_length=10, default="INFO")
    message = models.TextField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"[{self.level}] {self.message[:80]}"


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="unique_checkpoint_step")]

    def __str__(self) -> str:
        return f"{self.run} step {self.step}: {self.path}"
