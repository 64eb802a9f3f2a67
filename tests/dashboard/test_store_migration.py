"""The migration into the one metric store, on a database holding runs in the old format: metric
points as ``MetricPoint`` rows (some runs also with the series blocks of that time, some without),
migrated forward into blocks with every series, latest value and step intact, and back again."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from webapp.dashboard import series

pytestmark = pytest.mark.django_db(transaction=True)

OLD = [("runs", "0008_runlog_uid"), ("dashboard", "0001_initial")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def latest_targets():
    """Every app's newest migration: going back to OLD also unapplies the apps that depend on later
    migrations of runs and dashboard (checkpoints, monitors), and they must come back too."""
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


def old_block(SeriesBlock, run_id, key, index, points):
    """A block as the old writer made it (full blocks of 1024, the last one open)."""
    steps = np.array([s for s, _ in points], dtype="<i8")
    values = np.array([math.nan if v is None else v for _, v in points], dtype="<f8")
    finite = [(v, s) for s, v in points if v is not None]
    low, high = (min(finite), max(finite)) if finite else ((None, None), (None, None))
    return SeriesBlock(run_id=run_id, key=key, index=index, first_step=steps[0], last_step=steps[-1], count=len(points),
                       min_value=low[0], min_step=low[1], max_value=high[0], max_step=high[1],
                       last_value=points[-1][1], steps=steps.tobytes(), values=values.tobytes())


def test_old_format_runs_keep_their_series_through_the_migration():
    leaves = latest_targets()
    apps = migrate(OLD)
    try:
        User = apps.get_model("auth", "User")
        Run = apps.get_model("runs", "Run")
        MetricPoint = apps.get_model("runs", "MetricPoint")
        SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
        owner = User.objects.create(username="before")
        old_time = timezone.now() - timedelta(hours=3)
        # 1) Points only (a run from before the dashboard's blocks), 2,500 steps and a NaN.
        only_points = Run.objects.create(owner=owner, name="points only", status="succeeded", steps=2500)
        expected_points = {"reward": [(s, math.sin(s / 30)) for s in range(1, 2501)],
                           "loss": [(s, None if s == 7 else 1 / s) for s in range(1, 2501, 5)]}
        MetricPoint.objects.bulk_create([MetricPoint(run=only_points, key=k, step=s, value=v, time=old_time)
                                         for k, pairs in expected_points.items() for s, v in pairs])
        # 2) Both stores, as the old worker wrote them (the same points twice).
        both = Run.objects.create(owner=owner, name="both", status="failed", steps=1500)
        pairs = [(s, s / 100) for s in range(1500)]
        MetricPoint.objects.bulk_create([MetricPoint(run=both, key="reward", step=s, value=v, time=old_time) for s, v in pairs])
        SeriesBlock.objects.bulk_create([old_block(SeriesBlock, both.pk, "reward", 0, pairs[:1024]),
                                         old_block(SeriesBlock, both.pk, "reward", 1, pairs[1024:])])
        # 3) Blocks only (a run that logged nothing through the old recorder).
        blocks_only = Run.objects.create(owner=owner, name="blocks only", status="running", steps=3)
        old_block(SeriesBlock, blocks_only.pk, "kl", 0, [(1, 0.5), (2, None), (3, 0.25)]).save()
        ids = (only_points.pk, both.pk, blocks_only.pk)
    finally:
        migrate(leaves)

    from webapp.dashboard.models import SeriesBlock as NewBlock
    from webapp.dashboard.models import digest_of
    from webapp.runs.models import Run as NewRun

    got = series.points_after(ids[0], -1)
    assert got == {k: [[s, v] for s, v in pairs] for k, pairs in sorted(expected_points.items())}
    assert series.points_after(ids[1], -1) == {"reward": [[s, v] for s, v in pairs]}
    assert series.points_after(ids[2], -1) == {"kl": [[1, 0.5], [2, None], [3, 0.25]]}
    # The same chart as before: downsampled from the same points, the same min and max per bucket.
    chart = series.downsample(ids[0], "reward", points=101)
    values = np.array([v for _, v in expected_points["reward"]])
    buckets = np.array_split(values, 50)
    assert {round(min(b), 12) for b in buckets} <= {round(v, 12) for v in chart["y"]}
    assert {round(max(b), 12) for b in buckets} <= {round(v, 12) for v in chart["y"]}
    first, second, third = (NewRun.objects.get(pk=pk) for pk in ids)
    assert first.latest_metrics() == {"reward": math.sin(2500 / 30), "loss": 1 / 2496}
    assert first.metrics_at is not None and abs((first.metrics_at - old_time).total_seconds()) < 1
    assert second.latest_metrics() == {"reward": 14.99} and third.latest_metrics() == {"kl": 0.25}
    assert NewBlock.objects.filter(run_id=ids[0], key="reward").count() == 3  # 2,500 points: 1024 + 1024 + 452
    # Every block has its digest (dashboard.0004 computed those of blocks written before it).
    for block in NewBlock.objects.filter(run_id__in=ids):
        assert bytes(block.digest) == digest_of(*block.arrays()), block

    # And back: the old format holds the same points again (a series written since included).
    series.SeriesWriter(ids[2]).write([("kl", 4, 0.125)])
    apps = migrate(OLD)
    try:
        MetricPoint = apps.get_model("runs", "MetricPoint")
        back = sorted(MetricPoint.objects.filter(run_id=ids[2]).values_list("step", "value"))
        assert back == [(1, 0.5), (2, None), (3, 0.25), (4, 0.125)]
        assert MetricPoint.objects.filter(run_id=ids[0]).count() == 2500 + 500
    finally:
        migrate(leaves)
    assert series.points_after(ids[2], -1) == {"kl": [[1, 0.5], [2, None], [3, 0.25], [4, 0.125]]}


BEFORE_SUMMARIES = [("dashboard", "0003_metricpoints_into_blocks")]


def before_summaries(leaves):
    """The dashboard before its second level, the runs app as it is now: the runs table keeps its
    newest columns, so the historical Run model must have them too (or its inserts leave them null)."""
    return BEFORE_SUMMARIES + [key for key in leaves if key[0] == "runs"]


def test_runs_stored_before_the_summaries_get_them_from_the_migration():
    """Blocks written before the second level existed: the migration summarises every group of 64
    blocks, the same rows the store computes, and a long chart then reads them."""
    leaves = latest_targets()
    apps = migrate(before_summaries(leaves))
    try:
        User = apps.get_model("auth", "User")
        Run = apps.get_model("runs", "Run")
        SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
        owner = User.objects.create(username="before summaries")
        run = Run.objects.create(owner=owner, name="long", status="succeeded", steps=6000)
        rng = np.random.default_rng(5)
        reward = {s: float(v) for s, v in zip(range(6000), rng.normal(size=6000))}
        reward[4321] = 40.0
        pairs = list(reward.items())
        blocks = [old_block(SeriesBlock, run.pk, "reward", i, pairs[i * 20:(i + 1) * 20]) for i in range(300)]  # 4.7 groups
        loss = [(s, None if s < 40 else 1 / s) for s in range(0, 6000, 50)]
        blocks += [old_block(SeriesBlock, run.pk, "loss", i, loss[i * 20:(i + 1) * 20]) for i in range(6)]
        SeriesBlock.objects.bulk_create(blocks)
        run_id = run.pk
    finally:
        migrate(leaves)

    from webapp.dashboard.models import SeriesSummary

    stored = sorted(SeriesSummary.objects.filter(run_id=run_id).values_list(
        "key", "index", "blocks", "count", "first_step", "last_step", "min_value", "min_step", "max_value", "max_step", "last_value"))
    assert [(k, i, b, c) for k, i, b, c, *_ in stored] == [("loss", 0, 6, 120)] + [
        ("reward", g, 64, 1280) for g in range(4)] + [("reward", 4, 44, 880)]
    computed = sorted((s.key, s.index, s.blocks, s.count, s.first_step, s.last_step, s.min_value, s.min_step, s.max_value,
                       s.max_step, s.last_value) for s in series.summaries_from_blocks(run_id))
    assert stored == computed
    for key, index, _, _, first, last, low, low_step, high, high_step, last_value in stored:
        raw = dict(reward if key == "reward" else loss)
        in_group = [v for s, v in raw.items() if first <= s <= last and v is not None]
        assert (low, high) == (min(in_group), max(in_group)) and raw[low_step] == low and raw[high_step] == high
        assert last_value == raw[last]
    chart = series.downsample(run_id, "reward", points=9)  # 4 buckets: the 4 whole groups and one partial
    assert 40.0 in chart["y"] and min(reward.values()) in chart["y"] and chart["count"] == 6000
    assert (chart["x"][-1], chart["y"][-1]) == (5999, reward[5999])

    # Back (the table goes) and forward again: the same rows.
    migrate(before_summaries(leaves))
    migrate(leaves)
    assert stored == sorted(SeriesSummary.objects.filter(run_id=run_id).values_list(
        "key", "index", "blocks", "count", "first_step", "last_step", "min_value", "min_step", "max_value", "max_step", "last_value"))
