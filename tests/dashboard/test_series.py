"""Series blocks and spike-keeping downsampling."""

import math

from webapp.dashboard import series
from webapp.dashboard.models import BLOCK_SIZE, SeriesBlock, SeriesTail


def test_writer_appends_then_folds_into_blocks_and_replaces_resent_steps(make_run, store):
    run = make_run()
    store(run, {"reward": [(s, float(s)) for s in range(BLOCK_SIZE + 10)]})
    assert not SeriesBlock.objects.filter(run=run).exists() and SeriesTail.objects.filter(run=run).count() == 1
    assert series.SeriesWriter(run.pk).fold() == BLOCK_SIZE + 10
    blocks = list(SeriesBlock.objects.filter(run=run, key="reward").order_by("index"))
    assert [b.count for b in blocks] == [BLOCK_SIZE, 10] and not SeriesTail.objects.filter(run=run).exists()
    store(run, {"reward": [(5, -1.0), (BLOCK_SIZE + 10, 7.0)]})  # a replayed step, and a new one
    for moment in ("in the tail", "folded"):
        points = series.points_after(run.pk, -1)["reward"]
        assert len(points) == BLOCK_SIZE + 11 and points[5] == [5, -1.0] and points[-1] == [BLOCK_SIZE + 10, 7.0], moment
        series.SeriesWriter(run.pk).fold()
    blocks = list(SeriesBlock.objects.filter(run=run, key="reward").order_by("index"))
    assert [b.count for b in blocks] == [BLOCK_SIZE, 10, 1] and blocks[0].min_value == -1.0  # the closed block took the replay


def test_small_series_comes_back_raw_with_nan_as_null(make_run, store):
    run = make_run()
    store(run, {"loss": [(1, 0.5), (2, math.nan), (3, math.inf), (4, 0.25)]})
    data = series.downsample(run.pk, "loss")
    assert data["raw"] and data["x"] == [1, 2, 3, 4] and data["y"] == [0.5, None, None, 0.25]


def test_long_series_is_bounded_and_keeps_spikes_and_last_point(make_run, store):
    run = make_run()
    values = [(s, math.sin(s / 50)) for s in range(200_000)]
    values[123_457] = (123_457, 1000.0)
    values[7] = (7, -500.0)
    values[-1] = (199_999, 0.123)
    store(run, {"reward": values})
    data = series.downsample(run.pk, "reward", points=1500)
    assert not data["raw"] and 200 <= len(data["x"]) <= 1501
    pairs = dict(zip(data["x"], data["y"]))
    assert pairs[123_457] == 1000.0 and pairs[7] == -500.0 and pairs[199_999] == 0.123
    assert data["x"] == sorted(data["x"]) and data["count"] == 200_000


def test_zoom_reads_a_finer_view_of_the_range(make_run, store):
    run = make_run()
    store(run, {"reward": [(s, float(s % 97)) for s in range(100_000)]})
    zoomed = series.downsample(run.pk, "reward", start=5000, end=5999, points=1500)
    assert zoomed["raw"] and zoomed["x"] == list(range(5000, 6000))
    mid = series.downsample(run.pk, "reward", start=10_000, end=40_000, points=600)
    assert 10_000 <= min(mid["x"]) and max(mid["x"]) <= 40_000 and len(mid["x"]) <= 601
    assert max(mid["y"]) == 96.0 and min(mid["y"]) == 0.0


def test_many_runs_at_once(make_run, store):
    runs = [make_run(name=f"r{i}") for i in range(3)]
    for i, run in enumerate(runs):
        store(run, {"reward": [(s, float(i)) for s in range(5000)]})
    result = series.downsample_many([r.pk for r in runs], "reward", points=300)
    assert [result[r.pk]["y"][0] for r in runs] == [0.0, 1.0, 2.0]
    assert all(len(result[r.pk]["x"]) <= 301 for r in runs)


def test_many_runs_are_read_from_digests_with_each_buckets_extremes(make_run, store, monkeypatch):
    """Runs holding more blocks together than one chart reads points of (the compare page) are drawn
    from the blocks' digests: each bucket of digest rows gives its min and max at their steps, the
    same ones the points give, spikes and each run's last point included; no point is decoded."""
    import numpy as np

    from webapp.dashboard.models import DIGEST_SPAN

    rng = np.random.default_rng(5)
    runs = [make_run(name=f"d{i}") for i in range(4)]
    raw = {}
    for run in runs:
        values = rng.normal(size=20_000)
        values[rng.integers(20_000, size=3)] = [40.0, -40.0, 25.0]
        values[77] = math.nan
        raw[run.pk] = values
        store(run, {"reward": [(s, float(v)) for s, v in enumerate(values)]})
    assert SeriesBlock.objects.filter(run__in=runs).count() > series.PAYLOAD_BLOCK_LIMIT

    def no_points(*args):
        raise AssertionError("points were decoded")

    monkeypatch.setattr(series, "unpack", no_points)
    points = 301
    result = series.downsample_many([r.pk for r in runs], "reward", points=points)
    for run in runs:
        values = raw[run.pk]
        # The reference from the points: DIGEST_SPAN-point rows within each block, bucketed as the
        # chart buckets rows (by the points before each, in proportion to the chart's buckets).
        rows = [(start, min(start + DIGEST_SPAN, block + BLOCK_SIZE, len(values)))
                for block in range(0, len(values), BLOCK_SIZE)
                for start in range(block, min(block + BLOCK_SIZE, len(values)), DIGEST_SPAN)]
        buckets = (points - 1) // 2
        assert len(rows) > buckets
        spans: dict[int, list[int]] = {}
        for first, last in rows:
            bucket = math.floor(first * buckets / len(values))
            spans.setdefault(bucket, [first, last])[1] = last
        expected = {len(values) - 1}
        for first, last in spans.values():
            chunk = values[first:last]
            expected |= {first + int(np.nanargmin(chunk)), first + int(np.nanargmax(chunk))}
        chart = result[run.pk]
        assert chart["x"] == sorted(expected) and chart["count"] == 20_000 and not chart["raw"]
        assert chart["y"] == [float(values[s]) for s in chart["x"]]
        assert {40.0, -40.0, 25.0} <= set(chart["y"])
    # A run still logging (points in its tail past the blocks) is drawn from its digests and its tail.
    monkeypatch.undo()  # the tail's points are decoded
    tail = [(s, 60.0 if s == 20_050 else 0.5) for s in range(20_000, 20_100)]
    series.SeriesWriter(runs[0].pk).write(("reward", s, v) for s, v in tail)
    chart = series.downsample_many([r.pk for r in runs], "reward", points=points)[runs[0].pk]
    known = {**dict(enumerate(raw[runs[0].pk].tolist())), **dict(tail)}
    assert all(known[s] == v for s, v in zip(chart["x"], chart["y"])) and chart["x"] == sorted(chart["x"])
    assert {40.0, -40.0, 25.0, 60.0} <= set(chart["y"]) and chart["x"][-1] == 20_099 and chart["count"] == 20_100
