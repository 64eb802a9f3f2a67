"""A question to a run's trained model, asked in the browser and answered by a worker.

The web process never loads a model: a ``PlaygroundRequest`` row *is* the request (an outbox row,
like a queued run). The workers' dispatcher sends it to the run's backend queue, the worker that
takes it (a CPU or GPU slot of that queue) generates the answer in a child process and writes it
to the row, and the page polls the row. A request nobody takes within ``PLAYGROUND_QUEUE_SECONDS``
ends ``expired``, saying so; one that generates for longer than ``PLAYGROUND_REPLY_SECONDS`` is
stopped and ends ``failed``.

Two kinds: ``chat`` (a conversation, the model writes the next assistant message, as LlamaBoard's
Chat tab) and ``row`` (the run's own agent plays one episode on one dataset row with the chosen
weights, scored by the run's reward or environment).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.runs.models import Run


class PlaygroundQuerySet(models.QuerySet):
    def pending(self) -> "PlaygroundQuerySet":
        return self.filter(status__in=(PlaygroundRequest.Status.QUEUED, PlaygroundRequest.Status.RUNNING))

    def due_for_dispatch(self) -> "PlaygroundQuerySet":
        """Queued requests the dispatcher should send now (not yet sent, or sent and not taken in time)."""
        due = models.Q(dispatch_at__isnull=True) | models.Q(dispatch_at__lte=timezone.now())
        return self.filter(due, status=PlaygroundRequest.Status.QUEUED, created_at__gte=queue_deadline())

    def overdue(self) -> "PlaygroundQuerySet":
        """Queued requests no worker took within ``PLAYGROUND_QUEUE_SECONDS``, and running ones whose
        worker was lost (still running well past ``PLAYGROUND_REPLY_SECONDS``: its answer will never come)."""
        queued = models.Q(status=PlaygroundRequest.Status.QUEUED, created_at__lt=queue_deadline())
        running = models.Q(status=PlaygroundRequest.Status.RUNNING, started_at__lt=lost_deadline())
        return self.filter(queued | running)


# A running request's worker kills its generating process after PLAYGROUND_REPLY_SECONDS; this
# much later, nobody is left to record an answer (the worker itself was lost).
LOST_GRACE_SECONDS = 30


def queue_deadline():
    return timezone.now() - timedelta(seconds=settings.PLAYGROUND_QUEUE_SECONDS)


def lost_deadline():
    return timezone.now() - timedelta(seconds=settings.PLAYGROUND_REPLY_SECONDS + LOST_GRACE_SECONDS)


class PlaygroundRequest(models.Model):
    class Kind(models.TextChoices):
        CHAT = "chat", "Chat with the model"
        ROW = "row", "Run the agent on a dataset row"

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        EXPIRED = "expired"

    FINAL = (Status.SUCCEEDED, Status.FAILED, Status.EXPIRED)

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="playground_requests")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="playground_requests")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.CHAT)
    # Which of the run's saved models answers: "final_model" or "checkpoint-<step>" (as its downloads name them).
    model_name = models.CharField(max_length=100)
    messages = models.JSONField(default=list, blank=True, help_text="The conversation so far: [{role, content}, ...].")
    split = models.CharField(max_length=10, blank=True, help_text="Row requests: train or test.")
    row_index = models.PositiveIntegerField(null=True, blank=True)
    max_new_tokens = models.PositiveIntegerField()
    temperature = models.FloatField(default=0.0, help_text="0: greedy.")

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    queue = models.CharField(max_length=50, help_text="The worker queue it was sent to (the run backend's).")
    worker = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    dispatch_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    device = models.CharField(max_length=20, blank=True, help_text="Where it was generated: cpu or cuda.")
    reply = models.TextField(blank=True)
    episode = models.JSONField(null=True, blank=True, help_text="Row requests: the episode, turn by turn, and its reward.")
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    reply_tokens = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    objects = PlaygroundQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} request {self.pk} on run {self.run_id} ({self.status})"

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL

    def _transition(self, allowed: tuple[str, ...], **changes) -> bool:
        changed = PlaygroundRequest.objects.filter(pk=self.pk, status__in=allowed).update(**changes)
        if changed:
            for field, value in changes.items():
                setattr(self, field, value)
        return bool(changed)

    def claim(self, worker: str) -> bool:
        """Take a queued request that is still within its wait limit."""
        taken = PlaygroundRequest.objects.filter(pk=self.pk, status=self.Status.QUEUED, created_at__gte=queue_deadline()).update(
            status=self.Status.RUNNING, worker=worker, started_at=timezone.now(),
        )
        if taken:
            self.status, self.worker = self.Status.RUNNING, worker
        return bool(taken)

    def finish(self, status: str, **fields) -> bool:
        if status not in self.FINAL:
            raise ValueError(f"{status!r} is not a final status; use one of {', '.join(self.FINAL)}.")
        return self._transition((self.Status.QUEUED, self.Status.RUNNING), status=status, finished_at=timezone.now(), **fields)

    def expire_if_overdue(self) -> bool:
        """End a request no worker took in time (``expired``), or whose worker was lost while answering
        (``failed``), saying which. True when it did (a claim checks the same limit, so a late worker
        can no longer take it)."""
        if self.status == self.Status.QUEUED and self.created_at < queue_deadline():
            return self._transition((self.Status.QUEUED,), status=self.Status.EXPIRED, finished_at=timezone.now(),
                                    error=self.expiry_message())
        if self.status == self.Status.RUNNING and self.started_at and self.started_at < lost_deadline():
            return self._transition((self.Status.RUNNING,), status=self.Status.FAILED, finished_at=timezone.now(), error=(
                f"The worker answering it ({self.worker}) was lost: no answer after "
                f"{settings.PLAYGROUND_REPLY_SECONDS + LOST_GRACE_SECONDS} s. Ask again."))
        return False

    def expiry_message(self) -> str:
        return (f"No worker of the '{self.queue}' queue was free within {settings.PLAYGROUND_QUEUE_SECONDS} s "
                "(they are busy training, or none is running); try again later.")

    def position(self) -> int:
        """Requests on the same queue that were asked earlier and still wait or run."""
        return PlaygroundRequest.objects.pending().filter(queue=self.queue, created_at__lt=self.created_at).count()
