"""Runs belong to their owner: strangers get 404, admins see everything."""

import pytest

from webapp.runs.access import can
from webapp.runs.models import Run


@pytest.fixture
def run(make_run):
    return make_run(name="mine")


@pytest.mark.parametrize("path", ["/runs/{pk}/", "/runs/{pk}/updates.json"])
def test_owner_sees_the_run(owner_client, run, path):
    assert owner_client.get(path.format(pk=run.pk)).status_code == 200


@pytest.mark.parametrize("path", ["/runs/{pk}/", "/runs/{pk}/updates.json"])
def test_stranger_gets_404(stranger_client, run, path):
    assert stranger_client.get(path.format(pk=run.pk)).status_code == 404


def test_stranger_cannot_cancel(stranger_client, run):
    assert stranger_client.post(f"/runs/{run.pk}/cancel/").status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_admin_sees_the_run(admin_client_, run):
    assert admin_client_.get(f"/runs/{run.pk}/").status_code == 200


def test_list_shows_only_own_runs(stranger_client, owner_client, run):
    assert "mine" in owner_client.get("/").content.decode()


def test_list_hides_other_peoples_runs(stranger_client, run):
    assert "mine" not in stranger_client.get("/").content.decode()


def test_anonymous_is_sent_to_login(client, run):
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_unknown_action_is_a_programming_error(owner, run):
    with pytest.raises(ValueError, match="launch"):
        can(owner, run, "launch")


def test_login_and_logout(client, owner):
    response = client.post("/login/", {"username": "owner", "password": "owner-password"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200
    client.post("/logout/")
    assert client.get("/").status_code == 302
