"""``series.json?after=``: the run page reads back the steps a lost live message carried."""

from __future__ import annotations

from webapp.dashboard import consumers
from webapp.dashboard.series import SeriesWriter


def _after(client, run, query: str):
    return client.get(f"/dashboard/runs/{run.pk}/series.json?{query}")


def test_after_returns_exactly_the_points_past_the_step(owner_client, make_run, store):
    run = make_run()
    store(run, {"reward": [(s, s / 10) for s in range(1, 11)], "loss": [(s, 1.0) for s in range(1, 11, 3)],
                "system/cpu/0": [(10, 50.0)]})
    data = _after(owner_client, run, "after=6").json()
    # Every key by default: a lost message may have brought the run's first point of any key.
    assert data["series"] == {
        "reward": {"x": [7, 8, 9, 10], "y": [0.7, 0.8, 0.9, 1.0]},
        "loss": {"x": [7, 10], "y": [1.0, 1.0]},
        "system/cpu/0": {"x": [10], "y": [50.0]},
    }
    assert data["last_step"] == 10 and data["after"] == 6 and data["too_many"] is False
    only = _after(owner_client, run, "after=8&keys=reward,nothing").json()
    assert only["series"] == {"reward": {"x": [9, 10], "y": [0.9, 1.0]}}
    assert _after(owner_client, run, "after=10").json()["series"] == {}


def test_after_reads_folded_blocks_and_the_tail_alike(owner_client, make_run, store):
    """A gap that starts inside a closed block and ends in the unfolded tail, a step stored twice included."""
    run = make_run()
    store(run, {"reward": [(s, float(s)) for s in range(1, 3001)]})
    SeriesWriter(run.pk).fold()
    store(run, {"reward": [(s, float(s)) for s in range(3001, 3011)] + [(2999, -1.0)]})
    data = _after(owner_client, run, "after=2995").json()
    assert data["series"]["reward"]["x"] == list(range(2996, 3011))
    assert data["series"]["reward"]["y"][3] == -1.0  # step 2999: the later value


def test_a_gap_past_the_bound_says_so_and_carries_no_points(owner_client, make_run, store, monkeypatch):
    monkeypatch.setattr(consumers, "BACKLOG_LIMIT", 100)
    run = make_run()
    store(run, {"reward": [(s, 0.0) for s in range(1, 501)]})
    data = _after(owner_client, run, "after=0").json()
    assert data["too_many"] is True and data["series"] == {} and data["limit"] == 100 and data["last_step"] == 500
    near = _after(owner_client, run, "after=400").json()
    assert near["too_many"] is False and near["series"]["reward"]["x"] == list(range(401, 501))
    assert _after(owner_client, run, "after=399").json()["too_many"] is True


def test_the_bound_counts_points_in_the_range_not_whole_blocks(owner_client, make_run, store, monkeypatch):
    """Twenty keys whose last closed block holds 1,000 points: a gap of three steps is 60 points, not 20,000."""
    monkeypatch.setattr(consumers, "BACKLOG_LIMIT", 100)
    run = make_run()
    store(run, {f"metric/{k:02d}": [(s, 1.0) for s in range(1, 1001)] for k in range(20)})
    SeriesWriter(run.pk).fold()
    data = _after(owner_client, run, "after=997").json()
    assert data["too_many"] is False and all(s["x"] == [998, 999, 1000] for s in data["series"].values())
    assert len(data["series"]) == 20


def test_a_bad_after_is_400(owner_client, make_run):
    run = make_run()
    for value in ("x", "1.5", "nan", "1e999"):
        response = _after(owner_client, run, f"after={value}")
        assert response.status_code == 400 and "after" in response.json()["errors"], value


def test_access_is_the_series_endpoints(client, owner_client, stranger_client, make_run, store, owner):
    from webapp.teams.models import ShareLink

    run = make_run()
    store(run, {"reward": [(1, 0.5), (2, 0.6)]})
    assert stranger_client.get(f"/dashboard/runs/{run.pk}/series.json?after=0").status_code == 404
    assert stranger_client.get(f"/dashboard/runs/{run.pk}/series.json?after=0&keys=reward").status_code == 404
    link = ShareLink.objects.create(run=run, created_by=owner)
    client.logout()
    anonymous = client.get(f"/dashboard/runs/{run.pk}/series.json?after=0")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    shared = client.get(f"/dashboard/runs/{run.pk}/series.json?share={link.token}&after=1").json()
    assert shared["series"] == {"reward": {"x": [2], "y": [0.6]}}
    other = make_run()
    assert client.get(f"/dashboard/runs/{other.pk}/series.json?share={link.token}&after=0").status_code == 404
