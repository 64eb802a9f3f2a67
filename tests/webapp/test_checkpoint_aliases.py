"""A run's stored checkpoints through the API, with the metrics at their steps and their aliases;
a project's aliases set and moved; a checkpoint downloaded, and opened in the playground, by alias."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

import pytest
from asgiref.sync import async_to_sync

from standins.checkpoints import with_checkpoints
from webapp.checkpoints.models import CheckpointAlias
from workers.lifecycle import Attempt

pytestmark = pytest.mark.django_db


def streamed(response) -> bytes:
    """A download's bytes (the views stream from async iterators, as the ASGI server serves them)."""
    async def collect():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


@pytest.fixture
def run_with_checkpoints(make_run, project):
    run = with_checkpoints(make_run(project=project, visibility="team", status="succeeded", steps=4), [2, 4],
                           metrics={1: {"reward": 0.1}, 2: {"reward": 0.5, "val/default/pass@1": 0.25}, 4: {"reward": 0.75}})
    yield run
    shutil.rmtree(run.folder(), ignore_errors=True)


def test_the_api_lists_stored_checkpoints_with_the_metrics_at_their_steps(run_with_checkpoints, api_client, owner):
    response = api_client(owner).get(f"/api/runs/{run_with_checkpoints.pk}/checkpoints/")
    assert response.status_code == 200, response.content
    assert response.json() == {"run": run_with_checkpoints.pk, "checkpoints": [
        {"step": 2, "name": "checkpoint-2", "metrics": {"reward": 0.5, "val/default/pass@1": 0.25}, "aliases": []},
        {"step": 4, "name": "checkpoint-4", "metrics": {"reward": 0.75}, "aliases": []},
    ]}
    # A rotated-out checkpoint is no longer listed.
    shutil.rmtree(run_with_checkpoints.folder() / "checkpoints" / "checkpoint-2")
    listed = api_client(owner).get(f"/api/runs/{run_with_checkpoints.pk}/checkpoints/").json()["checkpoints"]
    assert [c["step"] for c in listed] == [4]


def test_an_alias_names_one_checkpoint_per_project_and_moves(run_with_checkpoints, api_client, teammate, project):
    client = api_client(teammate)  # a member of the project labels a checkpoint of a teammate's run
    url = f"/api/projects/{project.pk}/aliases/"
    first = client.post(url, {"name": "best", "run": run_with_checkpoints.pk, "step": 2}, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["set_by"] == "teammate" and first.json()["step"] == 2
    moved = client.post(url, {"name": "best", "run": run_with_checkpoints.pk, "step": 4}, format="json")
    assert moved.status_code == 200, moved.content
    assert CheckpointAlias.objects.filter(project=project, name="best").count() == 1
    listed = client.get(f"/api/runs/{run_with_checkpoints.pk}/checkpoints/").json()["checkpoints"]
    assert [(c["step"], c["aliases"]) for c in listed] == [(2, []), (4, ["best"])]
    assert [a["name"] for a in client.get(url).json()] == ["best"]
    # What the run's attempts keep through their checkpoint rotation (trainer_hooks' kept_checkpoints).
    assert Attempt(run_with_checkpoints.pk).aliased_steps() == {4}

    missing = client.post(url, {"name": "candidate", "run": run_with_checkpoints.pk, "step": 3}, format="json")
    assert missing.status_code == 400 and "no checkpoint at step 3" in missing.json()["detail"] and "2, 4" in missing.json()["detail"]
    bad_name = client.post(url, {"name": "Best One!", "run": run_with_checkpoints.pk, "step": 2}, format="json")
    assert bad_name.status_code == 400 and "name" in bad_name.json()

    assert client.delete(f"{url}best/").status_code == 204
    assert not CheckpointAlias.objects.filter(project=project).exists()


def test_download_and_chat_by_alias(run_with_checkpoints, api_client, page_client, owner, teammate, project):
    api_client(owner).post(f"/api/projects/{project.pk}/aliases/",
                           {"name": "candidate", "run": run_with_checkpoints.pk, "step": 4}, format="json")
    client = page_client(teammate)
    download = client.get(f"/projects/{project.pk}/aliases/candidate/download")
    assert download.status_code == 200
    body = streamed(download)
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = tar.getnames()
        config = json.load(tar.extractfile(f"run-{run_with_checkpoints.pk}-checkpoint-4/config.json"))
    saved = json.loads((run_with_checkpoints.folder() / "checkpoints" / "checkpoint-4" / "config.json").read_text())
    assert config == saved and all(name.startswith(f"run-{run_with_checkpoints.pk}-checkpoint-4") for name in names)

    chat = client.get(f"/projects/{project.pk}/aliases/candidate/playground")
    assert chat.status_code == 302 and chat["Location"] == f"/runs/{run_with_checkpoints.pk}/playground/?model=checkpoint-4"
    page = client.get(chat["Location"])
    assert b'<option value="checkpoint-4" selected>' in page.content

    # The checkpoint rotated out since: the alias says so rather than serving another.
    shutil.rmtree(run_with_checkpoints.folder() / "checkpoints" / "checkpoint-4")
    gone = client.get(f"/projects/{project.pk}/aliases/candidate/download")
    assert gone.status_code == 404
