"""Fills ``Run.value_ranges`` (each key's lowest and highest finite value, which the writer keeps
from now on) for the runs stored before it: the summaries' extremes for what is folded, the open
tail's points for the rest. Written here, not imported, so that this migration keeps working
whatever the store's module becomes. Backward: nothing to undo (the column goes with runs.0013_run_table)."""

import json

import numpy as np
from django.db import migrations
from django.db.models import Max, Min


def _widen(ranges, key, low, high):
    old = ranges.get(key)
    ranges[key] = {"min": low, "max": high} if not old else {"min": min(old["min"], low), "max": max(old["max"], high)}


def forward(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    SeriesSummary = apps.get_model("dashboard", "SeriesSummary")
    SeriesTail = apps.get_model("dashboard", "SeriesTail")
    ranges = {}
    for row in (SeriesSummary.objects.values("run_id", "key").annotate(low=Min("min_value"), high=Max("max_value"))
                .order_by().iterator(chunk_size=5000)):
        if row["low"] is not None:
            _widen(ranges.setdefault(row["run_id"], {}), row["key"], row["low"], row["high"])
    for run_id, keys, key_ids, values in SeriesTail.objects.values_list("run_id", "keys", "key_ids", "values").iterator(chunk_size=500):
        keys = json.loads(keys) if isinstance(keys, (str, bytes)) else keys
        ids = np.frombuffer(bytes(key_ids), dtype="<u2")
        values = np.frombuffer(bytes(values), dtype="<f8")
        for index, key in enumerate(keys):
            mine = values[(ids == index) & np.isfinite(values)]
            if len(mine):
                _widen(ranges.setdefault(run_id, {}), key, float(mine.min()), float(mine.max()))
    for run_id, run_ranges in ranges.items():
        Run.objects.filter(pk=run_id).update(value_ranges=run_ranges)


class Migration(migrations.Migration):

    dependencies = [
        ("dashboard", "0005_seriesblock_digest"),
        ("runs", "0013_run_table"),
    ]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
