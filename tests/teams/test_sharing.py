"""Share links (read-only, revocable), CSRF on the forms, clone, tags and notes, existing runs."""

from __future__ import annotations

import pytest

from webapp.runs.models import Run
from webapp.teams.models import ShareLink


def test_share_link_shows_the_run_read_only_until_revoked(make_run, owner, page_client):
    run = make_run(name="shared by link", notes="look at step 3")
    owner_client = page_client(owner)
    assert owner_client.post(f"/runs/{run.pk}/share/").status_code == 302
    link = ShareLink.objects.get(run=run)
    anonymous = page_client(None)
    page = anonymous.get(f"/share/{link.token}/")
    assert page.status_code == 200 and "shared by link" in page.content.decode() and "look at step 3" in page.content.decode()
    assert "run-cancel" not in page.content.decode() and "run-edit" not in page.content.decode()
    # The token opens this run's page only: the run's own pages still want a login.
    assert anonymous.get(f"/runs/{run.pk}/").status_code == 302
    assert owner_client.post(f"/share-links/{link.pk}/revoke/").status_code == 302
    assert anonymous.get(f"/share/{link.token}/").status_code == 404
    assert anonymous.get("/share/not-a-token/").status_code == 404


def test_a_share_links_page_has_the_live_dashboard_its_token_opens(make_run, owner, page_client):
    """The link's page fetches charts and episodes and opens the websocket with its token; the token
    opens only its own run, and nothing once revoked."""
    from webapp.dashboard.series import SeriesWriter

    run, other = make_run(name="shared"), make_run(name="not shared")
    SeriesWriter(run.pk).write([("reward", 1, 0.5), ("reward", 2, 0.75)])
    link = ShareLink.objects.create(run=run, created_by=owner)
    anonymous = page_client(None)
    page = anonymous.get(f"/share/{link.token}/").content.decode()
    assert f'data-ws-url="/ws/runs/{run.pk}/?share={link.token}"' in page
    assert f'data-series-url="/dashboard/runs/{run.pk}/series.json?share={link.token}"' in page
    series = anonymous.get(f"/dashboard/runs/{run.pk}/series.json", {"share": link.token})
    assert series.status_code == 200 and series.json()["series"]["reward"]["y"] == [0.5, 0.75]
    assert anonymous.get(f"/dashboard/runs/{run.pk}/episodes.json", {"share": link.token}).status_code == 200
    assert anonymous.get(f"/dashboard/runs/{other.pk}/series.json", {"share": link.token}).status_code == 404
    assert anonymous.get(f"/dashboard/runs/{run.pk}/series.json", {"share": "not-a-token"}).status_code == 404
    assert anonymous.get(f"/dashboard/runs/{run.pk}/series.json").status_code == 302  # no token: log in
    link.revoke()
    assert anonymous.get(f"/dashboard/runs/{run.pk}/series.json", {"share": link.token}).status_code == 404
    assert anonymous.get(f"/dashboard/runs/{run.pk}/episodes.json", {"share": link.token}).status_code == 404


def test_only_those_who_may_edit_make_or_revoke_links(make_run, owner, stranger, page_client):
    run = make_run()
    assert page_client(stranger).post(f"/runs/{run.pk}/share/").status_code == 404
    link = ShareLink.objects.create(run=run, created_by=owner)
    assert page_client(stranger).post(f"/share-links/{link.pk}/revoke/").status_code == 404
    link.refresh_from_db()
    assert link.revoked_at is None


@pytest.mark.parametrize("path,data", [
    ("/runs/{pk}/cancel/", {}),
    ("/runs/{pk}/edit/", {"visibility": "private", "notes": "x"}),
    ("/runs/{pk}/share/", {}),
    ("/runs/{pk}/delete/", {}),
    ("/runs/new/", {}),
])
def test_forms_refuse_posts_without_a_csrf_token(path, data, make_run, owner, page_client):
    run = make_run()
    client = page_client(owner, enforce_csrf_checks=True)
    assert client.post(path.format(pk=run.pk), data).status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.notes == "" and not ShareLink.objects.exists()


def test_forms_accept_posts_with_the_csrf_token(make_run, owner, page_client):
    run = make_run()
    client = page_client(owner, enforce_csrf_checks=True)
    page = client.get(f"/runs/{run.pk}/")
    token = page.context["csrf_token"]
    response = client.post(f"/runs/{run.pk}/edit/", {"visibility": "private", "tags": "a, b, a", "notes": "n", "csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.tags == ["a", "b"] and run.notes == "n"


def test_clone_fills_the_form_with_the_runs_config(make_run, project, page_client, owner):
    run = make_run(name="base", project=project, visibility="team", tags=["lake"],
                   config_overrides={"trainer.total_training_steps": 2, "data.train_batch_size": 2})
    form = page_client(owner).get(f"/runs/new/?clone={run.pk}").context["form"]
    assert form.initial["name"] == "base (copy)"
    assert form.initial["agent"] == run.agent_id and form.initial["project"] == project.pk
    assert form.initial["tags"] == "lake" and form.initial["visibility"] == "team"
    from webapp.runs.forms import parse_overrides_text

    assert form.initial["steps"] == 2 and form.initial["batch_size"] == 2  # in their own fields
    assert parse_overrides_text(form.initial["overrides"]) == {}


@pytest.mark.real_check
def test_a_cloned_run_validates_and_queues_like_any_other(copy_form_data, owner, page_client, project, monkeypatch):
    monkeypatch.setattr(Run, "enqueue", lambda self: None)
    client = page_client(owner)
    response = client.post("/runs/new/", {**copy_form_data, "project": project.pk, "visibility": "team", "tags": "x, y"})
    assert response.status_code == 302, response.context["form"].errors if response.context else ""
    first = Run.objects.get()
    clone_form = client.get(f"/runs/new/?clone={first.pk}").context["form"]
    data = {k: v for k, v in clone_form.initial.items() if v is not None}
    assert client.post("/runs/new/", data).status_code == 302
    second = Run.objects.exclude(pk=first.pk).get()
    assert second.config_overrides == first.config_overrides and second.tags == ["x", "y"]
    assert second.project == project and second.visibility == "team"


def test_team_visibility_needs_a_project(copy_form_data, owner, page_client, make_run):
    response = page_client(owner).post("/runs/new/", {**copy_form_data, "visibility": "team"})
    assert "choose a project" in response.context["form"].errors["visibility"][0]
    run = make_run()
    page_client(owner).post(f"/runs/{run.pk}/edit/", {"visibility": "team"})
    run.refresh_from_db()
    assert run.visibility == "private"


def test_tags_filter_the_list(make_run, owner, page_client):
    make_run(name="tagged one", tags=["lake", "sweep"])
    make_run(name="plain one")
    shown = [r.name for r in page_client(owner).get("/?tag=sweep").context["runs"]]
    assert shown == ["tagged one"]


def test_runs_from_before_teams_stay_private_to_their_owner(make_run, owner, teammate, viewer):
    from webapp.runs.access import can

    old = make_run()  # what the migration leaves: no project, private
    assert old.project is None and old.visibility == "private"
    assert can(owner, old, "delete") and not can(teammate, old, "view") and not can(viewer, old, "view")


def test_deleting_needs_an_ended_run(make_run, owner, page_client):
    run = make_run()
    page_client(owner).post(f"/runs/{run.pk}/delete/")
    assert Run.objects.filter(pk=run.pk).exists()
