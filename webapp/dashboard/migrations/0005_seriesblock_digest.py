"""Adds ``SeriesBlock.digest`` (the extremes of every 32 points of a block) and computes it for the
blocks already stored, so that charts whose buckets span 32 points or more read digests rather than
points for old runs too. The digest layout is written here, not imported, so that this migration
keeps working whatever the store's module becomes. Backward: the column goes (nothing else held it).
"""

import numpy as np
from django.db import migrations, models

DIGEST_SPAN = 32


def _digest(steps, values):
    spans = -(-len(values) // DIGEST_SPAN)
    padded = np.full(spans * DIGEST_SPAN, np.nan)
    padded[:len(values)] = values
    grid = padded.reshape(spans, DIGEST_SPAN)
    finite = np.isfinite(grid)
    has_any = finite.any(axis=1)
    offsets = np.arange(spans) * DIGEST_SPAN
    low = np.where(finite, grid, np.inf).argmin(axis=1) + offsets
    high = np.where(finite, grid, -np.inf).argmax(axis=1) + offsets
    rows = np.full((spans, 4), np.nan)
    rows[has_any] = np.column_stack([padded[low], steps[low], padded[high], steps[high]])[has_any]
    return rows.astype("<f8").tobytes()


def forward(apps, schema_editor):
    SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
    last = 0
    while True:  # a thousand blocks at a time, in id order: memory stays flat on a large store
        batch = list(SeriesBlock.objects.filter(pk__gt=last, digest__isnull=True).order_by("pk")
                     .only("pk", "steps", "values")[:1000])
        if not batch:
            return
        for block in batch:
            steps = np.frombuffer(bytes(block.steps), dtype="<i8")
            block.digest = _digest(steps, np.frombuffer(bytes(block.values), dtype="<f8"))
        SeriesBlock.objects.bulk_update(batch, ["digest"])
        last = batch[-1].pk


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0004_seriessummary'),
    ]

    operations = [
        migrations.AddField(
            model_name='seriesblock',
            name='digest',
            field=models.BinaryField(null=True),
        ),
        migrations.RunPython(forward, migrations.RunPython.noop),
    ]
