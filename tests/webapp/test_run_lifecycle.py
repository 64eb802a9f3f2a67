"""A run's status changes through filtered updates: claimed once, finished once, honest when stale."""

from datetime import timedelta

import pytest
from django.utils import timezone

from webapp.runs.models import Run, RunLog
from workers.housekeeping import recover_lost_runs


def test_only_one_worker_claims_a_run(make_run):
    run = make_run()
    other_copy = Run.objects.get(pk=run.pk)
    assert run.claim("worker-a") is True
    assert other_copy.claim("worker-b") is False
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.worker == "worker-a" and run.started_at


def test_finish_records_once(make_run):
    run = make_run()
    run.claim("w")
    assert run.finish(Run.Status.FAILED, error="boom") is True
    assert run.finish(Run.Status.SUCCEEDED) is False
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and run.error == "boom" and run.finished_at


def test_finish_rejects_a_non_final_status(make_run):
    run = make_run()
    with pytest.raises(ValueError, match="final"):
        run.finish(Run.Status.RUNNING)


def test_cancel_of_a_queued_run_ends_it(make_run):
    run = make_run()
    assert run.request_cancel() is True
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert run.claim("late-worker") is False


def test_cancel_of_a_running_run_asks_the_worker(make_run):
    run = make_run()
    run.claim("w")
    assert run.request_cancel() is True
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.cancel_requested()


def test_cancel_view(owner_client, make_run):
    run = make_run()
    response = owner_client.post(f"/runs/{run.pk}/cancel/")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_lost_runs_are_requeued_until_their_backend_allows_no_more_attempts(make_run, settings):
    fresh, stale = make_run(), make_run()
    fresh.claim("w")
    stale.claim("w")
    stale.backend.max_attempts = 2
    stale.backend.save()

    def lose():
        Run.objects.filter(pk=stale.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=settings.RUN_STALE_SECONDS + 5))

    lose()
    assert recover_lost_runs() == {stale.pk: Run.Status.QUEUED}
    stale.refresh_from_db()
    assert stale.status == Run.Status.QUEUED and stale.lost_attempts == 1 and stale.dispatch_at is None
    assert RunLog.objects.filter(run=stale, message__contains="Attempt 1 ended: its worker (w) sent no heartbeat").exists()
    assert stale.claim("w2") and stale.attempts == 2
    lose()
    assert recover_lost_runs() == {stale.pk: Run.Status.FAILED}
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.status == Run.Status.FAILED and "2 attempt(s) were lost" in stale.error and "heartbeat" in stale.error
    assert fresh.status == Run.Status.RUNNING


def test_an_attempt_given_up_on_can_no_longer_change_the_run(make_run):
    run = make_run()
    first = Run.objects.get(pk=run.pk)
    assert first.claim("w1")
    assert first.requeue("its worker was lost.")
    second = Run.objects.get(pk=run.pk)
    assert second.claim("w2")
    assert not first.heartbeat() and not first.finish(Run.Status.SUCCEEDED) and not first.requeue("late")
    assert second.heartbeat() and second.finish(Run.Status.SUCCEEDED)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.worker == "w2" and run.attempts == 2
