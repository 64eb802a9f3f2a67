"""The store's second level (one summary per group of blocks) against the raw points: each summary
is its blocks' points summarised (count, step range, min and max and where, last value), kept so
through folds, replayed steps and restarted writers, and a chart of a long range read from the
summaries keeps the same extremes per bucket as the points. Small blocks and groups stand in for
the real sizes (1,024 points a block, 64 blocks a group), so a few thousand steps make many groups."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from webapp.dashboard import series
from webapp.dashboard.models import SeriesBlock, SeriesSummary

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_levels(monkeypatch):
    monkeypatch.setattr(series, "BLOCK_SIZE", 8)
    monkeypatch.setattr(series, "SUMMARY_BLOCKS", 4)
    monkeypatch.setattr(series, "TAIL_FOLD_POINTS", 120)


@pytest.fixture
def levels_read(monkeypatch):
    """Which runs each chart read from the summaries (the level chosen is not visible in its result)."""
    chosen: list[set[int]] = []
    real = series._summary_level

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        chosen.append(set(found))
        return found

    monkeypatch.setattr(series, "_summary_level", spy)
    return chosen


def check_summaries(run_id: int, record: dict[str, dict[int, float]]) -> None:
    """Every summary against the raw points of its group's blocks (steps read from the blocks,
    values from the record of what was logged). The tail is folded first: until then a replayed
    step's new value is in the tail, not yet in its block."""
    series.SeriesWriter(run_id).fold()
    groups: dict[tuple[str, int], list[np.ndarray]] = {}
    for block in SeriesBlock.objects.filter(run_id=run_id):
        groups.setdefault((block.key, block.index // series.SUMMARY_BLOCKS), []).append(block.arrays()[0])
    summaries = {(s.key, s.index): s for s in SeriesSummary.objects.filter(run_id=run_id)}
    assert set(summaries) == set(groups)
    for (key, group), parts in groups.items():
        steps = np.sort(np.concatenate(parts))
        assert len(np.unique(steps)) == len(steps), "a step in two blocks"
        values = np.array([record[key][int(s)] for s in steps])
        summary = summaries[(key, group)]
        assert (summary.count, summary.blocks) == (len(steps), len(parts)), (key, group)
        assert (summary.first_step, summary.last_step) == (steps[0], steps[-1])
        assert summary.last_value == (None if math.isnan(values[-1]) else values[-1])
        if np.isfinite(values).any():
            assert summary.min_value == np.nanmin(values) and summary.max_value == np.nanmax(values)
            assert record[key][summary.min_step] == summary.min_value and record[key][summary.max_step] == summary.max_value
        else:
            assert summary.min_value is None and summary.max_value is None


def test_summaries_match_the_points_through_folds_replays_and_restarts(make_run, small_levels, levels_read, log_with_restarts):
    run = make_run()
    record = log_with_restarts(run.pk, random.Random(11), check_summaries, back=(20, 150), steps=(400, 700), flush_chance=0.04)
    series.SeriesWriter(run.pk).fold()
    check_summaries(run.pk, record)
    # What the fold kept up to date is what the blocks give when summarised from scratch.
    kept = sorted(SeriesSummary.objects.filter(run=run).values_list("key", "index", "blocks", "count", "first_step", "last_step",
                                                                     "min_value", "min_step", "max_value", "max_step", "last_value"))
    series.rebuild_summaries(run.pk)
    assert kept == sorted(SeriesSummary.objects.filter(run=run).values_list(
        "key", "index", "blocks", "count", "first_step", "last_step", "min_value", "min_step", "max_value", "max_step", "last_value"))
    # Every step once: the summaries of a key count each logged step once.
    for key, by_step in record.items():
        assert sum(SeriesSummary.objects.filter(run=run, key=key).values_list("count", flat=True)) == len(by_step)

    # The full-range chart, one bucket per group: the same min and max per bucket as the points.
    groups = SeriesSummary.objects.filter(run=run, key="reward").count()
    assert groups >= 20
    chart = series.downsample(run.pk, "reward", points=2 * groups + 1)
    assert levels_read[-1] == {run.pk}, "read from the summaries"
    assert chart["count"] == len(record["reward"]) and chart["x"] == sorted(chart["x"])
    assert set(zip(chart["x"], chart["y"])) <= set(record["reward"].items())
    last = max(record["reward"])
    assert (chart["x"][-1], chart["y"][-1]) == (last, record["reward"][last])
    for summary in SeriesSummary.objects.filter(run=run, key="reward"):
        in_group = [v for s, v in record["reward"].items() if summary.first_step <= s <= summary.last_step]
        assert min(in_group) in chart["y"] and max(in_group) in chart["y"]
    # Fewer buckets than groups: still the series' extremes, from the summaries.
    coarse = series.downsample(run.pk, "reward", points=21)
    assert levels_read[-1] == {run.pk}
    assert min(record["reward"].values()) in coarse["y"] and max(record["reward"].values()) in coarse["y"]
    # A zoomed range: whole groups inside it from their summaries, the groups its ends cut from their blocks.
    start, end = 150, last - 150
    zoomed = series.downsample(run.pk, "reward", start=start, end=end, points=21)
    assert levels_read[-1] == {run.pk}
    inside = [v for s, v in record["reward"].items() if start <= s <= end]
    assert min(zoomed["y"]) <= min(inside) and max(zoomed["y"]) >= max(inside)
    assert set(zip(zoomed["x"], zoomed["y"])) <= set(record["reward"].items())
    assert all(start - series.BLOCK_SIZE <= s <= end + series.BLOCK_SIZE for s in zoomed["x"])
    # More buckets than groups: the blocks are read instead.
    fine = series.downsample(run.pk, "reward", points=2 * groups + 41)
    assert levels_read[-1] == set()
    assert min(record["reward"].values()) in fine["y"] and max(record["reward"].values()) in fine["y"]


def test_a_fold_replayed_leaves_the_summaries_as_they_were(make_run, small_levels):
    """A batch whose commit went through but whose answer was lost is written again, and folded again."""
    run = make_run()
    writer = series.SeriesWriter(run.pk)
    batch = [("reward", s, math.cos(s)) for s in range(1, 200)]
    writer.write(batch)
    writer.fold()
    before = list(SeriesSummary.objects.filter(run=run).order_by("index").values_list("count", "min_value", "max_value", "last_value"))
    writer.write(batch)
    writer.fold()
    after = list(SeriesSummary.objects.filter(run=run).order_by("index").values_list("count", "min_value", "max_value", "last_value"))
    assert before == after and sum(c for c, *_ in after) == 199
    check_summaries(run.pk, {"reward": {s: v for _, s, v in batch}})


def test_compare_reads_each_run_at_its_own_level(make_run, store, small_levels, levels_read):
    long_run, short_run = make_run(name="long"), make_run(name="short")
    long_values = {s: math.sin(s / 7) for s in range(3000)}
    long_values[1234] = 9.0
    store(long_run, {"reward": list(long_values.items())})
    store(short_run, {"reward": [(s, float(s)) for s in range(40)]})
    series.SeriesWriter(long_run.pk).fold()
    result = series.downsample_many([long_run.pk, short_run.pk], "reward", points=41)
    assert levels_read[-1] == {long_run.pk}
    assert result[short_run.pk]["raw"] and result[short_run.pk]["y"] == [float(s) for s in range(40)]
    long_chart = result[long_run.pk]
    assert 9.0 in long_chart["y"] and min(long_values.values()) in long_chart["y"] and long_chart["count"] == 3000
    assert set(zip(long_chart["x"], long_chart["y"])) <= set(long_values.items())
