"""A tracking secret goes only to the destination it was entered for: a team admin who changes the
W&B server or the MLflow server or user, without entering the secret again, removes the stored
one (the form says so), and the training process then carries no key. Credentials never ride in
a tracking URI, where every member would read them."""

from __future__ import annotations

import base64
import os

import pytest
from standins.http import LoopbackServer, Response

from webapp.integrations.models import TrackingTarget
from webapp.integrations.tracking import prepare_run

KEY = "owner-wandb-key-0123456789abcdef0123456789"
PUBLIC = "http://93.184.216.34"


def save(client, project, **fields):
    data = {"wandb_project": "lake-rl", "wandb_entity": "", "wandb_base_url": f"{PUBLIC}:8080", "mlflow_tracking_uri": "",
            "mlflow_username": "", "wandb_api_key": "", "mlflow_password": "", **fields}
    return client.post(f"/projects/{project.pk}/integrations/tracking/", data, follow=True)


@pytest.fixture
def team_admin(team):
    from django.contrib.auth import get_user_model

    from webapp.teams.models import Membership

    user = get_user_model().objects.create_user(username="team-admin", password=None)
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    return user


@pytest.fixture
def keep_environment():
    """prepare_run writes the training process's environment; this test process is that process."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def test_a_team_admin_who_changes_the_wandb_server_removes_the_owners_key(
        client, owner, team_admin, project, make_run, keep_environment):
    client.force_login(owner)
    save(client, project, wandb_api_key=KEY)
    assert TrackingTarget.objects.get().wandb_api_key == KEY

    client.force_login(team_admin)
    page = save(client, project, wandb_base_url=f"{PUBLIC}:9999").content.decode()
    target = TrackingTarget.objects.get()
    assert target.wandb_base_url == f"{PUBLIC}:9999" and target.wandb_api_key_sealed == ""
    assert "The stored W&amp;B API key (the W&amp;B server changed) was removed" in page
    assert "unless the W&B server changes: then the stored key is removed" in page  # the form says so beforehand
    assert "API key not set" in page

    os.environ["WANDB_API_KEY"] = "a key the worker was started with"  # must not follow the new server either
    prepare_run(make_run(project=project), {"config": {}})
    assert "WANDB_API_KEY" not in os.environ and "WANDB_BASE_URL" not in os.environ


def test_the_key_entered_with_the_new_server_goes_there(client, owner, project, make_run, keep_environment):
    client.force_login(owner)
    save(client, project, wandb_api_key=KEY)
    save(client, project, wandb_base_url=f"{PUBLIC}:9999", wandb_api_key="new-key-for-the-new-server-0123456789abc")
    assert TrackingTarget.objects.get().wandb_api_key == "new-key-for-the-new-server-0123456789abc"
    save(client, project, wandb_base_url=f"{PUBLIC}:9999", wandb_project="renamed")  # same server: the key stays
    assert TrackingTarget.objects.get().wandb_api_key == "new-key-for-the-new-server-0123456789abc"
    prepare_run(make_run(project=project), {"config": {}})
    assert os.environ["WANDB_API_KEY"] == "new-key-for-the-new-server-0123456789abc"
    assert os.environ["WANDB_BASE_URL"] == f"{PUBLIC}:9999"


def test_changing_the_mlflow_server_or_user_removes_the_password(client, owner, team_admin, project):
    client.force_login(owner)
    save(client, project, mlflow_tracking_uri=f"{PUBLIC}:5000", mlflow_username="bot", mlflow_password="hunter2")
    assert TrackingTarget.objects.get().mlflow_password == "hunter2"
    client.force_login(team_admin)
    page = save(client, project, mlflow_tracking_uri=f"{PUBLIC}:5001", mlflow_username="bot").content.decode()
    assert TrackingTarget.objects.get().mlflow_password_sealed == ""
    assert "The stored MLflow password (the MLflow server or user changed) was removed" in page

    client.force_login(owner)
    save(client, project, mlflow_tracking_uri=f"{PUBLIC}:5001", mlflow_username="bot", mlflow_password="hunter3")
    client.force_login(team_admin)
    save(client, project, mlflow_tracking_uri=f"{PUBLIC}:5001", mlflow_username="someone-else")
    assert TrackingTarget.objects.get().mlflow_password_sealed == ""


def test_credentials_in_a_tracking_uri_are_refused_and_never_shown(client, owner, teammate, project, make_run):
    client.force_login(owner)
    response = save(client, project, mlflow_tracking_uri="https://bot:hunter2@mlflow.example.org")
    errors = " ".join(response.context["tracking_form"].errors["mlflow_tracking_uri"])
    assert "Remove the user name and password from the URL" in errors and not TrackingTarget.objects.exists()
    response = save(client, project, wandb_base_url="https://key@wandb.example.org")
    assert "Remove the user name and password from the URL" in " ".join(response.context["tracking_form"].errors["wandb_base_url"])

    # A URI stored with credentials before they were refused: no page, form or run config shows them.
    TrackingTarget.objects.create(project=project, mlflow_tracking_uri="https://bot:hunter2@mlflow.example.org")
    for user in (owner, teammate):
        client.force_login(user)
        page = client.get(f"/projects/{project.pk}/integrations/").content.decode()
        assert "https://mlflow.example.org" in page and "hunter2" not in page, user
    from webapp.integrations.tracking import tracking_config

    assert tracking_config(make_run(project=project), {})["trainer.mlflow_tracking_uri"] == "https://mlflow.example.org"


def test_each_wandb_run_in_a_process_sends_its_own_key_to_its_own_server(tmp_path, monkeypatch):
    """wandb keeps the first run's server and key for a process; ours are passed per run, so a key
    reaches only the server it came with (two allowed stand-ins on loopback, answering 401)."""
    from training.config import Config
    from training.tracking.trackers import WandbSink
    from training.errors import TrackerError

    received: list[list[str]] = [[], []]

    def stand_in(index: int) -> LoopbackServer:
        def handle(request):
            received[index].append(request.headers.get("Authorization") or "")
            return Response(401, {})
        return LoopbackServer(handle)

    servers = [stand_in(0), stand_in(1)]
    try:
        monkeypatch.setenv("EGRESS_ALLOWED_HOSTS", ",".join(f"127.0.0.1:{s.httpd.server_address[1]}" for s in servers))
        monkeypatch.setenv("WANDB_INIT_TIMEOUT", "30")
        config = Config.build({"trainer.project_name": "lake", "trainer.logger": ["wandb"]})
        for index, server in enumerate(servers):
            monkeypatch.setenv("WANDB_API_KEY", "ab"[index] * 40)
            monkeypatch.setenv("WANDB_BASE_URL", server.url)
            with pytest.raises(TrackerError):
                WandbSink(config, tmp_path / str(index))
    finally:
        for server in servers:
            server.close()
    keys = [{base64.b64decode(value.split()[1]).decode().split(":", 1)[1] for value in headers if value} for headers in received]
    assert keys == [{"a" * 40}, {"b" * 40}]
