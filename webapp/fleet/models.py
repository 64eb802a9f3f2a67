"""What the platform remembers about a worker beyond what Celery says while it is online."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class WorkerState(models.Model):
    """A worker an admin drained (it finishes its current run and takes no more) or resumed."""

    name = models.CharField(max_length=200, unique=True, help_text="Celery node name, e.g. gpu@host.")
    drained = models.BooleanField(default=False)
    queues = models.JSONField(default=list, blank=True, help_text="Queues it consumed when drained; resume adds them back.")
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}{' (drained)' if self.drained else ''}"
