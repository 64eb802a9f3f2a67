"""A worker frozen while it holds its run's row lock (a paused VM, a stopped process) does not hold
the run for ever: PostgreSQL ends its session once it has been idle inside the transaction for
twice RUN_STALE_SECONDS (``workers.database``), and the takeover that waited behind the lock
goes through. Real PostgreSQL, a real process frozen with SIGSTOP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from fault_harness import ROOT
from webapp.runs.models import Run
from workers.housekeeping import recover_lost_runs
from workers.processes import database_url

pytestmark = [pytest.mark.django_db(transaction=True)]

HOLDER = """
import sys, time
import workers  # the worker's setup, as the Celery worker and the training process have it
from django.db import transaction
from webapp.runs.models import lock_for_attempt
from workers.database import bound_idle_transactions

bound_idle_transactions()
with transaction.atomic():
    lock_for_attempt(int(sys.argv[1]), 1)
    print("locked", flush=True)
    time.sleep(3600)
"""


@pytest.fixture
def frozen_holder():
    started = []

    def start(run_id: int) -> subprocess.Popen:
        env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict),
               "RUN_HEARTBEAT_SECONDS": "1", "RUN_STALE_SECONDS": "2"}  # its sessions end after 4 s idle in a transaction
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_id)], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(holder)
        line = holder.stdout.readline()
        assert line.strip() == "locked", holder.stderr.read()
        holder.send_signal(signal.SIGSTOP)  # frozen with the lock held
        return holder

    yield start
    for holder in started:
        holder.kill()
        holder.wait(timeout=30)


def test_a_takeover_is_not_stuck_behind_the_row_lock_of_a_frozen_attempt(make_run, frozen_holder):
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, attempts=1, worker="frozen@host",
                                         heartbeat_at=timezone.now() - timedelta(hours=1))
    holder = frozen_holder(run.pk)

    with transaction.atomic():
        with connection.cursor() as cursor:  # a takeover stuck for a minute fails the test instead of hanging it
            cursor.execute("SET LOCAL statement_timeout = '60s'")
        outcome = recover_lost_runs()

    assert outcome == {run.pk: Run.Status.QUEUED}
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED
    with connection.cursor() as cursor:  # the frozen process's session was ended by the server
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()")
        assert cursor.fetchone()[0] == 0
    assert holder.poll() is None  # still frozen: it was its session that ended, not the process
