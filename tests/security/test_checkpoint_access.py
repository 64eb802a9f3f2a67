"""Checkpoints, aliases and evaluations are the project's: replayed attempts from outside it (a
stranger of another team, a share-link holder, an anonymous caller), from a viewer inside it, and
across projects (an alias or evaluation in one's own project naming another project's run or
dataset) change nothing and learn nothing; every input is bounded. The Celery send is kept from the
broker (``apply_async``): what is counted is what was recorded and sent."""

from __future__ import annotations

import shutil

import pytest

from standins.checkpoints import with_checkpoints
from webapp.checkpoints import logic
from webapp.checkpoints.models import CheckpointAlias, Evaluation
from webapp.registry.models import Dataset
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, ShareLink, Team

pytestmark = pytest.mark.django_db


@pytest.fixture
def team_run(make_run, project):
    run = with_checkpoints(make_run(project=project, visibility=Run.Visibility.TEAM, status="succeeded", steps=2), [2])
    yield run
    shutil.rmtree(run.folder(), ignore_errors=True)


@pytest.fixture
def elsewhere(stranger, make_run):
    """The stranger's own team and project, with a run of theirs and a dataset of that project."""
    team = Team.objects.create(name="Other team", slug="other")
    Membership.objects.create(team=team, user=stranger, role=Membership.Role.OWNER)
    project = Project.objects.create(team=team, name="other")
    run = with_checkpoints(make_run(owner=stranger, project=project, visibility=Run.Visibility.TEAM, status="succeeded"), [1])
    dataset = Dataset.objects.create(name="their-rows", project=project, identifier="copy", val_split="test")
    yield {"project": project, "run": run, "dataset": dataset}
    shutil.rmtree(run.folder(), ignore_errors=True)


def alias_body(run, step, name="best"):
    return {"name": name, "run": run.pk, "step": step}


def eval_body(run, step, dataset, **extra):
    return {"run": run.pk, "step": step, "dataset": dataset.pk, **extra}


def test_a_stranger_reaches_nothing_of_another_project(api_client, page_client, stranger, owner, team_run, project, registry,
                                                       elsewhere, apply_async):
    CheckpointAlias.objects.create(project=project, name="best", run=team_run, step=2, set_by=owner)
    api, pages = api_client(stranger), page_client(stranger)
    copy = registry["datasets"]["copy"]
    assert api.get(f"/api/runs/{team_run.pk}/checkpoints/").status_code == 404
    assert api.get(f"/api/projects/{project.pk}/aliases/").status_code == 404
    assert api.get(f"/api/projects/{project.pk}/evaluations/").status_code == 404
    assert api.post(f"/api/projects/{project.pk}/aliases/", alias_body(team_run, 2, "mine"), format="json").status_code == 404
    assert api.delete(f"/api/projects/{project.pk}/aliases/best/").status_code == 404
    assert api.post(f"/api/projects/{project.pk}/evaluations/", eval_body(team_run, 2, copy), format="json").status_code == 404
    assert pages.get(f"/projects/{project.pk}/evaluations/").status_code == 404
    assert pages.get(f"/projects/{project.pk}/aliases/best/download").status_code == 404
    assert pages.get(f"/projects/{project.pk}/aliases/best/playground").status_code == 404

    # From their own project, naming the other project's run: refused, the run not even confirmed to exist.
    theirs = elsewhere["project"]
    moved = api.post(f"/api/projects/{theirs.pk}/aliases/", alias_body(team_run, 2), format="json")
    assert moved.status_code == 400 and "no run" in moved.json()["detail"] and "step" not in moved.json()["detail"]
    evaluated = api.post(f"/api/projects/{theirs.pk}/evaluations/", eval_body(team_run, 2, copy), format="json")
    assert evaluated.status_code == 400 and "no run" in evaluated.json()["detail"]
    by_alias = api.post(f"/api/projects/{theirs.pk}/evaluations/", {"alias": "best", "dataset": copy.pk}, format="json")
    assert by_alias.status_code == 400  # the other project's alias is not theirs to name

    assert list(CheckpointAlias.objects.values_list("project_id", "name", "run_id", "step")) == [(project.pk, "best", team_run.pk, 2)]
    assert not Evaluation.objects.exists() and not apply_async.called


def test_another_projects_dataset_is_refused(api_client, owner, team_run, project, elsewhere, apply_async):
    response = api_client(owner).post(f"/api/projects/{project.pk}/evaluations/",
                                      eval_body(team_run, 2, elsewhere["dataset"]), format="json")
    assert response.status_code == 400 and f"has no dataset {elsewhere['dataset'].pk}" in response.json()["detail"]
    assert not Evaluation.objects.exists() and not apply_async.called


def test_share_links_and_anonymous_callers_get_nothing(api_client, page_client, stranger, owner, team_run, project):
    link = ShareLink.objects.create(run=team_run, created_by=owner)
    client = page_client(stranger)
    assert client.get(link.get_absolute_url()).status_code == 200  # the link shows the run, read-only
    assert client.get(f"/api/runs/{team_run.pk}/checkpoints/?share={link.token}").status_code == 404
    anonymous = api_client(None)
    assert anonymous.get(f"/api/runs/{team_run.pk}/checkpoints/?share={link.token}").status_code in (401, 403)
    assert anonymous.post(f"/api/projects/{project.pk}/aliases/", alias_body(team_run, 2), format="json").status_code in (401, 403)
    assert page_client(None).get(f"/projects/{project.pk}/evaluations/").status_code == 302  # to the login page
    assert not CheckpointAlias.objects.exists()


def test_a_viewer_looks_but_labels_and_evaluates_nothing(api_client, page_client, viewer, team_run, project, registry, apply_async):
    api = api_client(viewer)
    assert api.get(f"/api/runs/{team_run.pk}/checkpoints/").status_code == 200
    assert api.get(f"/api/projects/{project.pk}/evaluations/").status_code == 200
    assert page_client(viewer).get(f"/projects/{project.pk}/evaluations/").status_code == 200
    assert api.post(f"/api/projects/{project.pk}/aliases/", alias_body(team_run, 2), format="json").status_code == 403
    refused = api.post(f"/api/projects/{project.pk}/evaluations/", eval_body(team_run, 2, registry["datasets"]["copy"]), format="json")
    assert refused.status_code == 403
    assert not CheckpointAlias.objects.exists() and not Evaluation.objects.exists() and not apply_async.called


def test_a_private_run_stays_its_owners_behind_an_alias(api_client, page_client, owner, teammate, make_run, project):
    private = with_checkpoints(make_run(project=project, visibility=Run.Visibility.PRIVATE, status="succeeded"), [3])
    try:
        assert api_client(owner).post(f"/api/projects/{project.pk}/aliases/", alias_body(private, 3, "mine"),
                                      format="json").status_code == 200
        member = api_client(teammate)
        assert member.get(f"/api/projects/{project.pk}/aliases/").json() == []
        assert page_client(teammate).get(f"/projects/{project.pk}/aliases/mine/download").status_code == 404
        taken = member.post(f"/api/projects/{project.pk}/aliases/", alias_body(private, 3, "theirs"), format="json")
        assert taken.status_code == 400
    finally:
        shutil.rmtree(private.folder(), ignore_errors=True)


def test_every_input_is_bounded(api_client, owner, team_run, project, registry, apply_async, settings, monkeypatch):
    api = api_client(owner)
    url = f"/api/projects/{project.pk}/evaluations/"
    copy = registry["datasets"]["copy"]
    assert api.post(url, eval_body(team_run, 2, copy, episodes_per_task=logic.MAX_EPISODES_PER_TASK + 1), format="json").status_code == 400
    settings.EVALUATION_MAX_TASKS = 10
    too_many = api.post(url, eval_body(team_run, 2, copy, max_tasks=11), format="json")
    assert too_many.status_code == 400 and "max_tasks is 1 to 10" in too_many.json()["detail"]
    assert api.post(url, {**eval_body(team_run, 2, copy), "alias": "best"}, format="json").status_code == 400  # both ways
    assert api.get(url, {"sort": "password"}).status_code == 400
    assert api.post(f"/api/projects/{project.pk}/aliases/", alias_body(team_run, 2, "x" * 65), format="json").status_code == 400
    assert api.post(f"/api/projects/{project.pk}/aliases/", {**alias_body(team_run, 2), "step": -1}, format="json").status_code == 400
    assert not Evaluation.objects.exists()

    monkeypatch.setattr(logic, "MAX_PENDING_EVALUATIONS", 1)
    assert api.post(url, eval_body(team_run, 2, copy), format="json").status_code == 201
    full = api.post(url, eval_body(team_run, 2, copy), format="json")
    assert full.status_code == 400 and "waiting or running" in full.json()["detail"]
    assert Evaluation.objects.count() == 1 and apply_async.call_count == 1

    monkeypatch.setattr(logic, "MAX_ALIASES_PER_PROJECT", 1)
    assert api.post(f"/api/projects/{project.pk}/aliases/", alias_body(team_run, 2, "one"), format="json").status_code == 200
    assert api.post(f"/api/projects/{project.pk}/aliases/", alias_body(team_run, 2, "one"), format="json").status_code == 200  # a move
    assert api.post(f"/api/projects/{project.pk}/aliases/", alias_body(team_run, 2, "two"), format="json").status_code == 400
