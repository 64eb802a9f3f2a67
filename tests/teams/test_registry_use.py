"""Whose agents and datasets a run may use (``webapp.runs.access.usable_entries`` and ``entry_problem``).

A viewer of the lake team's project reads its datasets and agents; as in W&B, reading an artifact
lets a person use it in their own runs: in a project where they may start runs, or a personal run.
They still start nothing in the lake project, a stranger cannot use its entries by name or by id,
and an agent that takes the lake project's secrets stays in that project."""

from __future__ import annotations

import pytest

from webapp.registry.models import Agent, Dataset
from webapp.runs.access import entry_problem
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, Team

pytestmark = pytest.mark.django_db

TINY = {"trainer.total_training_steps": 1, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
        "data.max_response_length": 4}


@pytest.fixture
def lake_rows(project):
    """A dataset of the lake team's project (``project``), which ``viewer`` may only look at."""
    return Dataset.objects.create(name="lake-rows", source=Dataset.Source.REGISTERED, identifier="copy",
                                  val_split="test", project=project)


@pytest.fixture
def own_project(viewer):
    """A project of another team, where ``viewer`` is a member (may start runs)."""
    team = Team.objects.create(name="Viewer's own team", slug="viewers-own")
    Membership.objects.create(team=team, user=viewer, role=Membership.Role.MEMBER)
    return Project.objects.create(team=team, name="own-work")


def api_run(client, **fields):
    body = {"agent": "copy-task", "dataset": "lake-rows", "reward": "char-accuracy", "backend": "trl",
            "model": "tiny-char", "overrides": TINY, **fields}
    return client.post("/api/runs/", body, format="json")


def test_a_viewer_trains_on_the_teams_dataset_in_their_own_project(
        viewer, own_project, lake_rows, registry, api_client, page_client, no_queue):
    response = api_run(api_client(viewer), project=own_project.pk, visibility="team")
    assert response.status_code == 201, response.content.decode()[-2000:]
    run = Run.objects.get(pk=response.json()["id"])
    assert (run.dataset, run.project, run.owner) == (lake_rows, own_project, viewer)

    # The run form: the team's dataset is offered and accepted for a run in the viewer's own project.
    form = page_client(viewer).get("/runs/new/").context["form"]
    assert lake_rows in form.fields["dataset"].queryset and own_project in form.fields["project"].queryset
    posted = page_client(viewer).post("/runs/new/", {
        "agent": registry["agents"]["copy-task"].pk, "dataset": lake_rows.pk, "reward": registry["rewards"]["char-accuracy"].pk,
        "backend": registry["backends"]["trl"].pk, "model": "tiny-char", "project": own_project.pk, "visibility": "team",
        "overrides": "".join(f"{k}={v}\n" for k, v in TINY.items()),
    })
    assert posted.status_code == 302, posted.context["form"].errors if posted.context else posted
    assert Run.objects.filter(owner=viewer, dataset=lake_rows).count() == 2


def test_the_viewer_still_starts_nothing_in_the_teams_project(viewer, own_project, project, lake_rows, registry, api_client, page_client):
    response = api_run(api_client(viewer), project=project.pk, visibility="team")
    assert response.status_code == 400 and "project" in response.json()
    form = page_client(viewer).get("/runs/new/").context["form"]
    assert project not in form.fields["project"].queryset
    assert not Run.objects.exists()


def test_a_stranger_cannot_use_the_teams_dataset_by_name_or_by_id(stranger, lake_rows, registry, api_client, page_client):
    client = api_client(stranger)
    by_name = api_run(client)
    assert by_name.status_code == 400
    [message] = by_name.json()["dataset"]
    # The shared datasets only: nothing of the lake project (its entries, its name) is said.
    assert message == "No dataset named 'lake-rows' among those you may use; choose one of: arithmetic, copy, countdown, frozenlake."
    by_id = api_run(client, dataset=str(lake_rows.pk))
    assert by_id.status_code == 400 and "dataset" in by_id.json()
    external = client.post("/api/runs/", {"kind": "external", "dataset": str(lake_rows.pk)}, format="json")
    assert external.status_code == 400 and "dataset" in external.json()
    form = page_client(stranger).get("/runs/new/").context["form"]
    assert lake_rows not in form.fields["dataset"].queryset
    assert entry_problem(stranger, lake_rows, None) == "No such dataset."
    assert not Run.objects.exists()


def test_an_agent_that_takes_the_projects_secrets_stays_in_its_project(owner, viewer, own_project, project, registry, api_client):
    keyed = Agent.objects.create(name="lake-searcher", project=project, agent_class="examples.frozenlake.FrozenLakeAgent",
                                 env_class="examples.frozenlake.FrozenLakeEnv",
                                 env_args={"search": {"api_key": {"$secret": "LAKE_SEARCH_KEY"}}})
    plain = Agent.objects.create(name="lake-walker", project=project, agent_class="examples.frozenlake.FrozenLakeAgent",
                                 env_class="examples.frozenlake.FrozenLakeEnv")
    assert keyed.secret_names() == {"LAKE_SEARCH_KEY"} and plain.secret_names() == set()
    refused = entry_problem(viewer, keyed, own_project)
    assert refused == ("Agent 'lake-searcher' uses secrets of project lake/frozenlake (LAKE_SEARCH_KEY): "
                       "only runs in that project may use it.")
    assert entry_problem(viewer, keyed, None) == refused  # a personal run is outside the project too
    assert entry_problem(owner, keyed, project) is None and entry_problem(viewer, plain, own_project) is None

    response = api_run(api_client(viewer), agent="lake-searcher", dataset="frozenlake", reward="", project=own_project.pk)
    assert response.status_code == 400 and response.json()["agent"] == [refused]
    assert not Run.objects.exists()


def test_a_name_that_several_readable_projects_have_is_asked_for_by_id(viewer, own_project, project, registry, api_client, no_queue):
    other = Project.objects.create(team=project.team, name="second-lake")
    Dataset.objects.create(name="lake-rows", source=Dataset.Source.REGISTERED, identifier="copy", val_split="test", project=project)
    second = Dataset.objects.create(name="lake-rows", source=Dataset.Source.REGISTERED, identifier="copy", val_split="test", project=other)
    client = api_client(viewer)
    ambiguous = api_run(client, project=own_project.pk)
    assert ambiguous.status_code == 400
    [message] = ambiguous.json()["dataset"]
    assert "Several datasets named 'lake-rows'" in message and f"{second.pk} (project lake/second-lake)" in message
    chosen = api_run(client, dataset=str(second.pk), project=own_project.pk)
    assert chosen.status_code == 201, chosen.content.decode()[-2000:]
    assert Run.objects.get().dataset == second
