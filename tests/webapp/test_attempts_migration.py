"""Runs claimed before attempts were recorded get one attempt row from their own fields (migration
``runs.0018_run_attempts_from_runs``, its function called on real rows), and the way back removes
only those rows."""

from __future__ import annotations

import importlib
from datetime import timedelta

from django.apps import apps
from django.utils import timezone

from webapp.runs.models import Run, RunAttempt

migration = importlib.import_module("webapp.runs.migrations.0018_run_attempts_from_runs")


def old_run(make_run, **fields) -> Run:
    """A run as the platform left it before attempts were recorded: no attempt row."""
    run = make_run(**fields)
    RunAttempt.objects.filter(run=run).delete()
    return run


def test_each_claimed_run_without_attempts_gets_its_last_one(make_run):
    started = timezone.now() - timedelta(hours=2)
    failed = old_run(make_run, status=Run.Status.FAILED, attempts=3, worker="w1@gpu-a", started_at=started, steps=40,
                     finished_at=started + timedelta(hours=1), error="CUDA out of memory.\nTraceback ...")
    running = old_run(make_run, status=Run.Status.RUNNING, attempts=1, worker="w2@gpu-b", started_at=started, steps=7)
    never_claimed = old_run(make_run, status=Run.Status.QUEUED)
    recorded = make_run(status=Run.Status.QUEUED)
    assert recorded.claim("w3@gpu-c")  # claimed since: it has its row, and keeps only that one

    migration.attempts_from_runs(apps, None)

    row = RunAttempt.objects.get(run=failed)
    assert (row.number, row.worker, row.started_at, row.ended_at, row.end_step, row.cause) == (
        3, "w1@gpu-a", started, started + timedelta(hours=1), 40, RunAttempt.Cause.FAILED)
    assert row.detail == "From the run's row: CUDA out of memory."
    row = RunAttempt.objects.get(run=running)
    assert (row.number, row.worker, row.ended_at, row.cause) == (1, "w2@gpu-b", None, "")
    assert not RunAttempt.objects.filter(run=never_claimed).exists()
    assert RunAttempt.objects.filter(run=recorded).count() == 1

    # The running one's end is recorded on the row it was given, as on any attempt's.
    assert RunAttempt.end(running.pk, 1, RunAttempt.Cause.SUCCEEDED)
    assert RunAttempt.objects.get(run=running).cause == RunAttempt.Cause.SUCCEEDED

    migration.attempts_from_runs(apps, None)  # run again: nothing more
    assert RunAttempt.objects.count() == 3


def test_the_way_back_removes_only_the_rows_it_wrote(make_run):
    old = old_run(make_run, status=Run.Status.SUCCEEDED, attempts=1, finished_at=timezone.now())
    recorded = make_run(status=Run.Status.QUEUED)
    assert recorded.claim("w3@gpu-c")
    migration.attempts_from_runs(apps, None)
    migration.remove_attempts_from_runs(apps, None)
    assert not RunAttempt.objects.filter(run=old).exists()
    assert RunAttempt.objects.filter(run=recorded).count() == 1
