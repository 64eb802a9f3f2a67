"""Each worker's housekeeping thread, and its graceful stop.

The thread (started when the worker is ready, in every mode: ``manage.py platform`` starts a worker
too) does these things:

* the **dispatcher** sends queued platform runs whose ``dispatch_at`` is due to their backend's
  queue, once a second. The web side only records runs (the outbox); a run created while the broker
  was down is sent when it is back, and one sent but never claimed is sent again after
  ``RUN_REDISPATCH_SECONDS``. Every worker dispatches; a filtered update decides which one sends.
* the **attempt folders' sweep** (every ``ATTEMPT_FOLDERS_SWEEP_SECONDS``, with the liveness sweep)
  removes the own folders (``<run>/attempts/<n>``) of attempts that ended (their run ended, or a
  later attempt took it) once no process of their writer can run any more on this machine
  (``workers.lifecycle.remove_ended_attempt_folders``);
* the **evaluations' sweep** (with the liveness sweep) fails evaluations whose worker was lost and
  sends again those whose message no worker took (``recover_lost_evaluations``);
* the **liveness sweep** finds running runs nobody heartbeats for any more (``Run.objects.lost()``)
  every ``RUN_SWEEP_SECONDS`` and re-queues them (they resume from their last checkpoint) or fails
  them once their backend's ``max_attempts`` are used. It only judges after this process has
  reached the database, on schedule, for ``RUN_STALE_SECONDS`` in a row: a database outage (no
  heartbeat could be written) or a machine so loaded, or paused, that this thread itself missed
  its ticks (so the supervisors beating next to it may have too) is never mistaken for dead
  workers. Heartbeats and the staleness test both use the database's clock, so clocks that differ
  between machines cannot make a run look lost either.

On SIGTERM (a deploy) the worker tells its training processes to stop: each saves a checkpoint at
its next step and queues its run again (``workers.execute``), instead of holding the deploy for
the rest of the run.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta

import psutil
from celery import bootsteps
from celery.signals import worker_shutting_down
from django.conf import settings
from django.db import connection
from django.utils import timezone

from webapp.celery_app import app
from webapp.checkpoints.logic import EVALUATE_CHECKPOINT
from webapp.checkpoints.models import Evaluation
from webapp.fleet.models import WorkerState
from webapp.integrations import alerts
from webapp.runs.models import Run
from workers.execute import EXECUTE_RUN
from workers.lifecycle import remove_ended_attempt_folders
from workers.playground import dispatch_due_requests
from workers.processes import kill_session_of
from workers.releases import release_in_background, retry_remote_releases

logger = logging.getLogger(__name__)

DISPATCH_POLL_SECONDS = 1.0
# After a failed send (broker down) the run is tried again this much later.
BROKER_RETRY_SECONDS = 2.0
# How often this machine's run folders are looked through for ended attempts' folders to remove.
ATTEMPT_FOLDERS_SWEEP_SECONDS = 30.0


def dispatch_due_runs(limit: int = 100) -> int:
    """Send due queued runs to their queues. Returns how many were sent."""
    sent = 0
    for run in Run.objects.due_for_dispatch().select_related("backend").order_by("created_at")[:limit]:
        now = timezone.now()
        # Take this send: another worker's dispatcher may be looking at the same row.
        taken = Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED, dispatch_at=run.dispatch_at).update(
            dispatch_at=now + timedelta(seconds=settings.RUN_REDISPATCH_SECONDS)
        )
        if not taken:
            continue
        try:
            result = app.send_task(EXECUTE_RUN, args=[run.pk], queue=run.backend.queue)  # by name: the task is the workers' face
        except Exception as exc:  # the broker is down: the run stays in the outbox
            Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED).update(
                dispatch_at=now + timedelta(seconds=BROKER_RETRY_SECONDS)
            )
            logger.warning("Sending run %s to queue %s failed (%s); trying again shortly.", run.pk, run.backend.queue, exc)
            break
        Run.objects.filter(pk=run.pk).update(task_id=result.id or "")
        sent += 1
    return sent


def recover_lost_runs() -> dict[int, str]:
    """Re-queue or fail the running runs nobody looks after. Returns {run id: status given}."""
    outcome = {}
    for run in Run.objects.lost().select_related("backend"):
        if run.kind == Run.Kind.PLATFORM:
            reason = f"its worker ({run.worker}) sent no heartbeat for over {settings.RUN_STALE_SECONDS} s: it was lost."
        else:
            reason = f"Nothing was reported for over {settings.EXTERNAL_RUN_STALE_SECONDS} s; the external run is presumed dead."
        status = run.recover(reason, while_silent=True)  # a heartbeat since the read keeps the attempt
        if status:
            logger.warning("Run %s: %s -> %s", run.pk, reason, status)
            outcome[run.pk] = status
            if status in Run.FINAL and run.kind == Run.Kind.PLATFORM:
                release_in_background(run)
    return outcome


def recover_lost_evaluations() -> dict[int, str]:
    """Nothing of an evaluation is stuck: fail a running one whose worker is gone (its row not written
    for ``RUN_STALE_SECONDS``) or that outlived ``EVALUATION_SECONDS`` by a minute (its supervisor
    would have stopped it), and send a queued one again when no worker took it within
    ``RUN_REDISPATCH_SECONDS`` of its last send (a lost message; a second copy is refused by the
    claim). Returns {evaluation id: what was done}."""
    outcome: dict[int, str] = {}
    now = timezone.now()
    alive = set(WorkerState.objects.alive().values_list("name", flat=True))
    settle = now - timedelta(seconds=settings.RUN_STALE_SECONDS)
    overdue = now - timedelta(seconds=settings.EVALUATION_SECONDS + 60)
    for evaluation in Evaluation.objects.filter(status=Evaluation.Status.RUNNING, started_at__lt=settle):
        if evaluation.worker in alive and evaluation.started_at >= overdue:
            continue
        why = (f"its worker ({evaluation.worker}) was lost before it recorded an end" if evaluation.worker not in alive
               else f"it ran past EVALUATION_SECONDS ({settings.EVALUATION_SECONDS} s) without an end")
        if evaluation.finish(Evaluation.Status.FAILED, f"The evaluation failed: {why}; ask again."):
            logger.warning("Evaluation %s: %s.", evaluation.pk, why)
            outcome[evaluation.pk] = Evaluation.Status.FAILED
    due = now - timedelta(seconds=settings.RUN_REDISPATCH_SECONDS)
    for evaluation in Evaluation.objects.filter(status=Evaluation.Status.QUEUED, sent_at__lt=due):
        # Take this send: another worker's sweep may be looking at the same row.
        if not Evaluation.objects.filter(pk=evaluation.pk, status=Evaluation.Status.QUEUED,
                                         sent_at=evaluation.sent_at).update(sent_at=now):
            continue
        try:
            app.send_task(EVALUATE_CHECKPOINT, args=[evaluation.pk], queue=evaluation.queue)
        except Exception as exc:  # the broker is away: sent again at a later sweep
            Evaluation.objects.filter(pk=evaluation.pk, status=Evaluation.Status.QUEUED).update(sent_at=evaluation.sent_at)
            logger.warning("Sending evaluation %s again to %s failed (%s).", evaluation.pk, evaluation.queue, exc)
            break
        outcome[evaluation.pk] = "sent again"
    return outcome


def worker_presence(worker) -> tuple[str, list[str], int]:
    """A Celery worker's name, the queues it consumes now (a drain cancels them) and its pool size."""
    return worker.hostname, list(worker.app.amqp.queues.consume_from), int(worker.concurrency or 0)


class Housekeeper:
    """The thread: dispatch every second, sweep every ``RUN_SWEEP_SECONDS``, and write its worker's
    row (``WorkerState``: queues, slots) every ``RUN_HEARTBEAT_SECONDS``, which the pages read to
    say what a queued run or question waits for."""

    def __init__(self, worker=None) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="housekeeping", daemon=True)
        self._database_since: float | None = None  # since when this process reaches the database
        self._last_sweep = 0.0
        self._last_folder_sweep = 0.0
        self._last_tick: float | None = None
        self._worker = worker
        self._last_seen = 0.0

    def start(self) -> "Housekeeper":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def tick(self) -> None:
        now = time.monotonic()
        late = now - self._last_tick - DISPATCH_POLL_SECONDS if self._last_tick is not None else 0.0
        if late > settings.RUN_HEARTBEAT_SECONDS:
            # This thread was starved (or the machine paused) past a heartbeat: so may the
            # supervisors have been. Judge only after a full stale window on schedule again.
            logger.warning("Housekeeping ran %.1f s late; not judging runs lost for %s s.", late, settings.RUN_STALE_SECONDS)
            self._database_since = None
        self._last_tick = now
        try:
            if self._database_since is None:
                connection.ensure_connection()
                self._database_since = now
            if self._worker is not None and now - self._last_seen >= settings.RUN_HEARTBEAT_SECONDS:
                self._last_seen = now
                self._say_alive()
            if now - self._last_sweep >= settings.RUN_SWEEP_SECONDS and now - self._database_since >= settings.RUN_STALE_SECONDS:
                self._last_sweep = now
                recover_lost_runs()  # before dispatching: a run re-queued now is sent in this tick
                recover_lost_evaluations()  # evaluations whose worker was lost, or whose message was
                retry_remote_releases()  # lost runs' paid resources a deletion left (refused, or cut short)
                if now - self._last_folder_sweep >= ATTEMPT_FOLDERS_SWEEP_SECONDS:
                    self._last_folder_sweep = now
                    remove_ended_attempt_folders()  # ended attempts' own folders, once nothing of them runs
                alerts.tick()  # runs gone quiet, alerts due for (re)delivery; never raises
            dispatch_due_runs()
            dispatch_due_requests()  # questions to runs' trained models (webapp.playground), the same outbox way
        except Exception as exc:  # the database is down: judge nothing until it has been back a while
            if self._database_since is not None:
                logger.warning("Housekeeping cannot reach the database (%s); retrying.", exc)
            self._database_since = None
            try:
                connection.close()
            except Exception:  # noqa: BLE001 (a broken connection may fail to close; it is dropped anyway)
                pass

    def _say_alive(self) -> None:
        try:
            name, queues, slots = worker_presence(self._worker)
        except RuntimeError:  # a drain changed the queues as they were read: next heartbeat
            return
        WorkerState.objects.seen(name, queues, slots)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(DISPATCH_POLL_SECONDS):
                self.tick()
        finally:
            if self._worker is not None:
                try:
                    WorkerState.objects.gone(self._worker.hostname)  # its queues are unserved now, not in 10 s
                except Exception:  # noqa: BLE001 (the database is down: the row goes stale by itself)
                    pass
            connection.close()


class HousekeepingStep(bootsteps.StartStopStep):
    """Runs the housekeeping thread for as long as the worker runs (``workers.celery_app`` adds it)."""

    def __init__(self, worker, **kwargs) -> None:
        super().__init__(worker, **kwargs)
        self.housekeeper: Housekeeper | None = None

    def start(self, worker) -> None:
        self.housekeeper = Housekeeper(worker).start()

    def stop(self, worker) -> None:
        if self.housekeeper is not None:
            self.housekeeper.stop()


@worker_shutting_down.connect
def _ask_runs_to_stop(sig=None, how=None, **kwargs) -> None:
    """In the worker's main process, on SIGTERM: each training process of this worker saves a
    checkpoint at its next step, queues its run again and exits (its supervisor then returns, and
    the warm shutdown completes). One that has not stopped after ``RUN_SHUTDOWN_GRACE_SECONDS`` is
    killed; its run resumes from its previous checkpoint."""
    training = training_processes()
    for process in training:
        _send(process, signal.SIGTERM)
    if training:
        timer = threading.Timer(settings.RUN_SHUTDOWN_GRACE_SECONDS, lambda: [kill_session_of(p.pid) for p in training])
        timer.daemon = True
        timer.start()


def training_processes() -> list:
    """The training processes (``python -m workers.child``) this worker process started, at any depth
    (forked by its warm process too, whose children name themselves so: one string, not a list)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if " -m workers.child " in " ".join(process.cmdline()) + " ":
                found.append(process)
        except psutil.Error:
            continue
    return found


def _send(process, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # its process group: what it started goes too
    except (ProcessLookupError, PermissionError, psutil.Error):
        pass
