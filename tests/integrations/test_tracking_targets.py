"""A project's tracking targets: set by its owners and admins, secrets never shown back or put in
a run's config, applied to its runs, and the run page links to the external run."""

from __future__ import annotations

import json

from webapp.integrations.models import TrackingTarget
from webapp.integrations.tracking import prepare_run, tracking_config, tracking_environment

KEY = "wandb-key-0123456789abcdef0123456789abcdef"


def save_target(client, project, **fields):
    data = {"wandb_project": "lake-rl", "wandb_entity": "lake-team", "wandb_base_url": "", "mlflow_tracking_uri": "",
            "mlflow_username": "", "wandb_api_key": "", "mlflow_password": "", **fields}
    return client.post(f"/projects/{project.pk}/integrations/tracking/", data)


def test_owner_sets_targets_members_see_them_without_the_key_strangers_see_nothing(
        client, owner, teammate, stranger, project):
    client.force_login(owner)
    assert save_target(client, project, wandb_api_key=KEY, mlflow_tracking_uri="https://mlflow.example.org").status_code == 302
    target = TrackingTarget.objects.get(project=project)
    assert target.wandb_api_key == KEY and KEY not in target.wandb_api_key_sealed  # sealed at rest
    page = client.get(f"/projects/{project.pk}/integrations/").content.decode()
    assert "lake-team/lake-rl" in page and "API key set" in page and KEY not in page

    client.force_login(teammate)
    page = client.get(f"/projects/{project.pk}/integrations/")
    assert page.status_code == 200 and KEY not in page.content.decode() and 'id="tracking-form"' not in page.content.decode()
    assert save_target(client, project, wandb_project="hijacked").status_code == 403
    assert TrackingTarget.objects.get(project=project).wandb_project == "lake-rl"

    client.force_login(stranger)
    assert client.get(f"/projects/{project.pk}/integrations/").status_code == 404

    client.force_login(owner)  # saving again without a key keeps the stored one
    save_target(client, project, wandb_project="lake-rl-2")
    assert TrackingTarget.objects.get(project=project).wandb_api_key == KEY


def test_a_projects_run_reports_there_with_the_secret_only_in_the_environment(make_run, project, owner):
    target = TrackingTarget(project=project, wandb_project="lake-rl", wandb_entity="lake-team",
                            mlflow_tracking_uri="https://mlflow.example.org", mlflow_username="bot")
    target.wandb_api_key = KEY
    target.mlflow_password = "hunter2"
    target.save()
    run = make_run(project=project, name="tracked")
    config = tracking_config(run, {"trainer.logger": ["console"], "trainer.project_name": "member-choice"})
    assert config["trainer.logger"] == ["console", "wandb", "mlflow"]
    assert config["trainer.project_name"] == "lake-rl" and config["trainer.wandb_entity"] == "lake-team"
    assert config["trainer.mlflow_tracking_uri"] == "https://mlflow.example.org"
    assert KEY not in json.dumps(config) and "hunter2" not in json.dumps(config)
    assert tracking_environment(run) == {"WANDB_API_KEY": KEY, "WANDB_MODE": "online", "MLFLOW_TRACKING_USERNAME": "bot",
                                         "MLFLOW_TRACKING_PASSWORD": "hunter2"}
    personal = make_run(name="personal")  # no project: nothing added
    assert tracking_config(personal, {"a": 1}) == {"a": 1} and tracking_environment(personal) == {}


def test_members_cannot_point_trackers_elsewhere_in_a_runs_overrides(owner_client, copy_form_data):
    for key in ("trainer.tensorboard_dir", "trainer.wandb_dir", "trainer.mlflow_tracking_uri"):  # location keys
        data = {**copy_form_data, "overrides": copy_form_data["overrides"] + f"{key}=/etc\n"}
        response = owner_client.post("/runs/new/", data)
        errors = str(response.context["form"].errors.get("overrides"))
        assert response.status_code == 200 and f"{key} cannot be set per run: it names a location" in errors, (key, errors)


def test_the_run_page_links_to_the_external_runs(owner_client, make_run, tmp_path):
    run = make_run(run_path=str(tmp_path))
    (tmp_path / "trackers.json").write_text(json.dumps({
        "wandb": {"id": "abc123", "project": "lake-rl", "entity": "lake-team", "mode": "online", "url": None},
        "mlflow": {"uri": "https://mlflow.example.org", "run_id": "r1", "url": "https://mlflow.example.org/#/experiments/1/runs/r1"},
    }))
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'href="https://wandb.ai/lake-team/lake-rl/runs/abc123"' in page
    assert 'href="https://mlflow.example.org/#/experiments/1/runs/r1"' in page
