"""The JSON endpoints, the pages, and who may read them."""

import re

from webapp.dashboard.models import EpisodeSample
from webapp.dashboard.recording import episode_row

def test_series_endpoint_defaults_to_headline_charts(owner_client, make_run, store):
    run = make_run()
    store(run, {"reward": [(1, 0.5), (2, 0.7)], "termination/env_done": [(1, 1.0)], "custom/thing": [(1, 3.0)]})
    data = owner_client.get(f"/dashboard/runs/{run.pk}/series.json").json()
    assert set(data["series"]) == {"reward", "termination/env_done"}
    assert data["keys"] == ["custom/thing", "reward", "termination/env_done"] and data["last_step"] == 2
    one = owner_client.get(f"/dashboard/runs/{run.pk}/series.json?keys=custom/thing").json()
    assert one["series"]["custom/thing"]["y"] == [3.0]


def test_strangers_get_404_everywhere(stranger_client, make_run, store):
    run = make_run()
    store(run, {"reward": [(1, 0.5)]})
    for url in (f"/dashboard/runs/{run.pk}/series.json", f"/dashboard/runs/{run.pk}/episodes.json", f"/dashboard/runs/{run.pk}/"):
        assert stranger_client.get(url).status_code == 404
    data = stranger_client.get(f"/dashboard/compare/series.json?runs={run.pk}&key=reward").json()
    assert data["runs"] == []


def test_episode_viewer_data_drops_token_ids(owner_client, make_run, episode):
    run = make_run()
    EpisodeSample.objects.bulk_create([episode_row(run.pk, 3, 0, episode), episode_row(run.pk, 5, 0, episode)])
    data = owner_client.get(f"/dashboard/runs/{run.pk}/episodes.json").json()
    assert data["steps"] == [3, 5] and data["step"] == 5
    shown = data["episodes"][0]
    assert shown["termination_reason"] == "env_done" and shown["num_turns"] == 2
    turn = shown["episode"]["trajectories"][0]["steps"][0]
    assert turn["model_response"] == "right" and turn["observation"] == "grid 1" and "prompt_ids" not in turn
    assert "prompt_ids" not in shown["episode"]


def test_compare_overlays_visible_runs(owner_client, make_run, store):
    runs = [make_run(name=f"run{i}") for i in range(3)]
    for i, run in enumerate(runs):
        store(run, {"reward": [(s, i + s / 100) for s in range(50)]})
    ids = ",".join(str(r.pk) for r in runs)
    data = owner_client.get(f"/dashboard/compare/series.json?runs={ids}&key=reward").json()
    assert [r["name"] for r in data["runs"]] == ["run0", "run1", "run2"] and len(data["runs"][0]["x"]) == 50
    page = owner_client.get("/dashboard/compare/?" + "&".join(f"runs={r.pk}" for r in runs)).content.decode()
    assert f'data-runs="{ids}"' in page and "compare.js" in page


def test_run_page_embeds_the_dashboard_and_plotly_is_served_locally(owner_client, make_run):
    run = make_run()
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="dash-charts"' in page and "/dashboard/plotly.min.js" in page
    # every script and stylesheet comes from this server (a CSRF token may spell "cdn" by chance)
    sources = re.findall(r'<(?:script|link)[^>]*(?:src|href)="([^"]*)"', page)
    assert sources and all(source.startswith("/") for source in sources), sources
    response = owner_client.get("/dashboard/plotly.min.js")
    assert response.status_code == 200 and response["Content-Type"] == "application/javascript"
    assert b"plotly" in response.content[:2000].lower()


def test_run_list_filters_and_searches(owner_client, make_run):
    make_run(name="alpha")
    beta = make_run(name="beta")
    beta.claim("w")
    assert "beta" in owner_client.get("/?q=bet").content.decode()
    assert "alpha" not in owner_client.get("/?q=bet").content.decode()
    running = owner_client.get("/?status=running").content.decode()
    assert "beta" in running and "alpha" not in running
    assert "alpha" in owner_client.get("/").content.decode() and "Compare selected" in owner_client.get("/").content.decode()
