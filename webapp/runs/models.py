"""A run's whole life on its row (queued -> running -> succeeded | failed | cancelled), and what it
reports: log lines and checkpoints (metric points live in ``webapp.dashboard``'s store, which keeps
each key's latest value on the run's row).

State changes are filtered ``update()`` calls that return whether the row changed, so two workers
can never both claim a run and a late writer never overwrites a final status. Each claim starts a new
attempt; the changes a running attempt makes are filtered by its number too, so the supervisor of
an attempt that was given up on (its worker lost, the run re-queued) can no longer touch the run.

The web side never sends anything to a worker: a queued platform run *is* the request for one (an
outbox row), and the workers' dispatcher (``workers.housekeeping``) sends it when ``dispatch_at``
is due, again if nobody claimed it in time.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models.functions import Now
from django.dispatch import Signal
from django.urls import reverse
from django.utils import timezone

from webapp.registry.models import Agent, Backend, Dataset, RewardFunction
from webapp.teams.models import teams_of

# The highest step a run reaches: ``Run.steps``, which the metric store keeps, is a 32-bit column on every database.
MAX_STEP = 2**31 - 1


# Sent after a run's status changed (kwargs: run). The dashboard pushes it to live viewers.
run_status_changed = Signal()
# Sent after a batch of a run's log lines is stored (kwargs: run_id, lines: ``{id, time, level, message}``
# each). The dashboard pushes them to live viewers.
run_logs_written = Signal()


class AttemptSuperseded(Exception):
    """A write of a run attempt that no longer holds its run (another attempt took it over, or it
    ended): refused, and the attempt must stop."""


def lock_for_attempt(run_id: int, attempt: int | None) -> dict | None:
    """(Inside a transaction.) Lock run ``run_id``'s row for a write and return its metric-store
    fields, or None when it does not exist. With ``attempt`` (a platform attempt's fencing token),
    raise ``AttemptSuperseded`` unless the run is running in that attempt: checked where the write
    is made, so a takeover (which updates the row) can never slip between the check and the write."""
    row = (Run.objects.select_for_update().filter(pk=run_id)
           .values("status", "attempts", "latest_values", "value_ranges", "steps", "tail_points").first())
    if row is not None and attempt is not None and (row["status"] != Run.Status.RUNNING or row["attempts"] != attempt):
        raise AttemptSuperseded(f"run {run_id} is {row['status']} in attempt {row['attempts']}; attempt {attempt} may not write to it")
    return row


def silent() -> models.Q:
    """Runs whose heartbeat is older than their kind allows, by the database's clock (which
    heartbeats are written with too)."""
    now = Now()
    platform = models.Q(kind=Run.Kind.PLATFORM, heartbeat_at__lt=now - timedelta(seconds=settings.RUN_STALE_SECONDS))
    external = models.Q(kind=Run.Kind.EXTERNAL, heartbeat_at__lt=now - timedelta(seconds=settings.EXTERNAL_RUN_STALE_SECONDS))
    return platform | external


class RunQuerySet(models.QuerySet):
    def visible_to(self, user) -> "RunQuerySet":
        """Runs ``user`` may see: the same rule as ``access.can(user, run, "view")``, as a query."""
        if user.is_superuser:
            return self
        if not user.is_authenticated:
            return self.none()
        shared = models.Q(visibility=Run.Visibility.TEAM, project__team__in=teams_of(user))
        return self.filter(models.Q(owner=user) | shared)

    def with_tag(self, tag: str) -> "RunQuerySet":
        # The JSON text holds each tag quoted; this works on SQLite, where JSON ``contains`` does not.
        return self.filter(tags__icontains=json.dumps(tag))

    def lost(self) -> "RunQuerySet":
        """Running runs nobody vouches for: a platform run whose worker sent no heartbeat for
        ``RUN_STALE_SECONDS``, an external run that reported nothing for ``EXTERNAL_RUN_STALE_SECONDS``."""
        return self.filter(silent(), status=Run.Status.RUNNING)

    def due_for_dispatch(self) -> "RunQuerySet":
        """Queued platform runs the dispatcher should send to their queue now (the outbox)."""
        due = models.Q(dispatch_at__isnull=True) | models.Q(dispatch_at__lte=timezone.now())
        return self.filter(due, status=Run.Status.QUEUED, kind=Run.Kind.PLATFORM)


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"  # a person cancelled it
        PRUNED = "pruned"  # its sweep's pruner stopped it early: behind the completed trials

    class Visibility(models.TextChoices):
        PRIVATE = "private", "Private (owner only)"
        TEAM = "team", "Team (the project's team)"

    class Kind(models.TextChoices):
        PLATFORM = "platform"  # queued here, trained by a worker
        EXTERNAL = "external"  # trained anywhere (a notebook, a cluster job), reported over the API

    FINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.PRUNED)

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
    # A fork: the run it started from and the step of that run's checkpoint whose weights it
    # started from (its model choice is ``run:<parent>@<step>``, ``webapp.runs.forks``). Kept when
    # the parent is deleted as the step; the link then goes.
    parent = models.ForeignKey("self", on_delete=models.SET_NULL, related_name="forks", null=True, blank=True,
                               help_text="The run this one was forked from.")
    parent_step = models.PositiveIntegerField(null=True, blank=True, help_text="The parent's checkpoint step it started from.")
    # What its training carried of the optimizer state saved beside the weights it started from (a
    # fork's: its parent's checkpoint), as the backend reported it when training began
    # (``MultiSink.log_optimizer_state``, trl only): {"carried": bool, "why": str}; ``forks.optimizer_note``
    # words it. Null: nothing reported (not begun yet, or a backend that never carries it); a resumed
    # attempt loads its own checkpoint's optimizer and leaves the first attempt's record.
    optimizer_state = models.JSONField(null=True, blank=True)
    # What the run trains, resolved once when it was submitted and checked in the sandbox
    # (``trainer_args.run_spec``): every attempt builds its trainer from this, never from the
    # registry rows as they are later. Null: a run from before specs (resolved at its next attempt).
    spec = models.JSONField(null=True, blank=True)

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Who asked the run to stop: empty for a person (the run ends cancelled), "pruned" for its
    # sweep's pruner (the run ends pruned, so "cancelled" always means a person did it).
    stop_reason = models.CharField(max_length=20, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    task_id = models.CharField(max_length=100, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts started: each claim by a worker is one.")
    lost_attempts = models.PositiveIntegerField(
        default=0, help_text="Attempts that ended with their worker or training process lost (a deploy's stop is not one).",
    )
    # The outbox: when the dispatcher sends this queued run to its worker queue (null: at once);
    # after a send it is pushed forward, so a run nobody claimed is sent again.
    dispatch_at = models.DateTimeField(null=True, blank=True)

    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    # A run that succeeded but learnt nothing (its reward the same at every step), as the library
    # reports it (``TrainResult.warnings``): each a sentence naming the likely cause.
    warnings = models.JSONField(default=list, blank=True)
    final_config = models.JSONField(null=True, blank=True)
    final_metrics = models.JSONField(default=dict, blank=True)
    steps = models.PositiveIntegerField(default=0)
    # Kept by the metric store as it writes (webapp.dashboard.series): each key's latest value, its
    # lowest and highest finite value ({key: {"min": x, "max": y}}: the runs table's "best"), when
    # the last points arrived, and how many points wait in the store's open tail.
    latest_values = models.JSONField(default=dict, blank=True)
    value_ranges = models.JSONField(default=dict, blank=True)
    metrics_at = models.DateTimeField(null=True, blank=True)
    tail_points = models.PositiveIntegerField(default=0)
    # Names the run's folder: ids start again at 1 after a database reset, and a new run must never
    # resume from (or write into) an old run's files left on disk.
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    run_path = models.CharField(max_length=500, blank=True)
    checkpoint = models.CharField(max_length=500, blank=True, help_text="Latest checkpoint location.")
    remote_ids = models.JSONField(
        default=dict, blank=True,
        help_text="Ids of what a remote backend created for this run (trainer job, deployment, model).",
    )
    # A run that ended without its training process (lost, or cancelled with its worker gone) may
    # leave paid resources on a remote service: recorded here before anything is deleted, so a
    # refused deletion, or one a worker's exit cut short, is tried again by the liveness sweep.
    remote_release_pending = models.BooleanField(
        default=False, db_index=True,
        help_text="Resources on a remote service (named by remote_ids) may still be running: the liveness sweep deletes them.",
    )
    remote_release_attempts = models.PositiveIntegerField(default=0)
    remote_release_at = models.DateTimeField(
        null=True, blank=True, help_text="When the liveness sweep next tries to delete the run's remote resources.",
    )

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    # Kept by the metric store with filtered updates as it stores points.
    STORE_FIELDS = ("steps", "latest_values", "value_ranges", "metrics_at", "tail_points")

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"

    def save(self, *args, **kwargs) -> None:
        """Saving a row loaded earlier (an edit form, the admin) leaves the metric store's fields
        alone: its older copy of them must not overwrite what was stored since."""
        if not self._state.adding and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
            kwargs["update_fields"] = [f.name for f in self._meta.concrete_fields
                                       if not f.primary_key and f.name not in self.STORE_FIELDS]
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        return reverse("runs:detail", args=[self.pk])

    def folder(self) -> Path:
        """Where this run's files live: its recorded ``run_path`` (kept for runs from before ``uid``),
        else ``RUNS_DIR/<id>-<uid>``, a folder no other run, past or future, is given."""
        return Path(self.run_path) if self.run_path else Path(settings.RUNS_DIR) / f"{self.pk}-{self.uid.hex}"

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
    def _transition(self, allowed: tuple[str, ...], same_attempt: bool = False, attempt_end: tuple[str, str] | None = None,
                    where: models.Q | None = None, **changes: Any) -> bool:
        """Apply ``changes`` if the run's status is one of ``allowed`` (and, with ``same_attempt``,
        it is still in the attempt this instance holds; with ``where``, the row still matches it
        when the update is made). Sends ``run_status_changed`` on a status
        change: the one hook for whatever follows a run's status (live pages, alerts).
        ``attempt_end`` (cause, detail): the change ends the attempt this instance holds; its
        ``RunAttempt`` row is closed in the same transaction, only when the change was made (the
        filtered update is the attempt's fence)."""
        rows = Run.objects.filter(pk=self.pk, status__in=allowed)
        if same_attempt:
            rows = rows.filter(attempts=self.attempts)
        if where is not None:
            rows = rows.filter(where)
        with transaction.atomic():
            changed = rows.update(**changes)
            if changed and attempt_end is not None and self.attempts:
                RunAttempt.end(self.pk, self.attempts, *attempt_end)
        if changed:
            computed = [field for field, value in changes.items() if hasattr(value, "resolve_expression")]
            for field, value in changes.items():
                if field not in computed:
                    setattr(self, field, value)
            if computed:  # values the database computed (its clock): read them back
                self.refresh_from_db(fields=computed)
            if "status" in changes:
                run_status_changed.send(sender=Run, run=self)
        return bool(changed)

    def claim(self, worker: str) -> bool:
        """Take a queued run for ``worker``, starting its next attempt. False when another worker
        (or a cancel) got there first."""
        now = timezone.now()
        with transaction.atomic():
            if not self._transition(
                (self.Status.QUEUED,), same_attempt=True, status=self.Status.RUNNING, worker=worker,
                started_at=self.started_at or now, heartbeat_at=Now(), attempts=self.attempts + 1,
            ):
                return False
            RunAttempt.begin(self, worker)
        return True

    def heartbeat(self) -> bool:
        """False when this attempt no longer holds the run (it ended, or was given up on and re-queued)."""
        same_attempt = self.kind == self.Kind.PLATFORM
        return self._transition((self.Status.RUNNING,), same_attempt=same_attempt, heartbeat_at=Now())

    def finish(self, status: str, error: str = "", traceback: str = "", cause: str = "", where: models.Q | None = None,
               **fields: Any) -> bool:
        """Record the final status of a running run. False when it had already ended (or this
        attempt no longer holds it). ``cause``: why its attempt ended, when not the status itself
        (``RunAttempt.Cause.LOST``: its worker was lost, past the attempts its backend allows)."""
        if status not in self.FINAL:
            raise ValueError(f"{status!r} is not a final status; use one of {', '.join(self.FINAL)}.")
        detail = (error.strip().splitlines() or [""])[0]
        return self._transition(
            (self.Status.RUNNING,), same_attempt=self.kind == self.Kind.PLATFORM, where=where, status=status, error=error,
            traceback=traceback, finished_at=timezone.now(),
            attempt_end=(cause or RunAttempt.cause_of(status), detail), **fields,
        )

    def requeue(self, reason: str, cause: str = "", where: models.Q | None = None, **fields: Any) -> bool:
        """Give this running attempt up and queue the run for the next one (it resumes from its last
        checkpoint in its own folder), sent to a worker at once. False when this attempt no longer
        holds the run (or the row no longer matches ``where``). ``cause``: why the attempt ended
        (default ``RunAttempt.Cause.REQUEUED``: it stopped to be resumed, as on a deploy's SIGTERM)."""
        if not self._transition((self.Status.RUNNING,), same_attempt=True, where=where, status=self.Status.QUEUED, worker="",
                                dispatch_at=None, attempt_end=(cause or RunAttempt.Cause.REQUEUED, reason), **fields):
            return False
        RunLog.objects.create(run=self, level="WARNING", message=f"Attempt {self.attempts} ended: {reason} Queued again.")
        return True

    def recover(self, reason: str, while_silent: bool = False) -> str:
        """A running attempt nobody looks after any more: re-queue the run while its backend allows
        another attempt, fail it (naming ``reason``) once it does not. A run asked to stop ends
        cancelled (or pruned) instead: another attempt would only start in order to stop. Returns
        the status it got ('' when the attempt had already been dealt with). ``while_silent`` (the
        liveness sweep, which judged the run from an earlier read): only if its heartbeat is still
        stale when the change is made, so a heartbeat that came in meanwhile keeps the attempt."""
        where = silent() if while_silent else None
        if self.cancel_requested():
            status = self.stopped_status()
            return status if self.finish(status, error=f"{status.capitalize()}; {reason[0].lower()}{reason[1:]}", where=where) else ""
        if self.kind == self.Kind.PLATFORM and self.backend_id and self.lost_attempts + 1 < self.backend.max_attempts:
            return self.Status.QUEUED if self.requeue(reason, cause=RunAttempt.Cause.LOST, where=where,
                                                      lost_attempts=self.lost_attempts + 1) else ""
        limit = ""
        if self.kind == self.Kind.PLATFORM:
            limit = f" {self.lost_attempts + 1} attempt(s) were lost, the most its backend allows ({self.backend.max_attempts})."
        return self.Status.FAILED if self.finish(self.Status.FAILED, error=f"{reason}{limit}", cause=RunAttempt.Cause.LOST,
                                                 where=where) else ""

    def request_cancel(self, reason: str = "") -> bool:
        """Cancel: a queued run ends now; a running one is asked to stop (the worker finishes it).
        ``reason`` "pruned": a sweep's pruner asks, and the run ends ``pruned``, not ``cancelled``."""
        now = timezone.now()
        final = self.Status.PRUNED if reason == "pruned" else self.Status.CANCELLED
        if self._transition((self.Status.QUEUED,), status=final, cancel_requested_at=now, finished_at=now, stop_reason=reason):
            return True
        return self._transition((self.Status.RUNNING,), cancel_requested_at=now, stop_reason=reason)

    def stopped_status(self) -> str:
        """The final status of a run that stopped because it was asked to: cancelled or pruned."""
        reason = Run.objects.filter(pk=self.pk).values_list("stop_reason", flat=True).first()
        return self.Status.PRUNED if reason == "pruned" else self.Status.CANCELLED

    def cancel_requested(self) -> bool:
        return Run.objects.filter(pk=self.pk, cancel_requested_at__isnull=False).exists()

    def enqueue(self) -> None:
        """Ask for a worker now: the workers' dispatcher sends a queued run whose ``dispatch_at`` is
        due. Written to the row itself, so a run is never recorded without its request for a worker."""
        Run.objects.filter(pk=self.pk, status=self.Status.QUEUED).update(dispatch_at=None)
        self.dispatch_at = None

    def log_tail(self, lines: int = 200) -> list["RunLog"]:
        return list(reversed(self.logs.order_by("-id")[:lines]))

    def latest_metrics(self) -> dict[str, float | None]:
        """The last value of every metric key (final metrics when the run has ended): read from the
        row, which the metric store keeps current, never from the points."""
        return dict(self.final_metrics or self.latest_values or {})


def last_step_of(run_id: int) -> int:
    """The highest step any metric of the run has reached (-1 for none). The points are the
    dashboard's (its series blocks and tail hang on the run), read here through their relations."""
    runs = Run.objects.filter(pk=run_id)
    found = [runs.aggregate(m=models.Max(f"{relation}__last_step"))["m"] for relation in ("series_blocks", "series_tail")]
    return max((int(step) for step in found if step is not None), default=-1)


class RunAttempt(models.Model):
    """One attempt of a platform run: from its claim by a worker to its end, and why it ended.

    Written where the run's row changes, in the same transaction: ``Run.claim`` begins it,
    ``Run.finish`` / ``requeue`` / ``recover`` (called by the attempt's lifecycle, its supervisor, or
    the liveness sweep that finds it lost) end it, only when their filtered update went through, so
    an attempt that no longer holds its run never rewrites its row. The first end is kept (the
    update is filtered on ``ended_at`` being empty). The training process adds its host on entry,
    under the run's lock for its attempt (``workers.lifecycle.Attempt``)."""

    class Cause(models.TextChoices):
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        LOST = "lost", "lost worker"  # no heartbeat, its training process killed, or stopping went wrong
        REQUEUED = "requeued", "re-queued"  # stopped with a checkpoint to be resumed (a deploy's SIGTERM)
        SUPERSEDED = "superseded", "superseded"  # a later attempt took the run before this one's end was recorded
        CANCELLED = "cancelled", "cancelled"  # a person cancelled it, or its sweep pruned it

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    host = models.CharField(max_length=200, blank=True, help_text="The machine its training process ran on.")
    started_at = models.DateTimeField(default=timezone.now)
    start_step = models.PositiveIntegerField(default=0, help_text="The run's last stored step when it began.")
    ended_at = models.DateTimeField(null=True, blank=True)
    end_step = models.PositiveIntegerField(null=True, blank=True, help_text="The run's last stored step when it ended.")
    cause = models.CharField(max_length=20, choices=Cause.choices, blank=True)
    detail = models.CharField(max_length=500, blank=True, help_text="The reason given (an error's first line).")

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="unique_run_attempt")]

    def __str__(self) -> str:
        return f"attempt {self.number} of run {self.run_id}"

    @classmethod
    def cause_of(cls, status: str) -> str:
        """The cause of an attempt that ended its run with ``status``."""
        return {Run.Status.SUCCEEDED: cls.Cause.SUCCEEDED, Run.Status.CANCELLED: cls.Cause.CANCELLED,
                Run.Status.PRUNED: cls.Cause.CANCELLED}.get(status, cls.Cause.FAILED)

    @classmethod
    def begin(cls, run: Run, worker: str) -> "RunAttempt":
        """(In the claim's transaction.) The run's new attempt ``run.attempts``. An earlier one still
        open (its end never recorded) was superseded by it."""
        now = timezone.now()
        steps = Run.objects.filter(pk=run.pk).values_list("steps", flat=True).first() or 0
        cls.objects.filter(run=run, number__lt=run.attempts, ended_at__isnull=True).update(
            ended_at=now, end_step=steps, cause=cls.Cause.SUPERSEDED, detail=f"Attempt {run.attempts} took the run.")
        attempt, _ = cls.objects.update_or_create(
            run=run, number=run.attempts, defaults={"worker": worker[:200], "started_at": now, "start_step": steps})
        return attempt

    @classmethod
    def end(cls, run_id: int, number: int, cause: str, detail: str = "") -> bool:
        """Close attempt ``number`` of run ``run_id`` with ``cause``, unless it was closed already."""
        steps = Run.objects.filter(pk=run_id).values_list("steps", flat=True).first() or 0
        return bool(cls.objects.filter(run_id=run_id, number=number, ended_at__isnull=True).update(
            ended_at=timezone.now(), end_step=steps, cause=cause, detail=detail.strip()[:500]))


class RunLog(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="logs")
    # Given by the training process's recorder, so a line written twice (a spooled batch replayed
    # after a crash) is stored once.
    uid = models.UUIDField(null=True, blank=True, unique=True, editable=False)
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


class RunTableView(models.Model):
    """How a person's runs table looks, kept on the server so it follows them to another browser:
    the columns they added (``webapp.runs.table.Column`` ids), the sort and the grouping."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_table")
    columns = models.JSONField(default=list, blank=True)
    sort = models.CharField(max_length=250, blank=True)
    group = models.CharField(max_length=250, blank=True)

    def __str__(self) -> str:
        return f"runs table of {self.user}"
