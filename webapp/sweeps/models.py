"""A sweep: a base run plus a search space over its config keys; each trial is an ordinary run."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse

MAX_OBJECTIVE_STEPS = 10_000


class Sweep(models.Model):
    class Sampler(models.TextChoices):
        GRID = "grid", "grid (every combination)"
        RANDOM = "random", "random"
        TPE = "tpe", "Bayesian (Optuna's TPE)"

    class Direction(models.TextChoices):
        MAXIMIZE = "maximize"
        MINIMIZE = "minimize"

    class Summary(models.TextChoices):
        LAST = "last", "last value"
        MAX = "max", "highest value over the steps"
        MIN = "min", "lowest value over the steps"
        MEAN_LAST = "mean_last", "mean of the last N steps"

    class Status(models.TextChoices):
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"  # its owner cancelled it
        STOPPED = "stopped"  # the platform stopped it: its next trial could not start (``stop_reason`` says why)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(max_length=200)
    base_run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="sweeps_based_on")
    space = models.JSONField(help_text="Config key to range, e.g. {\"data.train_batch_size\": \"choice 2, 4\"}.")
    sampler = models.CharField(max_length=10, choices=Sampler.choices, default=Sampler.TPE)
    objective = models.CharField(max_length=200, default="reward", help_text="The metric to optimise.")
    objective_summary = models.CharField(max_length=10, choices=Summary.choices, default=Summary.LAST,
                                         help_text="Which of the metric's values is a trial's score.")
    objective_steps = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1), MaxValueValidator(MAX_OBJECTIVE_STEPS)],
                                                  help_text="N, for the mean of the last N steps.")
    direction = models.CharField(max_length=10, choices=Direction.choices, default=Direction.MAXIMIZE)
    max_trials = models.PositiveIntegerField(default=8)
    parallel = models.PositiveIntegerField(default=2, help_text="Trials running at once.")
    prune = models.BooleanField(default=True, help_text="Stop hopeless trials early (Optuna's median pruner).")
    seed = models.IntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    stop_reason = models.TextField(blank=True, help_text="Why the platform stopped it (status stopped).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("sweeps:detail", args=[self.pk])

    @property
    def objective_label(self) -> str:
        """The score as the pages name it: ``reward``, ``reward (max over steps)``, ``reward (mean of the last 10 steps)``."""
        if self.objective_summary == self.Summary.MEAN_LAST:
            return f"{self.objective} (mean of the last {self.objective_steps} steps)"
        if self.objective_summary in (self.Summary.MAX, self.Summary.MIN):
            return f"{self.objective} ({self.objective_summary} over steps)"
        return self.objective


class Trial(models.Model):
    class State(models.TextChoices):
        RUNNING = "running"
        COMPLETE = "complete"
        PRUNED = "pruned"
        FAILED = "failed"

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField()
    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="sweep_trial")
    params = models.JSONField()
    system_attrs = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    value = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["sweep", "number"]
        constraints = [models.UniqueConstraint(fields=["sweep", "number"], name="unique_trial_number")]

    def __str__(self) -> str:
        return f"{self.sweep} #{self.number}"
