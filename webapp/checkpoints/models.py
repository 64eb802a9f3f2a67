"""A project's names for checkpoints (aliases: ``best``, ``candidate``, any label) and the
evaluations of checkpoints on datasets, with their scores per data source.

An alias names one checkpoint per project: setting it again moves it. A checkpoint is (run, step):
the run's published checkpoint folders are the truth of what is stored (``webapp.runs.downloads``),
so an alias of a checkpoint rotated out since says so when it is used. An evaluation's whole life is
on its row (queued, running, then succeeded or failed with its error), claimed by a worker with a
filtered update so two workers never both take one.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from webapp.registry.models import Dataset
from webapp.runs.models import Run
from webapp.teams.models import Project

ALIAS_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
alias_name = RegexValidator(ALIAS_PATTERN, "An alias is 1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit.")


class CheckpointAlias(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="checkpoint_aliases")
    name = models.CharField(max_length=64, validators=[alias_name])
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="aliases")
    step = models.PositiveIntegerField()
    set_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_alias_per_project")]

    def __str__(self) -> str:
        return f"{self.name} -> run {self.run_id} step {self.step}"


class Evaluation(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    FINAL = (Status.SUCCEEDED, Status.FAILED)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluations")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="evaluations")
    step = models.PositiveIntegerField()
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="evaluations")
    split = models.CharField(max_length=50, help_text="The dataset's split scored: its held-out one, else its training one.")
    episodes_per_task = models.PositiveSmallIntegerField(default=1, help_text="k of pass@k; above 1 the episodes are sampled.")
    max_tasks = models.PositiveIntegerField(help_text="The first rows of the split scored, at most this many.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    queue = models.CharField(max_length=100)
    worker = models.CharField(max_length=200, blank=True)
    tasks = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="When it was last sent to its queue.")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"evaluation {self.pk}: run {self.run_id} step {self.step} on {self.dataset}"

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL

    def claim(self, worker: str) -> bool:
        """Take the queued evaluation for ``worker``; False when another took it or it ended."""
        return bool(Evaluation.objects.filter(pk=self.pk, status=self.Status.QUEUED).update(
            status=self.Status.RUNNING, worker=worker[:200], started_at=timezone.now()))

    def finish(self, status: str, error: str = "") -> bool:
        """End the evaluation (once); False when it had ended already."""
        return bool(Evaluation.objects.filter(pk=self.pk).exclude(status__in=self.FINAL).update(
            status=status, error=error[:4000], finished_at=timezone.now()))


class EvaluationScore(models.Model):
    """One data source's scores of an evaluation: a row of the evaluation table."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="scores")
    data_source = models.CharField(max_length=200)
    tasks = models.PositiveIntegerField()
    reward = models.FloatField()
    pass_at_1 = models.FloatField()
    pass_at_k = models.FloatField(help_text="pass@k with k the evaluation's episodes per task (pass@1 when 1).")

    class Meta:
        ordering = ["evaluation", "data_source"]
        constraints = [models.UniqueConstraint(fields=["evaluation", "data_source"], name="unique_score_per_source")]

    def __str__(self) -> str:
        return f"{self.evaluation_id} {self.data_source}: reward {self.reward:.4g}"
