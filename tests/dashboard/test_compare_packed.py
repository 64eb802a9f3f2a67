"""The compare page's packed series (typed arrays instead of JSON numbers) and the cache of ended
runs' series behind both compare endpoints."""

import json
import logging
import math
import struct

import numpy as np
from django.test import override_settings

from webapp.dashboard.models import SeriesBlock, SeriesTail
from webapp.runs.models import Run


def unpack(body: bytes) -> dict:
    """The packed layout as views.compare_series_packed documents it, read as the page reads it."""
    (length,) = struct.unpack_from("<I", body)
    header = json.loads(body[4:4 + length])
    offset = -(-(4 + length) // 8) * 8
    total = sum(run["points"] for run in header["runs"])
    steps = np.frombuffer(body, "<i4" if header["x_type"] == "int32" else "<f8", total, offset)
    values = np.frombuffer(body, "<f4", total, offset + steps.nbytes)
    assert offset + steps.nbytes + values.nbytes == len(body)
    at = 0
    for run in header["runs"]:
        run["x"], run["y"] = steps[at:at + run["points"]], values[at:at + run["points"]]
        at += run["points"]
    return header


def both(client, ids: str, key: str = "reward", points: int = 200) -> tuple[dict, dict]:
    query = f"runs={ids}&key={key}&points={points}"
    packed = client.get(f"/dashboard/compare/series.bin?{query}")
    assert packed.status_code == 200 and packed["Content-Type"] == "application/octet-stream"
    return unpack(packed.content), client.get(f"/dashboard/compare/series.json?{query}").json()


def test_packed_series_hold_the_json_series_numbers(owner_client, make_run, store):
    runs = [make_run(name=f"run{i}") for i in range(3)]
    for i, run in enumerate(runs):
        store(run, {"reward": [(s, i + s / 7) for s in range(1000)]})
    store(runs[1], {"reward": [(1000, float("nan"))]})
    packed, as_json = both(owner_client, ",".join(str(r.pk) for r in runs))
    assert packed["key"] == "reward" and packed["x_type"] == "int32"
    assert [r["name"] for r in packed["runs"]] == ["run0", "run1", "run2"]
    for mine, theirs in zip(packed["runs"], as_json["runs"], strict=True):
        assert mine["points"] == len(theirs["x"]) and 100 < mine["points"] <= 201
        assert (mine["count"], mine["last_step"], mine["raw"]) == (theirs["count"], theirs["last_step"], theirs["raw"])
        assert mine["x"].tolist() == theirs["x"]
        expected = np.array([math.nan if y is None else y for y in theirs["y"]], dtype=np.float32)
        np.testing.assert_array_equal(mine["y"], expected)  # float32 of the same numbers, NaN where JSON says null
    assert math.isnan(packed["runs"][1]["y"][-1]) and as_json["runs"][1]["y"][-1] is None


def test_steps_past_32_bits_are_packed_as_float64(owner_client, make_run, store):
    run = make_run()
    steps = [2**33 + s for s in range(10)]
    store(run, {"reward": [(s, 0.5) for s in steps]})
    packed, _ = both(owner_client, str(run.pk))
    assert packed["x_type"] == "float64" and packed["runs"][0]["x"].tolist() == steps


def test_strangers_get_no_packed_runs(stranger_client, make_run, store):
    run = make_run()
    store(run, {"reward": [(1, 0.5)]})
    body = stranger_client.get(f"/dashboard/compare/series.bin?runs={run.pk}&key=reward").content
    assert unpack(body)["runs"] == []


def test_a_bad_range_is_400_with_the_reason(owner_client, make_run):
    response = owner_client.get(f"/dashboard/compare/series.bin?runs={make_run().pk}&points=inf")
    assert response.status_code == 400 and "points" in response.json()["errors"]


def _drop_points(run) -> None:
    """Remove a run's stored points behind the store's back (its ``metrics_at`` unchanged)."""
    SeriesBlock.objects.filter(run=run).delete()
    SeriesTail.objects.filter(run=run).delete()


def test_an_ended_runs_series_is_served_from_the_cache_until_it_is_written(owner_client, make_run, store):
    run = make_run(status=Run.Status.SUCCEEDED)
    store(run, {"reward": [(s, s / 10) for s in range(50)]})
    first, _ = both(owner_client, str(run.pk))
    _drop_points(run)
    cached, as_json = both(owner_client, str(run.pk))
    assert cached["runs"][0]["x"].tolist() == first["runs"][0]["x"].tolist() == list(range(50))
    assert as_json["runs"][0]["x"] == list(range(50))  # the JSON endpoint reads the same entries
    store(run, {"reward": [(50, 9.0)]})  # a write (a late replay, say) names new entries
    after, _ = both(owner_client, str(run.pk))
    assert after["runs"][0]["x"].tolist() == [50] and after["runs"][0]["count"] == 1


def test_a_running_runs_series_is_always_read_from_the_store(owner_client, make_run, store):
    run = make_run(status=Run.Status.RUNNING)
    store(run, {"reward": [(s, s / 10) for s in range(50)]})
    assert both(owner_client, str(run.pk))[0]["runs"][0]["points"] == 50
    _drop_points(run)
    assert both(owner_client, str(run.pk))[0]["runs"][0]["points"] == 0


def test_a_cache_that_fails_is_read_past(owner_client, make_run, store, caplog):
    run = make_run(status=Run.Status.SUCCEEDED)
    store(run, {"reward": [(s, s / 10) for s in range(50)]})
    down = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "series": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}
    with override_settings(CACHES=down), caplog.at_level(logging.WARNING, logger="webapp.dashboard.series"):
        packed, _ = both(owner_client, str(run.pk))
    assert packed["runs"][0]["x"].tolist() == list(range(50))
    assert "the series cache could not be read" in caplog.text and "could not be written" in caplog.text
