"""Moves ``runs.MetricPoint`` rows into the metric store's blocks, so a run recorded before the one
store keeps its whole series, and fills each run's latest values on its row.

Forward, per run: its points from both old stores are merged (a step both hold keeps the
MetricPoint's value, the rows the old API and CSV served), its blocks are written anew from the
merged series, and ``latest_values``, ``metrics_at`` and ``steps`` are set. Backward, per run: the
tail is folded into blocks and every point is written back as a MetricPoint, so migrating back
loses nothing either. The block layout is written here, not imported, so that this migration keeps
working whatever the store's module becomes.
"""

import math

import numpy as np
from django.db import migrations
from django.db.models import Max

BLOCK_SIZE = 1024


def _unpack(steps, values):
    return np.frombuffer(bytes(steps), dtype="<i8"), np.frombuffer(bytes(values), dtype="<f8")


def _block(SeriesBlock, run_id, key, index, steps, values):
    finite = np.isfinite(values)
    extremes = {}
    if finite.any():
        lo = int(np.where(finite, values, np.inf).argmin())
        hi = int(np.where(finite, values, -np.inf).argmax())
        extremes = {"min_value": float(values[lo]), "min_step": int(steps[lo]),
                    "max_value": float(values[hi]), "max_step": int(steps[hi])}
    last = float(values[-1])
    return SeriesBlock(run_id=run_id, key=key, index=index, first_step=int(steps[0]), last_step=int(steps[-1]),
                       count=len(steps), last_value=last if math.isfinite(last) else None,
                       steps=np.ascontiguousarray(steps, dtype="<i8").tobytes(),
                       values=np.ascontiguousarray(values, dtype="<f8").tobytes(), **extremes)


def _stored_series(apps, run_id):
    """{key: {step: value}} of what the new store holds for a run: blocks, then the tail on top."""
    SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
    SeriesTail = apps.get_model("dashboard", "SeriesTail")
    series = {}
    for block in SeriesBlock.objects.filter(run_id=run_id).order_by("key", "index"):
        steps, values = _unpack(block.steps, block.values)
        series.setdefault(block.key, {}).update(zip(steps.tolist(), values.tolist()))
    for row in SeriesTail.objects.filter(run_id=run_id).order_by("id"):
        steps, values = _unpack(row.steps, row.values)
        ids = np.frombuffer(bytes(row.key_ids), dtype="<u2")
        for key_id, step, value in zip(ids.tolist(), steps.tolist(), values.tolist()):
            series.setdefault(row.keys[key_id], {})[step] = value
    return series


def _rewrite_blocks(apps, run_id, series):
    SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
    SeriesBlock.objects.filter(run_id=run_id).delete()
    rows = []
    for key, points in series.items():
        ordered = sorted(points.items())
        steps = np.array([s for s, _ in ordered], dtype="<i8")
        values = np.array([v for _, v in ordered], dtype="<f8")
        for index, first in enumerate(range(0, len(steps), BLOCK_SIZE)):
            rows.append(_block(SeriesBlock, run_id, key, index, steps[first:first + BLOCK_SIZE], values[first:first + BLOCK_SIZE]))
    SeriesBlock.objects.bulk_create(rows, batch_size=500)


def forward(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    MetricPoint = apps.get_model("runs", "MetricPoint")
    SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
    with_points = set(MetricPoint.objects.values_list("run_id", flat=True).distinct())
    with_blocks = set(SeriesBlock.objects.values_list("run_id", flat=True).distinct())
    for run_id in sorted(with_points | with_blocks):
        series = _stored_series(apps, run_id)
        metrics_at = None
        if run_id in with_points:
            for key, step, value in MetricPoint.objects.filter(run_id=run_id).values_list("key", "step", "value").iterator():
                series.setdefault(key, {})[step] = math.nan if value is None else value
            metrics_at = MetricPoint.objects.filter(run_id=run_id).aggregate(at=Max("time"))["at"]
            _rewrite_blocks(apps, run_id, series)
        latest, last_step = {}, 0
        for key, points in series.items():
            step = max(points)
            value = points[step]
            latest[key] = value if math.isfinite(value) else None
            last_step = max(last_step, step)
        run = Run.objects.get(pk=run_id)
        Run.objects.filter(pk=run_id).update(latest_values=latest, metrics_at=metrics_at or run.metrics_at,
                                             steps=max(run.steps, min(last_step, 2**31 - 1)))


def backward(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    MetricPoint = apps.get_model("runs", "MetricPoint")
    SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
    SeriesTail = apps.get_model("dashboard", "SeriesTail")
    runs = set(SeriesBlock.objects.values_list("run_id", flat=True).distinct())
    runs |= set(SeriesTail.objects.values_list("run_id", flat=True).distinct())
    for run_id in sorted(runs):
        series = _stored_series(apps, run_id)
        _rewrite_blocks(apps, run_id, series)
        SeriesTail.objects.filter(run_id=run_id).delete()
        time = Run.objects.filter(pk=run_id).values_list("metrics_at", flat=True).first()
        extra = {"time": time} if time else {}
        MetricPoint.objects.filter(run_id=run_id).delete()
        MetricPoint.objects.bulk_create(
            [MetricPoint(run_id=run_id, key=key, step=step, value=value if math.isfinite(value) else None, **extra)
             for key, points in series.items() for step, value in points.items() if 0 <= step < 2**31],
            batch_size=5000,
        )


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0002_seriestail'),
        ('runs', '0009_run_latest_values'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
