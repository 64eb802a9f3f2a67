"""What the charts and the episode viewer read.

A metric series is stored in blocks of up to ``BLOCK_SIZE`` points (steps and values packed as
little-endian int64/float64 bytes) with the block's min, max and last point kept in columns. One
row per thousand points is what makes ingest fast (one row write per key per flush, not one per
point) and what makes a million-point chart cheap: the block summaries alone are the downsampled
series, spikes included, since every block keeps its exact minimum and maximum and their steps.
"""

from __future__ import annotations

import numpy as np
from django.db import models

from webapp.runs.models import Run

BLOCK_SIZE = 1024


class SeriesBlock(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="series_blocks")
    key = models.CharField(max_length=200)
    index = models.PositiveIntegerField(help_text="0 for a key's first block, then 1, 2, ...")
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    count = models.PositiveIntegerField()
    # Extremes over the finite values of the block (null when it has none) and where they are.
    min_value = models.FloatField(null=True)
    min_step = models.BigIntegerField(null=True)
    max_value = models.FloatField(null=True)
    max_step = models.BigIntegerField(null=True)
    last_value = models.FloatField(null=True)
    steps = models.BinaryField()
    values = models.BinaryField()  # NaN where the trainer reported NaN or inf

    class Meta:
        ordering = ["run", "key", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "key", "index"], name="unique_series_block")]
        indexes = [models.Index(fields=["run", "key", "last_step"], name="series_block_range")]

    def __str__(self) -> str:
        return f"{self.key}[{self.first_step}..{self.last_step}] of run {self.run_id}"

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return unpack(self.steps, self.values)


def unpack(steps: bytes, values: bytes) -> tuple[np.ndarray, np.ndarray]:
    return np.frombuffer(bytes(steps), dtype="<i8"), np.frombuffer(bytes(values), dtype="<f8")


class EpisodeSample(models.Model):
    """One sampled episode of a logged step, as ``Episode.to_dict()`` gave it (token ids dropped)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="episode_samples")
    step = models.PositiveIntegerField()
    position = models.PositiveIntegerField(help_text="Order among the step's samples.")
    reward = models.FloatField(null=True)
    num_turns = models.PositiveIntegerField(default=0)
    termination_reason = models.CharField(max_length=40, blank=True)
    data = models.JSONField()

    class Meta:
        ordering = ["run", "step", "position"]
        constraints = [models.UniqueConstraint(fields=["run", "step", "position"], name="unique_episode_sample")]

    def __str__(self) -> str:
        return f"episode {self.position} of step {self.step} (run {self.run_id})"
