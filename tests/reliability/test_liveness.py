"""The liveness sweep judges by the database's clock, only after its own thread has run on schedule
for a whole stale window (a starved or paused machine starves the supervisors' heartbeats too), and
sends a run it re-queues in the same tick. The housekeeper's clock is driven by the test; the
database, the broker (a queue nobody listens to) and the rows are real."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db.models.functions import Now

from webapp.registry.models import Backend
from webapp.runs.models import Run
from workers import housekeeping

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch, settings):
    settings.RUN_HEARTBEAT_SECONDS, settings.RUN_STALE_SECONDS, settings.RUN_SWEEP_SECONDS = 1, 3, 1
    clock = Clock()
    monkeypatch.setattr(housekeeping.time, "monotonic", clock)
    return clock


def lost_run(make_run) -> Run:
    Backend.objects.filter(name="trl").update(queue=f"test-liveness-{uuid.uuid4().hex[:8]}")  # nobody listens there
    run = make_run()
    assert run.claim("gone@host")
    Run.objects.filter(pk=run.pk).update(heartbeat_at=Now() - timedelta(seconds=60))
    return run


def ticks(keeper: housekeeping.Housekeeper, clock: Clock, *times: float) -> None:
    for at in times:
        clock.now = at
        keeper.tick()


def test_a_lost_run_is_requeued_after_a_stale_window_on_schedule_and_sent_at_once(make_run, clock):
    run = lost_run(make_run)
    keeper = housekeeping.Housekeeper()
    ticks(keeper, clock, 1000, 1001, 1002)
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING, "judged before a whole window on schedule"
    ticks(keeper, clock, 1003)
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.lost_attempts == 1
    assert run.task_id, "the re-queued run was not sent in the tick that re-queued it"


def test_a_sweeper_that_ran_late_waits_a_whole_window_again(make_run, clock):
    run = lost_run(make_run)
    keeper = housekeeping.Housekeeper()
    ticks(keeper, clock, 1000, 1001, 1002)
    ticks(keeper, clock, 1006, 1007, 1008)  # 3 s late: the machine was starved or paused
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    ticks(keeper, clock, 1009)
    assert Run.objects.get(pk=run.pk).status == Run.Status.QUEUED


def test_a_heartbeat_keeps_a_run_and_uses_the_database_clock(make_run, clock):
    run = lost_run(make_run)
    assert run.heartbeat() and run.heartbeat_at is not None and not hasattr(run.heartbeat_at, "resolve_expression")
    keeper = housekeeping.Housekeeper()
    ticks(keeper, clock, 1000, 1001, 1002, 1003, 1004)
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    assert not Run.objects.lost().filter(pk=run.pk).exists()


def test_a_heartbeat_between_the_sweeps_read_and_its_update_keeps_the_attempt(make_run, monkeypatch):
    """The sweep judges runs lost from a read; a heartbeat that lands after that read (it waited
    behind a lock on the run's row, or just came in) must keep the attempt: the re-queue is made
    only while the row is still silent."""
    run = lost_run(make_run)
    read = Run.objects.lost

    class HeartbeatAfterTheRead:
        def select_related(self, *fields):
            found = list(read().select_related(*fields))
            assert run.heartbeat()  # the supervisor's heartbeat, committed between the read and the update
            return found

    monkeypatch.setattr(Run.objects, "lost", HeartbeatAfterTheRead)
    assert housekeeping.recover_lost_runs() == {}
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.lost_attempts == 0 and run.attempts == 1
