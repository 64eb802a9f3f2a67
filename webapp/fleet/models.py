"""What the platform remembers about a worker: an admin's drain, and what the worker itself last
said it serves (its queues and slots, written by its housekeeping thread every heartbeat). The
pages that say what a run or a question waits for read these rows, never the broker, so they say
the same in the embedded mode (whose file broker answers no inspect) and with Redis."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, models
from django.db.models.functions import Now


class WorkerStateQuerySet(models.QuerySet):
    def alive(self) -> "WorkerStateQuerySet":
        """Workers that wrote their row within ``RUN_STALE_SECONDS`` (by the database's clock, as run heartbeats)."""
        return self.filter(seen_at__gte=Now() - timedelta(seconds=settings.RUN_STALE_SECONDS))

    def seen(self, name: str, queues: list[str], slots: int) -> None:
        """Worker ``name`` is alive, consuming ``queues`` (none while drained) with ``slots`` pool processes."""
        fields = {"serves": sorted(queues), "slots": slots, "seen_at": Now()}
        if self.filter(name=name).update(**fields):
            return
        try:
            self.create(name=name, **fields)
        except IntegrityError:  # another process of the same name created it in between
            self.filter(name=name).update(**fields)

    def gone(self, name: str) -> None:
        """Worker ``name`` stopped: it serves nothing from now on (not only once its row is stale)."""
        self.filter(name=name).update(serves=[], seen_at=None)


class WorkerState(models.Model):
    """A worker: an admin drained it (it finishes its current run and takes no more) or resumed it,
    and what it last said it serves."""

    name = models.CharField(max_length=200, unique=True, help_text="Celery node name, e.g. gpu@host.")
    drained = models.BooleanField(default=False)
    queues = models.JSONField(default=list, blank=True, help_text="Queues it consumed when drained; resume adds them back.")
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    serves = models.JSONField(default=list, blank=True, help_text="Queues it consumed when last seen (none while drained).")
    slots = models.PositiveIntegerField(default=0, help_text="Its pool processes: one run or one playground answer each.")
    seen_at = models.DateTimeField(null=True, blank=True, help_text="When it last wrote this row (every heartbeat while it runs).")

    objects = WorkerStateQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}{' (drained)' if self.drained else ''}"
