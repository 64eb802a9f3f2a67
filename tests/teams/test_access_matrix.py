"""The authorization matrix: personas x objects x actions, over pages, the API and the websocket.

Each cell asserts both the answer (allowed: the page/endpoint works; refused: 404 for a logged-in
user, who cannot tell the run exists, a login redirect or 401 for an anonymous one) and the
effect (a refused edit, cancel or delete changes nothing).
"""

from __future__ import annotations

import pytest
from django.test import Client

from webapp.runs.access import can
from webapp.runs.models import Run

PERSONAS = ("owner", "teammate", "viewer", "stranger", "anonymous", "admin")
ALL_ACTIONS = frozenset({"view", "edit", "run", "cancel", "delete"})
# The objects of the matrix: how a run of ``owner`` is shared.
OBJECTS = ("personal", "team", "project_private")
# Who may do what with each object; every other (persona, action) pair is refused.
ALLOWED = {
    "personal": {"owner": ALL_ACTIONS, "admin": ALL_ACTIONS},
    "team": {"owner": ALL_ACTIONS, "admin": ALL_ACTIONS, "teammate": frozenset({"view", "run"}), "viewer": frozenset({"view"})},
    "project_private": {"owner": ALL_ACTIONS, "admin": ALL_ACTIONS},
}


def allowed(obj: str, persona: str, action: str) -> bool:
    return action in ALLOWED[obj].get(persona, frozenset())


ACTIONS = sorted(ALL_ACTIONS)


def _refused_page(response, persona: str) -> bool:
    if persona == "anonymous":
        return response.status_code == 302 and "/login/" in response["Location"]
    return response.status_code == 404


def _page_cell(client: Client, run: Run, action: str):
    """Do ``action`` through the pages; return (response, whether it took effect)."""
    if action == "view":
        responses = [client.get(f"/runs/{run.pk}/"), client.get(f"/runs/{run.pk}/updates.json"),
                     client.get(f"/dashboard/runs/{run.pk}/series.json")]
        codes = {r.status_code for r in responses}
        assert len(codes) == 1, f"pages of one run disagree: {codes}"
        return responses[0], responses[0].status_code == 200
    if action == "run":
        response = client.get(f"/runs/new/?clone={run.pk}")
        return response, response.status_code == 200 and "(copy)" in response.content.decode()
    if action == "edit":
        response = client.post(f"/runs/{run.pk}/edit/", {"visibility": run.visibility, "tags": "checked", "notes": "edited"})
        run.refresh_from_db()
        return response, run.notes == "edited" and run.tags == ["checked"]
    if action == "cancel":
        response = client.post(f"/runs/{run.pk}/cancel/")
        run.refresh_from_db()
        return response, run.status == Run.Status.CANCELLED
    if action == "delete":
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
        response = client.post(f"/runs/{run.pk}/delete/")
        return response, not Run.objects.filter(pk=run.pk).exists()
    raise AssertionError(action)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("obj", OBJECTS)
def test_pages(obj, persona, action, people, shared_run, page_client):
    run = shared_run(obj)
    response, took_effect = _page_cell(page_client(people[persona]), run, action)
    if allowed(obj, persona, action):
        assert response.status_code in (200, 302) and took_effect, (response.status_code, took_effect)
        if response.status_code == 302:
            assert "/login/" not in response["Location"]
    else:
        assert _refused_page(response, persona), response.status_code
        assert not took_effect


def _api_cell(client, run: Run, action: str):
    if action == "view":
        responses = [client.get(f"/api/runs/{run.pk}/"), client.get(f"/api/runs/{run.pk}/series/"),
                     client.get(f"/api/runs/{run.pk}/metrics/"), client.get(f"/api/runs/{run.pk}/logs/")]
        codes = {r.status_code for r in responses}
        assert len(codes) == 1, f"endpoints of one run disagree: {codes}"
        listed = client.get("/api/runs/")
        in_list = listed.status_code == 200 and run.pk in [r["id"] for r in listed.json()["results"]]
        assert in_list == (responses[0].status_code == 200)
        return responses[0], responses[0].status_code == 200
    if action == "run":
        # Starting a run from this one's config is the create endpoint in its project (see test_projects).
        response = client.get(f"/api/runs/{run.pk}/")
        return response, response.status_code == 200 and can(response.wsgi_request.user, run, "run")
    if action == "edit":
        response = client.patch(f"/api/runs/{run.pk}/", {"notes": "edited", "tags": ["checked"]}, format="json")
        run.refresh_from_db()
        return response, run.notes == "edited" and run.tags == ["checked"]
    if action == "cancel":
        response = client.post(f"/api/runs/{run.pk}/cancel/")
        run.refresh_from_db()
        return response, run.status == Run.Status.CANCELLED
    if action == "delete":
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
        response = client.delete(f"/api/runs/{run.pk}/")
        return response, not Run.objects.filter(pk=run.pk).exists()
    raise AssertionError(action)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("obj", OBJECTS)
def test_api(obj, persona, action, people, shared_run, api_client):
    run = shared_run(obj)
    response, took_effect = _api_cell(api_client(people[persona]), run, action)
    if persona == "anonymous":
        assert response.status_code == 401 and not took_effect
    elif allowed(obj, persona, action):
        assert response.status_code in (200, 204) and took_effect, (response.status_code, response.content[:300])
    else:
        if action == "run":  # the run is visible to this persona but not runnable: a 200 that took no effect
            assert response.status_code in (200, 404)
        else:
            assert response.status_code == 404, response.status_code
        assert not took_effect


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("obj", OBJECTS)
async def test_websocket(obj, persona, people, shared_run, ws_connect):
    from channels.db import database_sync_to_async

    run = await database_sync_to_async(shared_run)(obj)
    communicator, connected = await ws_connect(people[persona], run.pk)
    assert connected == allowed(obj, persona, "view")
    if connected:
        status = await communicator.receive_json_from(timeout=3)
        assert status["type"] == "status" and status["status"] == "queued"
    await communicator.disconnect()


@pytest.mark.parametrize("persona", PERSONAS)
def test_run_lists_show_exactly_the_visible_runs(persona, people, shared_run, page_client, api_client):
    runs = {obj: shared_run(obj) for obj in OBJECTS}
    expected = {runs[obj].pk for obj in OBJECTS if allowed(obj, persona, "view")}
    assert set(Run.objects.visible_to(people[persona] or _anonymous()).values_list("pk", flat=True)) == expected
    response = page_client(people[persona]).get("/")
    if persona == "anonymous":
        assert response.status_code == 302
        assert api_client(None).get("/api/runs/").status_code == 401
        return
    shown = {run.pk for run in response.context["runs"]}
    assert shown == expected
    assert {r["id"] for r in api_client(people[persona]).get("/api/runs/").json()["results"]} == expected


# Who may start runs in the project (form and API) and see it.
PROJECT_RUNNERS = {"owner", "teammate", "admin"}
PROJECT_VIEWERS = {"owner", "teammate", "viewer", "admin"}


@pytest.mark.parametrize("persona", PERSONAS)
def test_projects(persona, people, project, registry, api_client, page_client):
    client = api_client(people[persona])
    response = client.post("/api/runs/", {"kind": "external", "name": "x", "project": project.pk}, format="json")
    listed = client.get("/api/projects/")
    if persona == "anonymous":
        assert response.status_code == 401 and listed.status_code == 401
        return
    assert (response.status_code == 201) == (persona in PROJECT_RUNNERS), response.content
    if persona not in PROJECT_RUNNERS:
        assert response.status_code == 400 and "project" in response.json()
    assert (project.pk in [p["id"] for p in listed.json()["results"]]) == (persona in PROJECT_VIEWERS)
    form = page_client(people[persona]).get("/runs/new/").context["form"]
    assert (project in form.fields["project"].queryset) == (persona in PROJECT_RUNNERS)


def _anonymous():
    from django.contrib.auth.models import AnonymousUser

    return AnonymousUser()
