"""Finding 5: numbers that are not whole numbers in chart requests, and bodies nested past
Python's recursion limit, answer 400 naming what is wrong (they answered 500)."""

from __future__ import annotations

import pytest

from webapp.runs.models import Run

NOT_WHOLE_NUMBERS = ["inf", "-inf", "nan", "1e999", "Infinity", "1.5", "9" * 5000, "²"]


@pytest.fixture
def run(make_run):
    from webapp.dashboard.series import SeriesWriter

    run = make_run()
    SeriesWriter(run.pk).write([("reward", step, step / 10) for step in range(1, 6)])
    return run


def _urls(run: Run) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {
        "series": (f"/dashboard/runs/{run.pk}/series.json", ("start", "end", "points")),
        "episodes": (f"/dashboard/runs/{run.pk}/episodes.json", ("step",)),
        "compare": (f"/dashboard/compare/series.json?runs={run.pk}", ("start", "end", "points")),
    }


@pytest.mark.parametrize("endpoint", ["series", "episodes", "compare"])
@pytest.mark.parametrize("value", NOT_WHOLE_NUMBERS)
def test_a_number_parameter_that_is_not_a_whole_number_is_a_400_naming_it(owner_client, run, endpoint, value):
    url, parameters = _urls(run)[endpoint]
    for parameter in parameters:
        response = owner_client.get(url, {parameter: value})
        assert response.status_code == 400, (parameter, value, response.status_code)
        body = response.json()
        assert parameter in body["errors"] and body["error"].startswith(f"{parameter}:"), body


@pytest.mark.parametrize("endpoint", ["series", "episodes", "compare"])
def test_in_range_numbers_still_work(owner_client, run, endpoint):
    url, parameters = _urls(run)[endpoint]
    response = owner_client.get(url, {name: 2 if name != "points" else 100 for name in parameters})
    assert response.status_code == 200


def test_a_zoom_left_of_step_zero_still_draws(owner_client, run):
    """The chart asks from Math.floor of its left edge, which may be negative."""
    response = owner_client.get(f"/dashboard/runs/{run.pk}/series.json", {"keys": "reward", "start": -3, "end": 3})
    assert response.status_code == 200 and response.json()["series"]["reward"]["x"] == [1, 2, 3]


def test_the_share_link_reader_gets_the_same_400(run, owner, page_client):
    from webapp.teams.models import ShareLink

    link = ShareLink.objects.create(run=run, created_by=owner)
    response = page_client(None).get(f"/dashboard/runs/{run.pk}/series.json", {"share": link.token, "start": "inf"})
    assert response.status_code == 400 and "start" in response.json()["errors"]


def test_compare_ignores_run_ids_that_are_not_ascii_numbers(owner_client, run):
    response = owner_client.get("/dashboard/compare/series.json", {"runs": f"{run.pk},²,{'9' * 40},-1"})
    assert response.status_code == 200 and [r["id"] for r in response.json()["runs"]] == [run.pk]
    assert owner_client.get("/dashboard/compare/", {"runs": "²"}).status_code == 200


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_the_api_series_refuses_them_too(api_client, owner, run, value):
    for parameter in ("start", "end", "points"):
        response = api_client(owner).get(f"/api/runs/{run.pk}/series/", {parameter: value})
        assert response.status_code == 400 and parameter in response.json()


@pytest.mark.parametrize("path", ["/api/runs/", "metrics", "logs", "finish"])
def test_a_100k_deep_json_body_is_a_400(api_client, owner, db, path):
    run = Run.objects.create(owner=owner, kind=Run.Kind.EXTERNAL, status=Run.Status.RUNNING)
    url = path if path.startswith("/") else f"/api/runs/{run.pk}/{path}/"
    body = "[" * 100_000 + "]" * 100_000
    response = api_client(owner).post(url, body, content_type="application/json")
    assert response.status_code == 400 and "nests deeper" in response.json()["detail"]


def test_a_moderately_deep_body_is_refused_before_any_recursive_step(api_client, owner, registry):
    """900 levels parse, but the overrides' YAML dump would then recurse past the limit."""
    nested: dict = {}
    for _ in range(900):
        nested = {"k": nested}
    response = api_client(owner).post("/api/runs/", {"agent": "copy-task", "overrides": nested}, format="json")
    assert response.status_code == 400 and "nests deeper" in response.json()["detail"]
    assert Run.objects.count() == 0
