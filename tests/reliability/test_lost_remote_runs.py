"""A fireworks run whose training process is gone for good (its last allowed attempt lost with its
machine, or cancelled with no worker left to stop it) never runs its own teardown: the liveness
sweep deletes the trainer job and deployment recorded on the run and in its folder's ledger, and
ends the run naming why and what it deleted.

Stand-in: Fireworks' platform (``standins.fireworks_service``, a loopback server speaking the
``fireworks-ai[training]`` SDK's wire formats over a tiny torch model). The training process
(``python -m workers.child``, SIGKILLed as a lost machine's would be), the SDK, the database and
the sweep are real; the lost worker is simulated by the killed process and a heartbeat made old.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db.models.functions import Now

from standins.fireworks_service import FireworksStandIn
from webapp.runs.models import Run, RunLog
from workers import housekeeping, releases
from workers.execute import claim
from workers.processes import child_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEDGER = "fireworks_resources.json"


@pytest.fixture
def platform(monkeypatch, settings, tmp_path):
    standin = FireworksStandIn()
    monkeypatch.setenv("FIREWORKS_API_KEY", standin.api_key)  # the workers' environment holds the key
    settings.RUNS_DIR = tmp_path
    yield standin
    standin.close()


def fireworks_run(make_run, registry, platform, max_attempts: int) -> Run:
    backend = registry["backends"]["fireworks"]
    backend.default_config = {"remote.base_url": platform.url, "remote.poll_interval_s": 0.05}  # as an admin sets it
    backend.max_attempts = max_attempts
    backend.save()
    return make_run(backend=backend, config_overrides={
        "trainer.total_training_steps": 1000, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
        "data.max_response_length": 2,
    })


def lose_a_training_process(run: Run, platform: FireworksStandIn) -> dict[str, str]:
    """Claim the run as a worker would, train it in ``workers.child`` until its deployment serves
    weights (both paid resources exist and are recorded), then SIGKILL it: no teardown runs."""
    claimed = claim(run.pk, "gone@lost-host")
    assert isinstance(claimed, Run)
    child = subprocess.Popen([sys.executable, "-m", "workers.child", str(run.pk)], env=child_env(claimed.backend.needs_gpu),
                             cwd=django_settings.BASE_DIR, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while child.poll() is None and time.monotonic() < deadline:
            ids = Run.objects.get(pk=run.pk).remote_ids
            if platform.hotloads and {"fireworks_trainer_job", "fireworks_deployment"} <= set(ids):
                break
            time.sleep(0.2)
        assert platform.hotloads, f"the attempt never got going (exit code {child.poll()}): {Run.objects.get(pk=run.pk).error}"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    # Nobody heartbeats for it any more: make that older than the stale window, as the sweep sees it.
    Run.objects.filter(pk=run.pk).update(heartbeat_at=Now() - timedelta(seconds=django_settings.RUN_STALE_SECONDS + 60))
    ids = Run.objects.get(pk=run.pk).remote_ids
    assert sorted(platform.running()) == sorted([f"job:{ids['fireworks_trainer_job']}", f"deployment:{ids['fireworks_deployment']}"])
    assert len(json.loads((claimed.folder() / LEDGER).read_text())) == 2
    return ids


def test_a_run_lost_on_its_last_attempt_is_failed_and_its_job_and_deployment_deleted(make_run, registry, platform):
    run = fireworks_run(make_run, registry, platform, max_attempts=1)
    ids = lose_a_training_process(run, platform)

    assert housekeeping.recover_lost_runs() == {run.pk: Run.Status.FAILED}
    releases.wait_for_releases(120)  # deleted in a thread of its own: the sweep does not wait on the service

    assert platform.running() == []
    assert sorted(platform.deleted) == sorted([f"job:{ids['fireworks_trainer_job']}", f"deployment:{ids['fireworks_deployment']}"])
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "sent no heartbeat" in run.error and "1 attempt(s) were lost, the most its backend allows (1)" in run.error
    assert (f"Its fireworks resources were deleted: deployment {ids['fireworks_deployment']}, "
            f"trainer job {ids['fireworks_trainer_job']}.") in run.error
    assert json.loads((run.folder() / LEDGER).read_text()) == []  # struck off: nothing left to delete
    assert run.remote_ids == ids  # still shown on the run page
    assert not run.remote_release_pending and run.remote_release_attempts == 0  # nothing left for a later sweep


def test_a_cancelled_run_whose_worker_is_gone_is_cancelled_not_retried_and_its_resources_deleted(make_run, registry, platform):
    run = fireworks_run(make_run, registry, platform, max_attempts=3)  # attempts left: a lost one would be re-queued
    ids = lose_a_training_process(run, platform)
    assert run.request_cancel()

    assert housekeeping.recover_lost_runs() == {run.pk: Run.Status.CANCELLED}
    releases.wait_for_releases(120)

    assert platform.running() == [] and len(platform.deleted) == 2
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.attempts == 1
    assert run.error.startswith("Cancelled; its worker (gone@lost-host) sent no heartbeat")
    assert ids["fireworks_deployment"] in run.error and ids["fireworks_trainer_job"] in run.error


def lost_run_with_resources_left(make_run, registry, platform) -> Run:
    """A run lost on its last attempt whose job and deployment are on the service (put there
    directly: what provisioned them does not matter to their deletion)."""
    run = fireworks_run(make_run, registry, platform, max_attempts=1)
    assert isinstance(claim(run.pk, "gone@lost-host"), Run)
    platform.jobs["job-left"] = {"name": "accounts/standin/rlorTrainerJobs/job-left", "state": "JOB_STATE_RUNNING"}
    platform.deployments["deployment-left"] = {"name": "accounts/standin/deployments/deployment-left", "state": "READY", "snapshot": None}
    ids = {"fireworks_trainer_job": "job-left", "fireworks_deployment": "deployment-left"}  # as the lost attempt reported them
    Run.objects.filter(pk=run.pk).update(remote_ids=ids, heartbeat_at=Now() - timedelta(seconds=django_settings.RUN_STALE_SECONDS + 60))
    return run


def test_resources_that_cannot_be_deleted_are_named_on_the_failed_run_and_deleted_by_a_later_sweep(make_run, registry, platform):
    """The service refuses the deletes (the stand-in answers 403): the run still fails, its error
    and log name what may still be billing, and the run is marked as still holding resources. The
    sweep after the backoff deletes them, records that, and then leaves the service alone."""
    run = lost_run_with_resources_left(make_run, registry, platform)
    platform.fail["delete"] = 1
    before = Run.objects.values_list(Now(), flat=True).first()

    assert housekeeping.recover_lost_runs() == {run.pk: Run.Status.FAILED}
    releases.wait_for_releases(120)

    assert sorted(platform.running()) == ["deployment:deployment-left", "job:job-left"] and platform.deleted == []
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "sent no heartbeat" in run.error
    assert ("Its fireworks resources could not be deleted and may still be billing: deployment deployment-left, "
            "trainer job job-left; the liveness sweep keeps trying") in run.error
    assert RunLog.objects.filter(run=run, level="ERROR", message__startswith=(
        "Its fireworks resources could not be deleted and may still be billing: deployment deployment-left, "
        "trainer job job-left; trying again in 60 s (try 1)")).exists()
    assert run.remote_release_pending and run.remote_release_attempts == 1
    assert run.remote_release_at >= before + timedelta(seconds=django_settings.RUN_RELEASE_BACKOFF_SECONDS)  # backed off
    assert list(Run.objects.filter(remote_release_pending=True)) == [run]  # what the admin's filter lists

    # Still refused on the next try: the backoff doubles.
    Run.objects.filter(pk=run.pk).update(remote_release_at=Now())  # the backoff has passed
    before = Run.objects.values_list(Now(), flat=True).first()
    assert releases.retry_remote_releases() == [run.pk]
    releases.wait_for_releases(120)
    run.refresh_from_db()
    assert run.remote_release_pending and run.remote_release_attempts == 2 and platform.deleted == []
    assert run.remote_release_at >= before + timedelta(seconds=2 * django_settings.RUN_RELEASE_BACKOFF_SECONDS)
    assert run.error.count("may still be billing") == 1  # named once in the error; each try is in the log

    # The service deletes again: the next sweep deletes both and records it.
    platform.fail.pop("delete")
    Run.objects.filter(pk=run.pk).update(remote_release_at=Now())
    assert releases.retry_remote_releases() == [run.pk]
    releases.wait_for_releases(120)
    assert platform.running() == []
    assert sorted(platform.deleted) == ["deployment:deployment-left", "job:job-left"]
    run.refresh_from_db()
    assert not run.remote_release_pending and run.remote_release_at is None
    message = "Its fireworks resources were deleted (try 3): deployment deployment-left, trainer job job-left."
    assert message in run.error and RunLog.objects.filter(run=run, level="WARNING", message=message).exists()
    assert run.status == Run.Status.FAILED

    # Nothing is left to delete: later sweeps do not go back to the service.
    Run.objects.filter(pk=run.pk).update(remote_release_at=Now())  # even were it due
    assert releases.retry_remote_releases() == []  # no deletion started
    assert sorted(platform.deleted) == ["deployment:deployment-left", "job:job-left"]  # none deleted twice


def test_a_deletion_cut_short_by_its_workers_exit_is_taken_up_by_a_later_sweep(make_run, registry, platform):
    """The worker that started the deletion exited before it finished: the row still says the
    resources are to be deleted, and once that worker's hold on it has run out, a sweep deletes them."""
    run = lost_run_with_resources_left(make_run, registry, platform)
    # What the exited worker left: the run failed, its deletion recorded and held by that worker.
    run.refresh_from_db()  # as claimed
    assert run.recover("its worker sent no heartbeat: it was lost.") == Run.Status.FAILED
    Run.objects.filter(pk=run.pk).update(
        remote_release_pending=True, remote_release_at=Now() + timedelta(seconds=django_settings.RUN_RELEASE_LEASE_SECONDS))

    assert releases.retry_remote_releases() == []  # still held by the deletion under way
    assert len(platform.running()) == 2

    Run.objects.filter(pk=run.pk).update(remote_release_at=Now())  # the hold has run out
    assert releases.retry_remote_releases() == [run.pk]
    releases.wait_for_releases(120)
    assert platform.running() == [] and sorted(platform.deleted) == ["deployment:deployment-left", "job:job-left"]
    run.refresh_from_db()
    assert not run.remote_release_pending
    assert "Its fireworks resources were deleted: deployment deployment-left, trainer job job-left." in run.error


def test_a_lost_tinker_run_has_nothing_to_release():
    """Tinker provisions nothing per run: its session ends when the SDK's heartbeats stop."""
    from training.backends.tinker_protocol.tinker import TinkerProcessor

    assert TinkerProcessor.release_abandoned({"tinker_model_id": "m-1"}, None) == ([], [])


def test_what_only_the_ledger_lists_is_deleted_too(tmp_path):
    """What an attempt listed in its ledger but never reported (killed between the two) is deleted too."""
    from training.backends.tinker_protocol.fireworks import ResourceLedger

    ledger = ResourceLedger(Path(tmp_path) / LEDGER)
    ledger.add("job", "only-in-ledger")
    standin = FireworksStandIn()
    try:
        standin.jobs["only-in-ledger"] = {"name": "accounts/standin/rlorTrainerJobs/only-in-ledger", "state": "JOB_STATE_RUNNING"}
        from training.backends.tinker_protocol.fireworks import delete_abandoned_resources

        deleted, left = delete_abandoned_resources({}, tmp_path, standin.api_key, standin.url)
    finally:
        standin.close()
    assert (deleted, left) == (["trainer job only-in-ledger"], [])
    assert standin.deleted == ["job:only-in-ledger"] and ledger.entries() == []


def test_the_release_backoff_is_read_from_the_settings(make_run, registry, platform, settings):
    """``RUN_RELEASE_BACKOFF_SECONDS`` and ``RUN_RELEASE_BACKOFF_MAX_SECONDS`` set the retries' pace:
    5 s after the first refusal, then doubled but capped at 8 s; ``RUN_RELEASE_BATCH`` caps a sweep."""
    settings.RUN_RELEASE_BACKOFF_SECONDS, settings.RUN_RELEASE_BACKOFF_MAX_SECONDS = 5, 8
    run = lost_run_with_resources_left(make_run, registry, platform)
    platform.fail["delete"] = 2
    before = Run.objects.values_list(Now(), flat=True).first()
    assert housekeeping.recover_lost_runs() == {run.pk: Run.Status.FAILED}
    releases.wait_for_releases(120)
    run.refresh_from_db()
    assert before + timedelta(seconds=5) <= run.remote_release_at < before + timedelta(seconds=60)
    assert RunLog.objects.filter(run=run, message__contains="trying again in 5 s (try 1)").exists()

    settings.RUN_RELEASE_BATCH = 0
    Run.objects.filter(pk=run.pk).update(remote_release_at=Now())
    assert releases.retry_remote_releases() == []  # a sweep of none
    settings.RUN_RELEASE_BATCH = 1
    before = Run.objects.values_list(Now(), flat=True).first()
    assert releases.retry_remote_releases() == [run.pk]
    releases.wait_for_releases(120)
    run.refresh_from_db()
    assert before + timedelta(seconds=8) <= run.remote_release_at < before + timedelta(seconds=10)  # min(10, 8)
    assert RunLog.objects.filter(run=run, message__contains="trying again in 8 s (try 2)").exists()
