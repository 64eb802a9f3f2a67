"""What a member adds to a project's registry is bounded and says nothing about other projects:
names are unique per project (not platform-wide, which told anyone the names of every other
project's datasets); one person keeps at most a few uploads waiting for their columns; a chat
agent's text fields are bounded; a JSONL line nested 100,000 deep is a form error naming the line
(it was a 500: Python's JSON parser raises RecursionError)."""

from __future__ import annotations

import html
import os
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from webapp.registry import uploads
from webapp.registry.models import Agent, Dataset, PendingUpload, Tool
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, Team

CSV = b"question,answer\n" + b"".join(b"what is %d+%d?,%d\n" % (i, i, 2 * i) for i in range(8))


@pytest.fixture(autouse=True)
def _media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "uploads"


@pytest.fixture
def their_project(stranger) -> Project:
    """Another team's project, of ``stranger``."""
    team = Team.objects.create(name="Their team", slug="theirs")
    Membership.objects.create(team=team, user=stranger, role=Membership.Role.OWNER)
    return Project.objects.create(team=team, name="secret-plans")


def text(response) -> str:
    return html.unescape(response.content.decode())


def upload(client, project, name: str, filename: str = "rows.csv", content: bytes = CSV):
    return client.post(reverse("registry:dataset_upload", args=[project.pk]),
                       {"name": name, "description": "", "file": SimpleUploadedFile(filename, content)})


def upload_and_map(client, project, name: str) -> Dataset:
    response = upload(client, project, name)
    assert response.status_code == 302, text(response)[-2000:]
    saved = client.post(response["Location"], {"prompt": "question", "ground_truth": "answer", "test_percent": 0})
    assert saved.status_code == 302, text(saved)[-2000:]
    return Dataset.objects.get(name=name, project=project)


def test_a_taken_name_in_another_project_is_not_said_and_does_not_stop_anyone(page_client, owner, stranger, project, their_project):
    theirs = upload_and_map(page_client(stranger), their_project, "acquisition-targets")
    client = page_client(owner)
    mine = upload_and_map(client, project, "acquisition-targets")  # before: "The name ... is taken on this platform"
    assert mine != theirs and mine.project == project
    # Within the project, and against the shared entries, a name is still one entry: said without naming anyone else's.
    again = upload(client, project, "acquisition-targets")
    assert "The name 'acquisition-targets' is taken in this project; choose another." in text(again)
    Dataset.objects.create(name="public-set", identifier="copy")  # an administrator's shared dataset
    shared = upload(client, project, "public-set")
    assert "The name 'public-set' is taken by a shared entry; choose another." in text(shared)
    assert "secret-plans" not in text(again) + text(shared) and Dataset.objects.filter(name="acquisition-targets").count() == 2


def test_chat_agent_names_are_per_project_too(page_client, owner, stranger, project, their_project, registry):
    data = {"name": "negotiator", "description": "", "system_prompt": "Be brief.", "model": "tiny-char", "temperature": 1.0,
            "tools": [Tool.objects.get(name="add").pk]}
    assert page_client(stranger).post(reverse("registry:agent_create", args=[their_project.pk]), data).status_code == 302
    response = page_client(owner).post(reverse("registry:agent_create", args=[project.pk]), data)
    assert response.status_code == 302, text(response)[-2000:]
    assert Agent.objects.filter(name="negotiator").count() == 2
    again = page_client(owner).post(reverse("registry:agent_create", args=[project.pk]), data)
    assert "The name 'negotiator' is taken in this project; choose another." in text(again)


def test_the_database_keeps_names_unique_per_project_and_among_shared_entries(project, their_project, db):
    from django.db import IntegrityError, transaction

    Dataset.objects.create(name="same", identifier="copy", project=project)
    Dataset.objects.create(name="same", identifier="copy", project=their_project)
    Dataset.objects.create(name="shared", identifier="copy")
    for duplicate in ({"project": project}, {"project": None}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Dataset.objects.create(name="same" if duplicate["project"] else "shared", identifier="copy", **duplicate)


def test_the_api_resolves_a_name_in_the_runs_project(api_client, owner, project, registry, apply_async):
    """The same name in two of a person's projects: the run's project decides (it was one name on the platform)."""
    other = Project.objects.create(team=project.team, name="other")
    ours = Dataset.objects.create(name="lake-rows", source=Dataset.Source.REGISTERED, identifier="copy", val_split="test", project=project)
    Dataset.objects.create(name="lake-rows", source=Dataset.Source.REGISTERED, identifier="copy", val_split="test", project=other)
    response = api_client(owner).post("/api/runs/", {
        "agent": "copy-task", "dataset": "lake-rows", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char",
        "project": project.pk, "visibility": "team",
        "overrides": {"trainer.total_training_steps": 1, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2},
    }, format="json")
    assert response.status_code == 201, response.content.decode()[-2000:]
    assert Run.objects.get().dataset == ours


def test_uploads_waiting_for_their_columns_are_limited_per_person(page_client, owner, teammate, project, settings):
    client = page_client(owner)
    for number in range(uploads.PENDING_PER_PERSON):
        assert upload(client, project, f"waiting-{number}").status_code == 302
    refused = upload(client, project, "one-more")
    assert refused.status_code == 200
    assert (f"You have {uploads.PENDING_PER_PERSON} uploads waiting for their columns, the limit of "
            f"{uploads.PENDING_PER_PERSON}: map or discard one of them (listed below) first") in text(refused)
    assert 'id="uploads-waiting"' in text(refused)
    assert PendingUpload.objects.filter(owner=owner).count() == uploads.PENDING_PER_PERSON
    assert not PendingUpload.objects.filter(name="one-more").exists()
    # Another person has a limit of their own; discarding one makes room.
    assert upload(page_client(teammate), project, "theirs").status_code == 302
    first = PendingUpload.objects.filter(owner=owner).first()
    rows_file = first.rows.path
    assert page_client(teammate).post(reverse("registry:dataset_discard", args=[project.pk, first.token])).status_code == 404
    client.post(reverse("registry:dataset_discard", args=[project.pk, first.token]))
    assert not PendingUpload.objects.filter(pk=first.pk).exists() and not os.path.exists(rows_file)
    assert upload(client, project, "one-more").status_code == 302


def test_chat_agent_text_is_bounded(page_client, owner, project, registry):
    from webapp.registry.forms import MAX_DESCRIPTION_CHARS, MAX_SYSTEM_PROMPT_CHARS

    data = {"name": "wordy", "description": "d" * (MAX_DESCRIPTION_CHARS + 1), "system_prompt": "p" * (MAX_SYSTEM_PROMPT_CHARS + 1),
            "model": "tiny-char", "temperature": 1.0}
    response = page_client(owner).post(reverse("registry:agent_create", args=[project.pk]), data)
    errors = response.context["form"].errors
    assert errors["system_prompt"] == [f"Ensure this value has at most {MAX_SYSTEM_PROMPT_CHARS} characters (it has {MAX_SYSTEM_PROMPT_CHARS + 1})."]
    assert errors["description"] == [f"Ensure this value has at most {MAX_DESCRIPTION_CHARS} characters (it has {MAX_DESCRIPTION_CHARS + 1})."]
    assert not Agent.objects.filter(name="wordy").exists()
    data.update(description="d", system_prompt="p" * MAX_SYSTEM_PROMPT_CHARS)
    assert page_client(owner).post(reverse("registry:agent_create", args=[project.pk]), data).status_code == 302


def test_a_jsonl_line_nested_100k_deep_is_a_form_error_naming_the_line(page_client, owner, project):
    client = page_client(owner)
    deep = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = upload(client, project, "deep", "rows.jsonl", f'{{"prompt": "fine"}}\n\n{deep}\n'.encode())
    assert response.status_code == 200  # before: 500 (RecursionError)
    assert "Row 2 (line 3): nests deeper than 32 levels (the limit); flatten the row." in text(response)
    # Deep enough to parse, but past the limit: the same bound as API bodies (webapp/api/parsers.py).
    nested: object = "x"
    for _ in range(32):
        nested = [nested]
    response = upload(client, project, "deep", "rows.jsonl", (json.dumps({"prompt": nested}) + "\n").encode())
    assert "Row 1 (line 1): nests deeper than 32 levels (the limit)" in text(response)
    assert not PendingUpload.objects.exists() and not Dataset.objects.filter(name="deep").exists()
    # 32 levels, the row included, are fine.
    response = upload(client, project, "deep", "rows.jsonl", (json.dumps({"prompt": nested[0]}) + "\n").encode())
    assert response.status_code == 302, text(response)[-2000:]
