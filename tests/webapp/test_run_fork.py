"""Forking a run from one of its stored checkpoints: through the API, the run pages and the command
line; the lineage on both runs' pages; the compare view drawing a fork from its parent's step; who
may fork what (the attacks replayed); and bad input refused before anything is queued."""

from __future__ import annotations

import io
import os

import pytest

from training.rollouts.tiny import save_tiny_model
from webapp.api.ingest import record_metrics
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, ShareLink, Team

MODEL_KEY = "actor_rollout_ref.model.path"
LR = "actor_rollout_ref.actor.optim.lr"


@pytest.fixture
def runs_dir(settings, tmp_path):
    settings.RUNS_DIR = tmp_path / "runs"
    return settings.RUNS_DIR


@pytest.fixture
def parent(make_run, runs_dir):
    """A run that ended at step 4 with its checkpoints of steps 2 and 4 published in its folder."""
    run = make_run(name="parent", status=Run.Status.SUCCEEDED, steps=4)
    Run.objects.filter(pk=run.pk).update(run_path=str(run.folder()))
    run.refresh_from_db()
    for step in (2, 4):
        save_tiny_model(run.folder() / "checkpoints" / f"checkpoint-{step}", layers=1, hidden_size=16, seed=step)
    return run


def fork(client, run, **body):
    return client.post(f"/api/runs/{run.pk}/fork/", body, format="json")


def test_a_fork_records_its_parent_and_step_and_starts_from_that_checkpoint(api_client, owner, parent, no_queue):
    client = api_client(owner)
    answer = fork(client, parent, step=2, overrides={LR: 1e-4})
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["parent"], body["parent_step"], body["model"]) == (parent.pk, 2, f"run:{parent.pk}@2")
    assert body["name"] == "parent fork @2" and body["status"] == "queued"
    assert f"run {parent.pk}'s checkpoint at step 2" in body["fork_note"]
    assert "Optimizer state: carried from the checkpoint when training begins" in body["fork_note"]  # a trl fork, queued

    shown = client.get(f"/api/runs/{body['id']}/").json()
    assert (shown["parent"], shown["parent_step"]) == (parent.pk, 2)
    assert client.get(f"/api/runs/{parent.pk}/").json()["parent"] is None

    child = Run.objects.get(pk=body["id"])
    # The weights it loads: the parent's published checkpoint, found by the platform.
    assert child.spec["trainer"]["config"][MODEL_KEY] == str(parent.folder() / "checkpoints" / "checkpoint-2")
    assert child.config_overrides[LR] == 1e-4
    assert child.config_overrides["trainer.total_training_steps"] == 2  # the parent's config, changed where asked
    assert (child.agent_id, child.dataset_id, child.reward_id, child.backend_id) == (
        parent.agent_id, parent.dataset_id, parent.reward_id, parent.backend_id)
    listed = client.get("/api/runs/", {"parent": parent.pk}).json()["results"]
    assert [run["id"] for run in listed] == [child.pk]


def test_a_fork_may_change_the_dataset_and_reward(api_client, owner, parent, registry, no_queue):
    answer = fork(api_client(owner), parent, step=4, dataset="copy", reward="exact-match", name="other reward")
    assert answer.status_code == 201, answer.json()
    child = Run.objects.get(pk=answer.json()["id"])
    assert child.reward.name == "exact-match" and child.name == "other reward" and child.parent_step == 4


@pytest.mark.parametrize("body, field, words", [
    ({"step": 9}, "step", "has not reached step 9 (it is at step 4); its stored checkpoints: 2, 4."),
    ({"step": 3}, "step", "has no stored checkpoint of step 3"),
    ({"step": -1}, "step", "greater than or equal to 0"),
    ({"step": 2**40}, "step", "less than or equal to"),
    ({"step": "2; rm -rf /"}, "step", "valid integer"),
    ({}, "step", "required"),
    ({"step": 2, "overrides": {"trainer.default_local_dir": "/tmp/elsewhere"}}, "overrides", "trainer.default_local_dir"),
    ({"step": 2, "overrides": {MODEL_KEY: "/etc"}}, "overrides", MODEL_KEY),
    ({"step": 2, "overrides": {"trainer.no_such_key": 1}}, "overrides", "trainer.no_such_key"),
])
def test_bad_input_is_a_clear_400_and_nothing_is_queued(api_client, owner, parent, no_queue, body, field, words):
    answer = fork(api_client(owner), parent, **body)
    assert answer.status_code == 400, answer.json()
    assert words in str(answer.json()[field]), answer.json()
    assert Run.objects.count() == 1


def test_a_checkpoint_without_loadable_weights_is_refused(api_client, owner, parent, no_queue):
    """A backend whose checkpoints hold sharded optimizer files only (verl's global_step_N) cannot be forked from."""
    sharded = parent.folder() / "checkpoints" / "global_step_3" / "actor"
    sharded.mkdir(parents=True)
    (sharded / "model_world_size_1_rank_0.pt").write_bytes(b"\0")
    answer = fork(api_client(owner), parent, step=3)
    assert answer.status_code == 400
    assert "checkpoint of step 3 holds no weights in the Hugging Face format" in str(answer.json()["model"])
    assert Run.objects.count() == 1


def test_a_checkpoint_folder_is_the_parents_own_never_a_link_out_of_it(api_client, owner, parent, make_run, runs_dir, no_queue):
    elsewhere = save_tiny_model(runs_dir.parent / "someone-elses-model", layers=1, hidden_size=16, seed=9)
    os.symlink(elsewhere, parent.folder() / "checkpoints" / "checkpoint-3")
    answer = fork(api_client(owner), parent, step=3)
    assert answer.status_code == 400 and "no stored checkpoint of step 3" in str(answer.json()["step"])
    # Nor a link inside a checkpoint (its run's own process wrote the folder).
    weights = parent.folder() / "checkpoints" / "checkpoint-2" / "model.safetensors"
    weights.unlink()
    os.symlink(elsewhere / "model.safetensors", weights)
    answer = fork(api_client(owner), parent, step=2)
    assert answer.status_code == 400 and "holds links to files outside it" in str(answer.json()["model"]), answer.json()
    assert Run.objects.count() == 1


# -- who may fork what -----------------------------------------------------------------------------

def test_a_run_of_another_project_or_person_is_a_404(api_client, stranger, parent, no_queue):
    assert fork(api_client(stranger), parent, step=2).status_code == 404
    assert fork(api_client(None), parent, step=2).status_code in (401, 403)
    assert Run.objects.count() == 1


def test_a_share_link_lets_one_read_a_run_not_fork_it(api_client, page_client, stranger, parent, no_queue):
    link = ShareLink.objects.create(run=parent, created_by=parent.owner)
    assert page_client(None).get(link.get_absolute_url()).status_code == 200  # the link works for reading
    for client in (api_client(stranger), api_client(None)):
        answer = client.post(f"/api/runs/{parent.pk}/fork/?share={link.token}", {"step": 2, "share": link.token}, format="json")
        assert answer.status_code in (401, 403, 404), answer.status_code
    answer = page_client(stranger).get(f"/runs/new/?fork={parent.pk}&step=2&share={link.token}")
    assert answer.status_code == 404
    assert Run.objects.count() == 1


def test_a_fork_goes_only_into_a_project_where_one_may_start_runs(api_client, owner, teammate, viewer, project, parent, no_queue):
    Run.objects.filter(pk=parent.pk).update(project=project, visibility=Run.Visibility.TEAM)
    other_team = Team.objects.create(name="Other", slug="other")
    elsewhere = Project.objects.create(team=other_team, name="not yours")

    answer = fork(api_client(owner), parent, step=2, project=elsewhere.pk)
    assert answer.status_code == 400 and "project" in answer.json(), answer.json()
    # A viewer sees the run, so may fork it, but starts no run in the project: a personal fork only.
    answer = fork(api_client(viewer), parent, step=2)
    assert answer.status_code == 400 and "project" in answer.json(), answer.json()
    assert Run.objects.count() == 1
    answer = fork(api_client(viewer), parent, step=2, project=None)
    assert answer.status_code == 201, answer.json()
    assert (answer.json()["project"], answer.json()["visibility"]) == (None, "private")
    answer = fork(api_client(teammate), parent, step=4)
    assert answer.status_code == 201, answer.json()
    child = Run.objects.get(pk=answer.json()["id"])
    assert (child.owner, child.project, child.visibility, child.parent) == (teammate, project, "team", Run.objects.get(pk=parent.pk))
    Membership.objects.filter(user=teammate).delete()  # left the team: the run is out of sight
    assert fork(api_client(teammate), parent, step=4).status_code == 404


# -- the run pages ---------------------------------------------------------------------------------

def test_the_run_pages_fork_through_the_form_and_show_the_lineage(page_client, owner, parent, copy_form_data, no_queue):
    client = page_client(owner)
    page = client.get(f"/runs/{parent.pk}/").content.decode()
    assert 'id="run-fork"' in page and '<option value="2">2</option>' in page and '<option value="4" selected>4</option>' in page
    assert 'id="run-lineage"' not in page  # no parent, no forks yet

    form = client.get(f"/runs/new/?fork={parent.pk}&step=2").content.decode()
    assert f'<option value="run:{parent.pk}@2" selected>run {parent.pk}: its checkpoint of step 2 (a fork)</option>' in form
    assert 'value="parent fork @2"' in form

    answer = client.post("/runs/new/", {**copy_form_data, "name": "the fork", "model": f"run:{parent.pk}@2"})
    assert answer.status_code == 302, answer.content.decode()[:3000]
    child = Run.objects.get(name="the fork")
    assert (child.parent_id, child.parent_step) == (parent.pk, 2)

    page = client.get(f"/runs/{child.pk}/").content.decode()
    assert f'Forked from <a href="/runs/{parent.pk}/">run #{parent.pk} parent</a>' in page
    assert "at step <strong>2</strong>" in page and "Optimizer state: carried from the checkpoint when training begins" in page
    assert f'href="/dashboard/compare/?runs={parent.pk},{child.pk}"' in page
    page = client.get(f"/runs/{parent.pk}/").content.decode()
    assert f'<a href="/runs/{child.pk}/">#{child.pk} the fork</a> (from step 2)' in page


def test_a_step_without_a_checkpoint_sends_the_person_back_saying_why(page_client, owner, parent, no_queue):
    answer = page_client(owner).get(f"/runs/new/?fork={parent.pk}&step=3", follow=True)
    assert answer.redirect_chain[-1][0] == f"/runs/{parent.pk}/"
    assert "has no stored checkpoint of step 3" in answer.content.decode()
    for query in (f"fork={parent.pk}&step=99999999999999999999", "fork=99999999999999999999&step=2"):
        assert page_client(owner).get(f"/runs/new/?{query}").status_code in (200, 302, 404)


def test_a_stranger_cannot_open_the_fork_form_of_a_run_they_may_not_see(page_client, stranger, parent):
    assert page_client(stranger).get(f"/runs/new/?fork={parent.pk}&step=2").status_code == 404


# -- the compare view ------------------------------------------------------------------------------

def test_the_compare_view_draws_a_fork_from_its_parents_step(page_client, api_client, owner, parent, no_queue):
    child = Run.objects.get(pk=fork(api_client(owner), parent, step=2).json()["id"])
    record_metrics(parent, [{"step": s, "metrics": {"reward": s / 10}} for s in (1, 2, 3, 4)])
    record_metrics(child, [{"step": s, "metrics": {"reward": 0.5 + s / 10}} for s in (1, 2, 3)])
    client = page_client(owner)
    query = f"runs={parent.pk},{child.pk}&key=reward"

    drawn = {run["id"]: run for run in client.get(f"/dashboard/compare/series.json?{query}").json()["runs"]}
    assert drawn[parent.pk]["x"] == [1, 2, 3, 4] and drawn[parent.pk]["offset"] == 0
    assert drawn[child.pk]["x"] == [3, 4, 5] and drawn[child.pk]["offset"] == 2  # its step k at 2 + k
    assert drawn[child.pk]["y"] == pytest.approx([0.6, 0.7, 0.8])
    windowed = {run["id"]: run for run in client.get(f"/dashboard/compare/series.json?{query}&start=4&end=5").json()["runs"]}
    assert windowed[child.pk]["x"] == [4, 5] and windowed[parent.pk]["x"] == [4]

    own = {run["id"]: run for run in client.get(f"/dashboard/compare/series.json?{query}&align=steps").json()["runs"]}
    assert own[child.pk]["x"] == [1, 2, 3] and own[child.pk]["offset"] == 0

    page = client.get(f"/dashboard/compare/?runs={parent.pk},{child.pk}").content.decode()
    assert f"is a fork of #{parent.pk} at step 2: drawn from step 2 on (its step k at 2 + k)" in page
    assert 'data-align="fork"' in page and "Draw each run at its own steps" in page
    # Alone, a fork is drawn at its own steps: there is no parent to line it up with.
    alone = client.get(f"/dashboard/compare/series.json?runs={child.pk}&key=reward").json()["runs"]
    assert alone[0]["x"] == [1, 2, 3]


# -- the command line ------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_command_line_forks_a_run(live_server, owner, parent, token_of, no_queue, capsys):
    from training.platform.cli import main as cli

    out = io.StringIO()
    code = cli(["--url", live_server.url, "--token", token_of(owner), "fork", str(parent.pk), "--step", "4",
                "--set", f"{LR}=0.001", "--name", "from the terminal"], out=out)
    assert code == 0, capsys.readouterr().err
    child = Run.objects.get(name="from the terminal")
    assert (child.parent_id, child.parent_step, child.config_overrides[LR]) == (parent.pk, 4, 0.001)
    assert f"run {child.pk} queued" in out.getvalue() and "Optimizer state: carried from the checkpoint when training begins" in out.getvalue()

    assert cli(["--url", live_server.url, "--token", token_of(owner), "fork", str(parent.pk), "--step", "3"]) == 1
    err = capsys.readouterr().err
    assert "no stored checkpoint of step 3" in err and "{" not in err


def test_the_playground_offers_the_checkpoints_to_fork_from(page_client, owner, viewer, project, parent):
    Run.objects.filter(pk=parent.pk).update(project=project, visibility=Run.Visibility.TEAM)
    for person in (owner, viewer):  # a viewer asks no model, but may fork the run into a personal run
        page = page_client(person).get(f"/runs/{parent.pk}/playground/").content.decode()
        assert 'id="playground-fork"' in page and f'name="fork" value="{parent.pk}"' in page
        assert '<option value="2">2</option>' in page and '<option value="4" selected>4</option>' in page
