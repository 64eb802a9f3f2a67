"""What a fork's page and the API (``fork_note``) say it carried of its parent's optimizer state: on
the trl backend what its training reported when it began (carried, or why not), recorded on the run
by the attempt that holds it; on the other backends that a fork starts with a fresh optimizer."""

from __future__ import annotations

import pytest

from webapp.registry.models import Backend
from webapp.runs.models import Run
from webapp.runs.recording import DatabaseSink, RunRecorder


@pytest.fixture
def parent(make_run):
    return make_run(name="parent", status=Run.Status.SUCCEEDED, steps=4)


def notes(api_client, page_client, user, run) -> tuple[str, str]:
    """The fork note as the API gives it and as the run page shows it."""
    page = page_client(user).get(f"/runs/{run.pk}/").content.decode()
    return api_client(user).get(f"/api/runs/{run.pk}/").json()["fork_note"], page


def test_a_trl_fork_says_what_its_training_carried_of_the_optimizer_state(make_run, parent, api_client, page_client, owner):
    fork = make_run(name="fork", parent=parent, parent_step=2, model=f"run:{parent.pk}@2")
    api, page = notes(api_client, page_client, owner, fork)
    assert "Optimizer state: carried from the checkpoint when training begins" in api and api in page.replace("&#x27;", "'")

    # Its attempt begins training and reports that the state was carried.
    Run.objects.filter(pk=fork.pk).update(status=Run.Status.RUNNING, attempts=1)
    DatabaseSink(RunRecorder(fork.pk, attempt=1)).log_optimizer_state({"carried": True, "why": ""})
    api, page = notes(api_client, page_client, owner, fork)
    assert "Optimizer state carried from step 2" in api and "Optimizer state carried from step 2" in page
    assert "the parent's schedule is not carried" in api

    # A later attempt that starts fresh again reports anew: here, why it could not carry the state.
    Run.objects.filter(pk=fork.pk).update(attempts=2)
    why = "the checkpoint's optimizer holds 26 parameter tensors in groups of [14, 12], this run trains 8 in groups of [8]"
    DatabaseSink(RunRecorder(fork.pk, attempt=2)).log_optimizer_state({"carried": False, "why": why})
    api, page = notes(api_client, page_client, owner, fork)
    assert f"Optimizer state not carried: {why}; it trained with a fresh optimizer." in api
    assert "Optimizer state not carried" in page and "carried from step" not in api

    # An attempt that no longer holds the run records nothing.
    DatabaseSink(RunRecorder(fork.pk, attempt=1)).log_optimizer_state({"carried": True, "why": ""})
    assert Run.objects.get(pk=fork.pk).optimizer_state == {"carried": False, "why": why}


def test_a_fork_on_another_backend_says_it_starts_with_a_fresh_optimizer(make_run, parent, api_client, page_client, owner):
    verl = Backend.objects.create(name="verl-forks", processor="verl")
    fork = make_run(name="fork", parent=parent, parent_step=2, model=f"run:{parent.pk}@2", backend=verl)
    api, page = notes(api_client, page_client, owner, fork)
    assert "Optimizer state not carried: the verl backend starts a fork with a fresh optimizer" in api
    assert "Optimizer state not carried" in page


def test_a_trl_fork_that_ended_before_training_began_says_nothing_was_reported(make_run, parent, api_client, page_client, owner):
    fork = make_run(name="fork", parent=parent, parent_step=2, model=f"run:{parent.pk}@2", status=Run.Status.FAILED)
    api, _ = notes(api_client, page_client, owner, fork)
    assert "Optimizer state: not reported" in api


def test_a_run_that_is_no_fork_has_no_note(make_run, api_client, page_client, owner):
    run = make_run(name="plain")
    assert notes(api_client, page_client, owner, run)[0] == ""
