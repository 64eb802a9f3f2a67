"""The runs API: token and session auth, creation validated exactly like the form, filters,
cancel, edit, delete, series and logs, and what external runs report."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from webapp.dashboard.series import points_after
from webapp.runs.models import Run, RunLog

TINY = {"trainer.total_training_steps": 3, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4}


def _platform_run(**extra):
    return {"name": "api run", "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl",
            "model": "tiny-char", "overrides": TINY, **extra}


def test_token_obtained_with_a_password_authenticates(owner, client, registry):
    token = client.post("/api/token/", {"username": "owner", "password": "owner-password"}).json()["token"]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get("/api/runs/").status_code == 200
    api.credentials(HTTP_AUTHORIZATION="Token wrong")
    assert api.get("/api/runs/").status_code == 401


def test_session_auth_needs_the_csrf_token_for_writes(owner, make_run):
    run = make_run()
    api = APIClient(enforce_csrf_checks=True)
    api.force_login(owner)
    assert api.get(f"/api/runs/{run.pk}/").status_code == 200
    assert api.post(f"/api/runs/{run.pk}/cancel/").status_code == 403
    run.refresh_from_db()
    assert run.status == "queued"


@pytest.mark.real_check
def test_create_validates_and_queues_like_the_form(owner, api_client, registry, no_queue, project):
    response = api_client(owner).post("/api/runs/", _platform_run(tags=["api"], project=project.pk, visibility="team"), format="json")
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert run.status == "queued" and run.kind == "platform" and run.config_overrides == TINY
    assert run.tags == ["api"] and run.project == project and run.visibility == "team"
    assert response.json()["agent"] == "copy-task"


@pytest.mark.parametrize("change,field,message", [
    ({"overrides": {"data.train_batch_size": 0}}, "overrides", "train_batch_size"),
    ({"agent": "no-such-agent"}, "agent", "No agent named 'no-such-agent' among those you may use; choose one of: calculator, copy-task,"),
    ({"backend": "trll"}, "backend", "No backend named 'trll' among those you may use; choose one of: fireworks, swift, tinker, trl."),
    ({"overrides": {"actor_rollout_ref.model.path": "x"}}, "overrides", "Model field"),
])
def test_create_reports_the_forms_errors_by_field(change, field, message, owner, api_client, registry, no_queue, copy_form_data):
    response = api_client(owner).post("/api/runs/", _platform_run(**change), format="json")
    assert response.status_code == 400 and message in str(response.json()[field]), response.json()
    assert not Run.objects.exists()


def test_a_disabled_backend_refuses_new_runs_with_a_clear_message(owner, api_client, registry, no_queue):
    backend = registry["backends"]["trl"]
    backend.enabled = False
    backend.save()
    response = api_client(owner).post("/api/runs/", _platform_run(), format="json")
    assert response.status_code == 400
    assert response.json()["backend"] == ["Backend 'trl' is disabled by an administrator; choose another."]
    assert not Run.objects.exists()


def test_list_filters(owner, api_client, make_run, project):
    make_run(name="alpha", tags=["sweep"], status="succeeded")
    make_run(name="beta", project=project, visibility="team")
    api = api_client(owner)
    names = lambda **q: sorted(r["name"] for r in api.get("/api/runs/", q).json()["results"])  # noqa: E731
    assert names() == ["alpha", "beta"]
    assert names(status="succeeded") == ["alpha"]
    assert names(tag="sweep") == ["alpha"]
    assert names(project=project.pk) == ["beta"]
    assert names(q="bet") == ["beta"]
    assert names(kind="external") == []
    assert api.get("/api/runs/", {"status": "nope"}).status_code == 400


def test_cancel_edit_delete(owner, api_client, make_run):
    run = make_run()
    api = api_client(owner)
    assert api.post(f"/api/runs/{run.pk}/cancel/").json()["status"] == "cancelled"
    assert api.post(f"/api/runs/{run.pk}/cancel/").status_code == 400  # already ended: said so
    response = api.patch(f"/api/runs/{run.pk}/", {"tags": ["a"], "notes": "why", "visibility": "team"}, format="json")
    assert response.status_code == 400 and "project" in str(response.json()["visibility"])
    assert api.patch(f"/api/runs/{run.pk}/", {"tags": ["a"], "notes": "why"}, format="json").json()["notes"] == "why"
    assert api.put(f"/api/runs/{run.pk}/", {}, format="json").status_code == 405
    assert api.delete(f"/api/runs/{run.pk}/").status_code == 204
    running = make_run(status="running")
    assert api.delete(f"/api/runs/{running.pk}/").status_code == 400


def test_external_run_reports_metrics_and_logs(owner, api_client, published):
    api = api_client(owner)
    run_id = api.post("/api/runs/", {"kind": "external", "name": "notebook", "overrides": {"a": {"b": 1}}}, format="json").json()["id"]
    run = Run.objects.get(pk=run_id)
    assert run.status == "running" and run.kind == "external" and run.config_overrides == {"a.b": 1} and run.agent is None
    steps = [{"step": s, "metrics": {"reward": s / 10, "loss": None}} for s in range(1, 6)]
    assert api.post(f"/api/runs/{run_id}/metrics/", {"steps": steps}, format="json").json() == {"points": 10}
    assert api.post(f"/api/runs/{run_id}/logs/", {"lines": [{"message": "hello"}, {"level": "WARNING", "message": "hm"}]}, format="json").status_code == 200
    assert sum(len(p) for p in points_after(run_id, -1).values()) == 10 and Run.objects.get(pk=run_id).steps == 5
    assert [line.message for line in RunLog.objects.filter(run_id=run_id)] == ["hello", "hm"]
    kinds = [event["type"] for _, event in published]
    assert kinds.count("run.metrics") == 5 and "run.logs" in kinds
    series = api.get(f"/api/runs/{run_id}/series/", {"keys": "reward", "points": 8}).json()
    assert series["keys"] == ["loss", "reward"] and series["series"]["reward"]["x"][-1] == 5
    assert api.get(f"/api/runs/{run_id}/metrics/", {"after": 3}).json()["points"]["reward"] == [[4, 0.4], [5, 0.5]]
    assert [line["message"] for line in api.get(f"/api/runs/{run_id}/logs/").json()] == ["hello", "hm"]
    api.post(f"/api/runs/{run_id}/cancel/")
    assert api.post(f"/api/runs/{run_id}/heartbeat/").json() == {"status": "running", "cancel_requested": True}
    assert api.post(f"/api/runs/{run_id}/finish/", {"status": "cancelled"}, format="json").json()["status"] == "cancelled"
    assert api.post(f"/api/runs/{run_id}/metrics/", {"steps": steps}, format="json").status_code == 400  # ended


def test_platform_runs_are_not_reported_over_the_api(owner, api_client, make_run):
    run = make_run(status="running")
    response = api_client(owner).post(f"/api/runs/{run.pk}/metrics/", {"steps": [{"step": 1, "metrics": {"x": 1}}]}, format="json")
    assert response.status_code == 403


def test_bad_reports_are_400s(owner, api_client):
    api = api_client(owner)
    run_id = api.post("/api/runs/", {"kind": "external"}, format="json").json()["id"]
    for body in ({"steps": [{"step": -1, "metrics": {"x": 1}}]}, {"steps": [{"step": 2**40, "metrics": {"x": 1}}]},
                 {"steps": [{"step": 1, "metrics": {"x\x00": 1}}]}, {"steps": []}, {"steps": [{"step": 1, "metrics": {"x": "high"}}]}):
        assert api.post(f"/api/runs/{run_id}/metrics/", body, format="json").status_code == 400, body
    assert api.post("/api/runs/", {"kind": "external", "overrides": {"k": "a\x00"}}, format="json").status_code == 400


def test_registry_endpoints_hide_other_teams_entries(owner, stranger, api_client, registry, project):
    from webapp.registry.models import Agent

    Agent.objects.create(name="team-agent", project=project)
    assert "team-agent" in [a["name"] for a in api_client(owner).get("/api/agents/", {"limit": 500}).json()["results"]]
    names = [a["name"] for a in api_client(stranger).get("/api/agents/", {"limit": 500}).json()["results"]]
    assert "team-agent" not in names and "copy-task" in names
    assert api_client(stranger).get("/api/backends/").status_code == 200


def test_schema_is_served(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/runs/" in paths and "/api/runs/{id}/metrics/" in paths and "post" in paths["/api/runs/{id}/metrics/"]


def test_runs_are_ordered_as_the_runs_table_orders_them(api_client, owner, make_run, stranger):
    from webapp.dashboard.series import SeriesWriter

    runs = {}
    for name, rewards in (("peaked", [0.1, 0.9, 0.2]), ("steady", [0.3, 0.5]), ("none", [])):
        runs[name] = make_run(name=name)
        SeriesWriter(runs[name].pk).write(("reward", step, value) for step, value in enumerate(rewards, start=1))
    theirs = make_run(name="theirs", owner=stranger)
    SeriesWriter(theirs.pk).write([("reward", 1, 5.0)])
    client = api_client(owner)
    best = client.get("/api/runs/?ordering=-metric:reward:max").json()["results"]
    assert [r["name"] for r in best] == ["peaked", "steady", "none"]  # a run without the metric last; never a stranger's
    assert best[0]["value_ranges"] == {"reward": {"min": 0.1, "max": 0.9}}
    latest = client.get("/api/runs/?ordering=-metric:reward:latest").json()["results"]
    assert [r["name"] for r in latest] == ["steady", "peaked", "none"]
    refused = client.get("/api/runs/?ordering=colour")
    assert refused.status_code == 400 and "Cannot sort by 'colour'" in refused.json()["ordering"][0]
