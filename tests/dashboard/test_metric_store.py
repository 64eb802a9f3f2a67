"""The metric store against a plain record of what was logged: the same series, the same min and
max per chart bucket, and every step once, through folds, replays after a resume and restarted
writers. (The record is a dict per key where a step logged again replaces its value: what the old
per-point rows held.)"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from webapp.dashboard import series
from webapp.dashboard.models import SeriesBlock, SeriesTail
from webapp.dashboard.recording import DashboardSink
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = ("reward", "loss", "val/reward")


def expected_buckets(values: np.ndarray, points: int) -> tuple[set, set]:
    buckets = (points - 1) // 2
    size = math.ceil(len(values) / buckets)
    chunks = [values[i:i + size] for i in range(0, len(values), size)]
    return ({float(np.nanmin(c)) for c in chunks if np.isfinite(c).any()},
            {float(np.nanmax(c)) for c in chunks if np.isfinite(c).any()})


def check(run_id: int, record: dict[str, dict[int, float]]) -> None:
    stored = series.points_after(run_id, -1)
    assert set(stored) == set(record)
    for key, by_step in record.items():
        expected = [[s, None if math.isnan(v) else v] for s, v in sorted(by_step.items())]
        assert stored[key] == expected, key  # every step once, with its last value
    chart = series.downsample(run_id, "reward", points=201)
    values = np.array([v for _, v in sorted(record["reward"].items())])
    lows, highs = expected_buckets(values, 201)
    assert lows | highs <= set(chart["y"]) and chart["count"] == len(values)


def test_the_store_matches_the_record_through_folds_replays_and_restarts(make_run, monkeypatch, log_with_restarts):
    monkeypatch.setattr(series, "TAIL_FOLD_POINTS", 500)  # fold often
    run = make_run()
    record = log_with_restarts(run.pk, random.Random(7), check, back=(1, 120), steps=(300, 700), flush_chance=0.05)
    assert SeriesBlock.objects.filter(run=run).exists(), "the tail was folded into blocks"
    last = max(record["reward"])
    assert Run.objects.get(pk=run.pk).latest_metrics()["reward"] == record["reward"][last]
    # Ended: the whole tail is folded and the block summaries alone draw the same extremes.
    Run.objects.filter(pk=run.pk).update(status="running")
    Run.objects.get(pk=run.pk).finish("succeeded")
    assert not SeriesTail.objects.filter(run=run).exists()
    check(run.pk, record)
    monkeypatch.setattr(series, "PAYLOAD_BLOCK_LIMIT", 0)
    summary = series.downsample(run.pk, "reward", points=41)
    values = [v for _, v in sorted(record["reward"].items())]
    assert max(values) in summary["y"] and min(values) in summary["y"] and summary["y"][-1] == values[-1]
    assert set(zip(summary["x"], summary["y"])) <= set(record["reward"].items())


def test_a_batch_written_twice_is_stored_once(make_run):
    """A flush whose commit went through but whose answer was lost is written again."""
    run = make_run()
    writer = series.SeriesWriter(run.pk)
    batch = [("reward", s, s / 10) for s in range(1, 6)]
    writer.write(batch)
    writer.write(batch)
    assert series.points_after(run.pk, -1) == {"reward": [[s, s / 10] for s in range(1, 6)]}
    writer.fold()
    assert series.points_after(run.pk, -1) == {"reward": [[s, s / 10] for s in range(1, 6)]}
    assert [b.count for b in SeriesBlock.objects.filter(run=run)] == [5]


def test_a_full_buffer_drops_points_visibly(make_run):
    """The producer's buffer is bounded: past it points are dropped, counted in a metric and logged."""
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False)
    sink.max_points = 10
    for step in range(1, 9):
        sink.log_metrics(step, {"a": 1.0, "b": 2.0})  # 16 points offered, 10 fit
    sink.close()
    stored = series.points_after(run.pk, -1)
    assert [s for s, _ in stored["a"]] == [1, 2, 3, 4, 5]
    assert stored["overload/dropped_points"] == [[8, 6.0]]
    assert run.logs.filter(level="ERROR", message__startswith="6 metric point(s) were dropped").exists()


def test_saving_a_run_loaded_earlier_keeps_what_the_store_wrote_since(make_run):
    """An edit form or the admin saves the whole row it loaded: the store's fields are left alone."""
    run = make_run()
    stale = Run.objects.get(pk=run.pk)
    series.SeriesWriter(run.pk).write([("reward", 7, 0.5), ("rare/key", 7, 1.0)])
    stale.notes = "edited"
    stale.save()
    fresh = Run.objects.get(pk=run.pk)
    assert fresh.notes == "edited" and fresh.steps == 7 and fresh.latest_values == {"reward": 0.5, "rare/key": 1.0}
    assert series.keys_of(run.pk) == ["rare/key", "reward"]
