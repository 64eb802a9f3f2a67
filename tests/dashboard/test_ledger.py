"""The run ledger (``GET /api/runs/<id>/ledger/`` and the run page's section): per-step counts and
the all-equal share from the episode store, attempts from their rows (``RunAttempt``), the settings the
backend accepted without effect, and access as every run resource."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from training.tracking.episodes import episode_record
from training.types import Episode, Step, TerminationReason, Trajectory
from webapp.dashboard import episodes as episode_store
from webapp.runs.models import Run, RunAttempt, RunLog
from webapp.teams.models import Membership, Project, ShareLink, Team

URL = "/api/runs/{}/ledger/"


def record(step: int, position: int, group: str, reward: float, termination=TerminationReason.ENV_DONE,
           error: str = "", split: str = "train") -> dict:
    episode = Episode(
        task={"prompt": "abc="},
        trajectories=[Trajectory(steps=[Step(chat_completions=[{"role": "user", "content": "abc="}], model_response="ab",
                                             reward=reward, done=True)], reward=reward)],
        prompt_ids=[1], response_ids=[2], response_mask=[1], termination_reason=termination, error=error or None,
    )
    return episode_record(episode, split=split, step=step, position=position, group=group, group_position=position % 2)


@pytest.fixture
def ledger_run(make_run, project, tmp_path, settings):
    """A team-visible run in ``project`` with two steps of three groups of two episodes each."""
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility=Run.Visibility.TEAM, run_path=str(tmp_path / "run-folder"))
    # Step 1: group a all 1.0 (equal), group b 0.0 and 1.0, group c errored and timed out (both 0.0: equal).
    episode_store.store_step(run.pk, 1, 1, [
        record(1, 0, "a", 1.0), record(1, 1, "a", 1.0),
        record(1, 2, "b", 0.0), record(1, 3, "b", 1.0, TerminationReason.MAX_RESPONSE_LENGTH),
        record(1, 4, "c", 0.0, TerminationReason.ERROR, error="ValueError: bad move"),
        record(1, 5, "c", 0.0, TerminationReason.TIMEOUT),
        record(1, 0, "v", 0.5, split="val"),  # validation: not in the training counts
    ])
    # Step 2: every group's rewards differ; one cut by the prompt's length, one by turns.
    episode_store.store_step(run.pk, 2, 2, [
        record(2, 0, "a", 0.0, TerminationReason.MAX_PROMPT_LENGTH), record(2, 1, "a", 1.0),
        record(2, 2, "b", 0.5, TerminationReason.MAX_TURNS), record(2, 3, "b", 1.0),
    ])
    return run


def test_the_counts_and_the_all_equal_share_per_step(ledger_run, api_client, owner):
    response = api_client(owner).get(URL.format(ledger_run.pk))
    assert response.status_code == 200, response.content
    steps = {row["step"]: row for row in response.json()["steps"]}
    assert sorted(steps) == [1, 2]
    first, second = steps[1], steps[2]
    assert (first["episodes"], first["scored"], first["failed"], first["timed_out"]) == (6, 6, 1, 1)
    assert (first["cut_by_length"], first["cut_by_turns"]) == (1, 0)
    assert (first["groups"], first["all_equal_groups"]) == (3, 2)
    assert first["all_equal_share"] == pytest.approx(2 / 3)
    assert (second["episodes"], second["failed"], second["timed_out"], second["cut_by_length"], second["cut_by_turns"]) == (4, 0, 0, 1, 1)
    assert second["all_equal_share"] == 0
    assert response.json()["step_window"] == {"step_min": 0, "step_max": 2}


def test_a_step_window_reads_only_its_steps_and_a_reversed_one_is_a_400(ledger_run, api_client, owner):
    client = api_client(owner)
    assert [row["step"] for row in client.get(URL.format(ledger_run.pk), {"step_min": 2}).json()["steps"]] == [2]
    assert [row["step"] for row in client.get(URL.format(ledger_run.pk), {"step_max": 1}).json()["steps"]] == [1]
    refused = client.get(URL.format(ledger_run.pk), {"step_min": 3, "step_max": 1})
    assert refused.status_code == 400 and "step_min" in refused.json()


def test_steps_attempts_and_ignored_settings(ledger_run, api_client, owner):
    """Attempts are the rows the run's own changes write: a claim begins one, the sweep's recover
    of a lost worker ends it (lost), the next claim begins the second, the failure ends it."""
    Run.objects.filter(pk=ledger_run.pk).update(
        config_overrides={"trainer.total_training_steps": 7},
        final_config={"trainer": {"total_training_steps": 5},
                      "ignored_keys": {"rollout.gpu_memory_utilization": {"value": 0.9, "why": "no vLLM here"}}},
    )
    run = Run.objects.get(pk=ledger_run.pk)
    assert run.claim("w1@host-a")
    Run.objects.filter(pk=run.pk).update(steps=2)  # what the metric store keeps
    assert run.recover("its worker (w1@host-a) sent no heartbeat for over 10 s: it was lost.") == Run.Status.QUEUED
    stale = Run.objects.get(pk=run.pk)
    stale.attempts = 1  # the first attempt's supervisor, waking up late
    run = Run.objects.get(pk=run.pk)
    assert run.claim("w2@host-b")
    assert not stale.finish(Run.Status.SUCCEEDED)  # fenced: it no longer holds the run, and ends no attempt
    assert run.finish(Run.Status.FAILED, error="CUDA out of memory\nmore")
    body = api_client(owner).get(URL.format(run.pk)).json()
    assert (body["steps_planned"], body["steps_done"], body["attempts_started"], body["attempts_lost"]) == (5, 2, 2, 1)
    first, second = body["attempts"]
    assert (first["attempt"], first["worker"], first["start_step"], first["end_step"]) == (1, "w1@host-a", 0, 2)
    assert first["start"] and first["end"] and (first["cause"], first["cause_label"]) == ("lost", "lost worker")
    assert "sent no heartbeat" in first["detail"]
    assert (second["worker"], second["start_step"], second["end_step"], second["cause"]) == ("w2@host-b", 2, 2, "failed")
    assert second["detail"] == "CUDA out of memory"
    assert body["ignored_settings"] == [{"key": "rollout.gpu_memory_utilization", "value": 0.9, "why": "no vLLM here"}]
    # A run's own log lines say nothing of its attempts any more: the rows do.
    RunLog.objects.create(run=run, uid=uuid.uuid4(), level="WARNING", message="Attempt 2 ended: all fine. Queued again.")
    assert api_client(owner).get(URL.format(run.pk)).json()["attempts"][1]["cause"] == "failed"


def test_a_deploy_requeue_a_cancel_and_a_superseded_attempt(ledger_run, api_client, owner):
    run = Run.objects.get(pk=ledger_run.pk)
    assert run.claim("w1")
    assert run.requeue("The worker is shutting down; stopped after step 0 with a checkpoint.")
    run = Run.objects.get(pk=run.pk)
    assert run.claim("w2")
    # Put back in the queue by hand (not through requeue): the next claim finds attempt 2 never ended.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.QUEUED)
    run = Run.objects.get(pk=run.pk)
    assert run.claim("w3")
    run.request_cancel()
    assert run.finish(Run.Status.CANCELLED, error="Cancelled.")
    causes = [(a["attempt"], a["cause"]) for a in api_client(owner).get(URL.format(run.pk)).json()["attempts"]]
    assert causes == [(1, "requeued"), (2, "superseded"), (3, "cancelled")]
    assert RunAttempt.objects.get(run=run, number=1).detail.startswith("The worker is shutting down")


def test_a_share_links_page_shows_the_ledger_with_its_attempts(ledger_run, api_client, owner):
    run = Run.objects.get(pk=ledger_run.pk)
    assert run.claim("w1@gpu-box-7")
    RunAttempt.objects.filter(run=run).update(host="gpu-box-7")
    Run.objects.filter(pk=run.pk).update(final_config={"ignored_keys": {"secret.path": {"value": "/srv/x", "why": "none"}}})
    link = ShareLink.objects.create(run=run, created_by=owner)
    # What the run's live status tells a link's reader already: its worker (and so its host).
    shared = api_client(None).get(URL.format(run.pk), {"share": link.token}).json()["attempts"]
    assert (shared[0]["attempt"], shared[0]["worker"], shared[0]["host"]) == (1, "w1@gpu-box-7", "gpu-box-7")
    page = api_client(None).get(reverse("runs:shared_run", args=[link.token]))
    assert page.status_code == 200, page.status_code
    text = page.content.decode()
    assert 'id="run-ledger"' in text and 'id="ledger-attempts"' in text and "2 of 3" in text
    assert "secret.path" not in text  # the run's config is not the link's to show


def test_the_run_page_shows_the_ledger(ledger_run, page_client, owner):
    Run.objects.filter(pk=ledger_run.pk).update(
        final_config={"ignored_keys": {"rollout.gpu_memory_utilization": {"value": 0.9, "why": "no vLLM here"}}})
    page = page_client(owner).get(f"/runs/{ledger_run.pk}/").content.decode()
    assert 'id="run-ledger"' in page and "rollout.gpu_memory_utilization=0.9" in page and "2 of 3" in page


def test_a_stranger_and_another_project_get_404_and_a_share_link_reads_the_counts_only(ledger_run, api_client, stranger, owner):
    elsewhere = Team.objects.create(name="Other team", slug="other")
    Membership.objects.create(team=elsewhere, user=stranger, role=Membership.Role.OWNER)
    Project.objects.create(team=elsewhere, name="other")
    assert api_client(stranger).get(URL.format(ledger_run.pk)).status_code == 404
    anonymous = api_client(None)
    assert anonymous.get(URL.format(ledger_run.pk)).status_code in (401, 403)
    Run.objects.filter(pk=ledger_run.pk).update(final_config={"ignored_keys": {"a.b": {"value": 1, "why": "none"}}})
    link = ShareLink.objects.create(run=ledger_run, created_by=owner)
    shared = anonymous.get(URL.format(ledger_run.pk), {"share": link.token})
    # The counts, but not the run's settings: its config is for those who may view it logged in.
    assert shared.status_code == 200 and len(shared.json()["steps"]) == 2 and shared.json()["ignored_settings"] is None
    assert api_client(owner).get(URL.format(ledger_run.pk), {"share": link.token}).json()["ignored_settings"] == [
        {"key": "a.b", "value": 1, "why": "none"}]
    assert anonymous.post(f"{URL.format(ledger_run.pk)}?share={link.token}").status_code in (401, 403, 405)
    link.revoke()
    assert anonymous.get(URL.format(ledger_run.pk), {"share": link.token}).status_code == 404
