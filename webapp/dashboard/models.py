"""The metric store (the one place metric points live) and the episode viewer's samples.

A flush appends one ``SeriesTail`` row holding every point it carries, of all keys, packed: an
insert, never an update, so a flush costs about the bytes of its points. When a run's tail holds
``TAIL_FOLD_POINTS`` points it is folded into ``SeriesBlock`` rows of up to ``BLOCK_SIZE`` points of
one key (steps and values packed as little-endian int64/float64 bytes) with the block's min, max
and last point kept in columns, and the folded tail rows are deleted. Closed blocks are not
rewritten, except where a resumed attempt replays a step they hold (its new value replaces the old).
The block summaries alone are the downsampled series of a long range, spikes included, since every
block keeps its exact minimum and maximum and their steps. A block's ``digest`` keeps the same
extremes for each ``DIGEST_SPAN`` consecutive points of it (1 KB for a full block of 16 KB of
points): a chart of many runs whose buckets span at least that many points is drawn from digests
alone, which is what lets the compare page read a thousand runs' series without their points.

Past a few thousand blocks a chart reads a second level instead: one ``SeriesSummary`` row per
``SUMMARY_BLOCKS`` consecutive blocks of a key (by block index), with the same columns computed over
them, rewritten whenever the fold writes or rewrites one of its blocks. A 100M-point series is
about 98k blocks but only about 1,500 summaries.

A (run, key, step) is stored once: reads and the fold keep the value written last.
"""

from __future__ import annotations

import numpy as np
from django.db import models

from webapp.runs.models import Run

BLOCK_SIZE = 1024
# A run's open tail is folded into blocks once it holds this many points.
TAIL_FOLD_POINTS = 16384
# Blocks per summary row (the second level); migrations/0004 builds them with the same number.
SUMMARY_BLOCKS = 64
# Points per digest row: a row is (min value, its step, max value, its step), little-endian float64.
DIGEST_SPAN = 32
DIGEST_FIELDS = 4


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
    # The extremes of each DIGEST_SPAN points, in order (see digest_of); null only for a block that a
    # database migration copied in before digests existed and none was computed for it.
    digest = models.BinaryField(null=True)

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


def digest_of(steps: np.ndarray, values: np.ndarray) -> bytes:
    """A block's digest: for each ``DIGEST_SPAN`` consecutive points, (min value, its step, max
    value, its step) over the finite values, NaN for a span with none; float64 (steps are exact)."""
    spans = -(-len(values) // DIGEST_SPAN)
    padded = np.full(spans * DIGEST_SPAN, np.nan)
    padded[:len(values)] = values
    grid = padded.reshape(spans, DIGEST_SPAN)
    finite = np.isfinite(grid)
    has_any = finite.any(axis=1)
    offsets = np.arange(spans) * DIGEST_SPAN
    low = np.where(finite, grid, np.inf).argmin(axis=1) + offsets
    high = np.where(finite, grid, -np.inf).argmax(axis=1) + offsets
    rows = np.full((spans, DIGEST_FIELDS), np.nan)
    rows[has_any] = np.column_stack([padded[low], steps[low], padded[high], steps[high]])[has_any]
    return rows.astype("<f8").tobytes()


def unpack_digest(digest: bytes) -> np.ndarray:
    """A digest as rows of (min value, min step, max value, max step)."""
    return np.frombuffer(bytes(digest), dtype="<f8").reshape(-1, DIGEST_FIELDS)


class SeriesSummary(models.Model):
    """Blocks ``index * SUMMARY_BLOCKS`` .. ``(index + 1) * SUMMARY_BLOCKS - 1`` of one key, summarised:
    their step range, point count, extremes (and where they are) and the value at the highest step."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="series_summaries")
    key = models.CharField(max_length=200)
    index = models.PositiveIntegerField(help_text="Block index // SUMMARY_BLOCKS")
    blocks = models.PositiveIntegerField(help_text="How many blocks it summarises (the last one may be partial)")
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    count = models.BigIntegerField()
    min_value = models.FloatField(null=True)
    min_step = models.BigIntegerField(null=True)
    max_value = models.FloatField(null=True)
    max_step = models.BigIntegerField(null=True)
    last_value = models.FloatField(null=True)

    class Meta:
        ordering = ["run", "key", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "key", "index"], name="unique_series_summary")]

    def __str__(self) -> str:
        return f"{self.key}[{self.first_step}..{self.last_step}] (blocks of group {self.index}) of run {self.run_id}"


class SeriesTail(models.Model):
    """The points of one flush of one run, every key's, not yet folded into blocks.

    ``keys`` names the keys; ``key_ids`` (little-endian uint16), ``steps`` and ``values`` hold one
    entry per point. A (key, step) written again later (a replayed step) is in a later row: the
    row with the higher id holds the value that counts."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="series_tail")
    count = models.PositiveIntegerField()
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    keys = models.JSONField()
    key_ids = models.BinaryField()
    steps = models.BinaryField()
    values = models.BinaryField()

    class Meta:
        ordering = ["run", "id"]

    def __str__(self) -> str:
        return f"{self.count} points [{self.first_step}..{self.last_step}] of run {self.run_id}"


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


class StoredEpisode(models.Model):
    """One episode of the episode store (every episode a run trained or validated on): the fields one
    filters on, and where its body lies. The body (turns, token ids, mask, logprobs, advantage,
    reward components, traceback) is row ``body_row`` of the Parquet file ``body_key`` in the run's
    artifact store (``webapp.dashboard.episodes``)."""

    class Split(models.TextChoices):
        TRAIN = "train"
        VALIDATION = "val"

    # No index of its own: the unique (run, step, split, position) one serves it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="stored_episodes", db_index=False)
    split = models.CharField(max_length=5, choices=Split.choices, default=Split.TRAIN)
    step = models.BigIntegerField()
    position = models.PositiveIntegerField(help_text="Its place among the step's episodes.")
    attempt = models.PositiveIntegerField(null=True, help_text="The run's attempt that trained it.")
    group = models.CharField(max_length=64, help_text="Its prompt's group (verl's uid).")
    group_position = models.PositiveIntegerField(default=0)
    data_source = models.CharField(max_length=200, blank=True)
    row_index = models.BigIntegerField(null=True, help_text="Its task's row in the dataset.")
    reward = models.FloatField(null=True)
    advantage = models.FloatField(null=True)
    is_correct = models.BooleanField(default=False)
    termination_reason = models.CharField(max_length=40, blank=True)
    num_turns = models.PositiveIntegerField(default=0)
    prompt_length = models.PositiveIntegerField(default=0)
    response_length = models.PositiveIntegerField(default=0)
    error = models.CharField(max_length=500, blank=True)
    retokenization_drift = models.BooleanField(
        null=True, help_text="Whether rendering its conversation again through the chat template gives back other "
                             "token ids than those generated; null: not checked.")
    drift_position = models.PositiveIntegerField(
        null=True, help_text="The first differing position, over its prompt's and response's ids.")
    text = models.TextField(blank=True, help_text="The conversation's first characters, for text search.")
    body_key = models.CharField(max_length=400)
    body_row = models.PositiveIntegerField()

    class Meta:
        # Step-major: a step range is one range of this index, whatever the split.
        ordering = ["run", "step", "split", "position"]
        constraints = [models.UniqueConstraint(fields=["run", "step", "split", "position"], name="unique_stored_episode")]
        indexes = [
            models.Index(fields=["run", "reward"], name="stored_episode_reward"),
            models.Index(fields=["run", "termination_reason", "step"], name="stored_episode_termination"),
            models.Index(fields=["run", "data_source", "step"], name="stored_episode_source"),
            models.Index(fields=["run", "group"], name="stored_episode_group"),
            # One prompt across training: a dataset row's episodes, step by step.
            models.Index(fields=["run", "row_index", "step"], name="stored_episode_row"),
        ]
        # And on PostgreSQL a trigram index on UPPER(text), for the API's ``q`` (migration 0008).

    def __str__(self) -> str:
        return f"{self.split} episode {self.position} of step {self.step} (run {self.run_id})"
