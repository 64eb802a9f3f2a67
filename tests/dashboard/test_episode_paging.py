"""The episode list at scale: a page's next link starts after its last episode (keyset, however deep),
text search within a narrow step range scans the range rather than asking the trigram index, and the
store's endpoints look their run up without the joins of its registry entries."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from training.tracking.episodes import to_parquet
from webapp.dashboard import episodes as episode_store
from webapp.dashboard.models import StoredEpisode
from webapp.runs import artifacts
from webapp.runs.models import Run

URL = "/api/runs/{}/episodes/"


@pytest.fixture
def run_of_three_steps(make_run, project, tmp_path, settings):
    """Steps 1-3, each with 3 training and 2 validation episodes (index rows only: a listing reads no body);
    texts ``step S episode P: 50% done_`` and ``... nothing``."""
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility=Run.Visibility.TEAM)
    StoredEpisode.objects.bulk_create(
        StoredEpisode(run=run, step=step, split=split, position=position, group=f"g{position}", reward=position / 4,
                      text=f"step {step} episode {position}: " + ("50% done_" if position == 1 else "nothing"),
                      body_key=f"episodes/{split}/step-{step}.parquet", body_row=position)
        for step in (1, 2, 3) for split, count in (("train", 3), ("val", 2)) for position in range(count))
    # Step 1's training bodies (the token view of its first episode reads one).
    artifacts.store().put_bytes(to_parquet([{"split": "train", "step": 1, "position": p, "token_ids": [p]} for p in range(3)]),
                                "episodes/train/step-1.parquet")
    return run


def pages(client, run, **params) -> list[dict]:
    """Every page, following each one's next link; each page's size."""
    found, sizes = [], []
    response = client.get(URL.format(run.pk), params)
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        found.extend(body["results"])
        sizes.append(len(body["results"]))
        if body["next"] is None:
            return found, sizes
        assert "offset" not in body["next"] and "cursor=" in body["next"]
        response = client.get(body["next"])


def test_next_pages_start_after_the_last_listed_episode_across_steps_and_splits(run_of_three_steps, api_client, owner):
    listed, sizes = pages(api_client(owner), run_of_three_steps, limit=4)
    assert sizes == [4, 4, 4, 3]
    assert [(e["step"], e["split"], e["position"]) for e in listed] == [
        (step, split, position) for step in (1, 2, 3) for split, count in (("train", 3), ("val", 2))
        for position in range(count)]


def test_the_next_link_keeps_the_filters_and_an_offset_is_still_a_start(run_of_three_steps, api_client, owner):
    client = api_client(owner)
    listed, _ = pages(client, run_of_three_steps, limit=1, reward_min=0.25, offset=1)
    assert [(e["step"], e["split"], e["position"]) for e in listed] == [
        (1, "train", 2), (1, "val", 1), (2, "train", 1), (2, "train", 2), (2, "val", 1), (3, "train", 1), (3, "train", 2),
        (3, "val", 1)]


@pytest.mark.parametrize("cursor", ["2:test:0", "x", "1:train", "99999999999:train:0", "1:train:9999999999"])
def test_a_cursor_out_of_shape_or_bounds_is_a_400_naming_it(run_of_three_steps, api_client, owner, cursor):
    response = api_client(owner).get(URL.format(run_of_three_steps.pk), {"cursor": cursor})
    assert response.status_code == 400 and "cursor" in response.json(), response.content


def _listing_sql(client, run, **params) -> tuple[list[tuple], str]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(URL.format(run.pk), params)
    assert response.status_code == 200, response.content
    listing = [q["sql"] for q in queries if 'FROM "dashboard_storedepisode"' in q["sql"] and "COUNT(*)" not in q["sql"]]
    return [(e["step"], e["split"], e["position"]) for e in response.json()["results"]], listing[-1]


def test_text_within_a_narrow_step_range_scans_the_range_and_matches_as_text_everywhere(
        run_of_three_steps, api_client, owner, monkeypatch):
    client = api_client(owner)
    expected = [(2, "train", 1), (2, "val", 1), (3, "train", 1), (3, "val", 1)]
    # A narrow range: a substring test no index answers (the trigram index's LIKE is not in the query).
    found, sql = _listing_sql(client, run_of_three_steps, q="50% DONE_", step_min=2)
    assert found == expected and "LIKE" not in sql
    # % and _ are text, not patterns, either way.
    assert _listing_sql(client, run_of_three_steps, q="1: 5_%", step_min=2)[0] == []
    # The whole run, or a range wider than the scan's limit: the pattern the trigram index answers.
    found, sql = _listing_sql(client, run_of_three_steps, q="50% done_")
    assert len(found) == 6 and "LIKE" in sql
    monkeypatch.setattr(episode_store, "TEXT_SCAN_MAX_EPISODES", 0)
    found, sql = _listing_sql(client, run_of_three_steps, q="50% DONE_", step_min=2)
    assert found == expected and "LIKE" in sql


@pytest.mark.parametrize("path", ["", "histogram/", "{episode}/"])
def test_the_store_endpoints_look_the_run_up_without_joining_its_registry_entries(
        run_of_three_steps, api_client, teammate, path):
    episode = StoredEpisode.objects.filter(run=run_of_three_steps).first()
    client = api_client(teammate)  # a teammate: the access check reads the run's project and team
    with CaptureQueriesContext(connection) as queries:
        response = client.get(URL.format(run_of_three_steps.pk) + path.format(episode=episode.pk))
    assert response.status_code == 200, response.content
    run_lookups = [q["sql"] for q in queries if 'FROM "runs_run"' in q["sql"]]
    assert run_lookups and not any("registry_" in sql or "auth_user" in sql for sql in run_lookups)
