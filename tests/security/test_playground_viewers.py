"""A playground question takes a worker slot of the run's queue: only people who may run the run
(``can(user, run, "run")``) ask; a viewer, a share-link holder, or an owner who left the team looks
at the run and asks nothing."""

from __future__ import annotations

import json

import pytest

from webapp.playground.models import PlaygroundRequest
from webapp.runs.models import Run
from webapp.teams.models import Membership, ShareLink


@pytest.fixture
def team_run(make_run, project, owner):
    return make_run(owner=owner, project=project, visibility=Run.Visibility.TEAM, status=Run.Status.SUCCEEDED, steps=2)


def ask(client, run):
    body = {"kind": "chat", "model": "final_model", "messages": [{"role": "user", "content": "abc"}], "max_new_tokens": 8}
    return client.post(f"/runs/{run.pk}/playground/ask", json.dumps(body), content_type="application/json")


def test_a_viewer_sees_the_run_but_cannot_ask(page_client, viewer, team_run):
    client = page_client(viewer)
    response = ask(client, team_run)
    assert response.status_code == 403 and "Only people who may start runs" in response.json()["error"]
    page = client.get(f"/runs/{team_run.pk}/playground/").content.decode()
    assert 'id="playground-refused"' in page and 'id="playground-form"' not in page
    assert 'id="run-playground"' not in client.get(f"/runs/{team_run.pk}/").content.decode()
    assert not PlaygroundRequest.objects.exists()


def test_a_share_link_holder_cannot_ask(page_client, stranger, team_run, owner):
    link = ShareLink.objects.create(run=team_run, created_by=owner)
    client = page_client(stranger)
    assert client.get(link.get_absolute_url()).status_code == 200  # the link shows the run
    assert ask(client, team_run).status_code == 404
    assert ask(page_client(None), team_run).status_code == 302  # to the login page
    assert not PlaygroundRequest.objects.exists()


def test_an_owner_who_left_the_team_cannot_ask(page_client, teammate, make_run, project):
    mine = make_run(owner=teammate, project=project, visibility=Run.Visibility.TEAM, status=Run.Status.SUCCEEDED)
    Membership.objects.filter(user=teammate).delete()
    assert ask(page_client(teammate), mine).status_code == 403
    assert not PlaygroundRequest.objects.exists()


def test_a_member_still_asks(page_client, teammate, team_run, monkeypatch):
    from webapp.playground import forms

    monkeypatch.setattr(forms, "model_choices", lambda run: [("final_model", "final model")])
    response = ask(page_client(teammate), team_run)
    assert response.status_code == 201, response.content
    assert PlaygroundRequest.objects.get().user == teammate
