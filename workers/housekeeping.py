"""Each worker's housekeeping thread, and its graceful stop.

The thread (started when the worker is ready, in every mode: ``manage.py platform`` starts a worker
too) does two things:

* the **dispatcher** sends queued platform runs whose ``dispatch_at`` is due to their backend's
  queue, once a second. The web side only records runs (the outbox); a run created while the broker
  was down is sent when it is back, and one sent but never claimed is sent again after
  ``RUN_REDISPATCH_SECONDS``. Every worker dispatches; a filtered update decides which one sends.
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

from celery import bootsteps
from celery.signals import worker_shutting_down
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

logger = logging.getLogger(__name__)

DISPATCH_POLL_SECONDS = 1.0
# After a failed send (broker down) the run is tried again this much later.
BROKER_RETRY_SECONDS = 2.0


def dispatch_due_runs(limit: int = 100) -> int:
    """Send due queued runs to their queues. Returns how many were sent."""
    from webapp.runs.models import Run
    from workers.tasks import execute_run_task

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
            result = execute_run_task.apply_async(args=[run.pk], queue=run.backend.queue)
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
    from webapp.runs.models import Run

    outcome = {}
    for run in Run.objects.lost().select_related("backend"):
        if run.kind == Run.Kind.PLATFORM:
            reason = f"its worker ({run.worker}) sent no heartbeat for over {settings.RUN_STALE_SECONDS} s: it was lost."
        else:
            reason = f"Nothing was reported for over {settings.EXTERNAL_RUN_STALE_SECONDS} s; the external run is presumed dead."
        status = run.recover(reason)
        if status:
            logger.warning("Run %s: %s -> %s", run.pk, reason, status)
            outcome[run.pk] = status
            if status in Run.FINAL and run.kind == Run.Kind.PLATFORM:
                release_in_background(run)
    return outcome


# Retries of lost remote runs' deletions: settings.RUN_RELEASE_* (backoff, batch, lease).

_releases: list[threading.Thread] = []


def release_in_background(run) -> threading.Thread | None:
    """Record that ``run``'s remote resources are to be deleted (on its row, before anything is
    tried), then ``release_remote_resources`` in a thread of its own: the service's SDK retries an
    unreachable service for minutes per call, and neither the sweep nor the dispatcher may wait.
    None when another sweep holds the deletion."""
    from webapp.runs.models import Run

    Run.objects.filter(pk=run.pk, remote_release_pending=False).update(
        remote_release_pending=True, remote_release_attempts=0, remote_release_at=Now())
    return _start_release(run)


def retry_remote_releases(limit: int | None = None) -> list[int]:
    """Start the deletions due again (refused before, or cut short by a worker's exit), at most
    ``limit`` (default ``RUN_RELEASE_BATCH``). Returns the ids of the runs whose deletion was started."""
    from webapp.runs.models import Run

    limit = settings.RUN_RELEASE_BATCH if limit is None else limit
    due = (Run.objects.filter(remote_release_pending=True, remote_release_at__lte=Now())
           .select_related("backend").order_by("remote_release_at")[:limit])
    return [run.pk for run in due if _start_release(run) is not None]


def _start_release(run) -> threading.Thread | None:
    from webapp.runs.models import Run

    # Take it: another worker's sweep may look at the same row.
    taken = Run.objects.filter(pk=run.pk, remote_release_pending=True, remote_release_at__lte=Now()).update(
        remote_release_at=Now() + timedelta(seconds=settings.RUN_RELEASE_LEASE_SECONDS))
    if not taken:
        return None

    def release() -> None:
        try:
            release_remote_resources(run)
        except Exception:  # noqa: BLE001 (logged: a thread's exception would otherwise vanish; the lease runs out and a later sweep tries again)
            logger.exception("Run %s: releasing its remote resources failed.", run.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=release, name=f"release-run-{run.pk}", daemon=True)
    _releases[:] = [t for t in _releases if t.is_alive()] + [thread]
    thread.start()
    return thread


def wait_for_releases(timeout: float | None = None) -> None:
    """Wait for the releases started so far (tests; a worker's shutdown)."""
    for thread in list(_releases):
        thread.join(timeout)


def release_remote_resources(run) -> None:
    """A run ended without its training process (lost for the last time, or cancelled with its
    worker gone), so no teardown ran: what it provisioned on a remote service (a fireworks trainer
    job and deployment, billed while they exist) is deleted here, through its backend's
    ``release_abandoned``, from the ids recorded on the run and its folder's ledger. The outcome is
    added to the run's error and log. What could not be deleted keeps the run's
    ``remote_release_pending`` and is tried again by a later sweep (``retry_remote_releases``,
    with backoff) until the service says it is gone. A re-queued run needs none of this: its next
    attempt deletes what the lost one left before it provisions its own."""
    from training.backends.processor import get_processor_class
    from webapp.runs.models import Run, RunLog

    def done() -> None:
        Run.objects.filter(pk=run.pk).update(remote_release_pending=False, remote_release_at=None)

    try:
        release = getattr(get_processor_class(run.backend.processor), "release_abandoned", None)
    except Exception as exc:  # a plugin backend that does not import here has nothing to release from here
        logger.warning("Run %s: backend %s does not load here (%s); nothing released.", run.pk, run.backend.processor, exc)
        return done()
    if release is None:
        return done()
    remote_ids, tries = Run.objects.filter(pk=run.pk).values_list("remote_ids", "remote_release_attempts").first() or ({}, 0)
    remote = (run.final_config or {}).get("remote") or {}
    base_url = remote.get("base_url") or (run.backend.default_config or {}).get("remote.base_url")
    try:
        released, left = release(remote_ids or {}, str(run.folder()), base_url)
    except Exception as exc:  # never let one run's service stop the sweep
        released, left = [], [f"whatever is recorded on the run ({exc.__class__.__name__}: {exc})"]
    tries += 1
    service = run.backend.processor
    if not left:
        done()
    else:
        delay = min(settings.RUN_RELEASE_BACKOFF_SECONDS * 2 ** (tries - 1), settings.RUN_RELEASE_BACKOFF_MAX_SECONDS)
        Run.objects.filter(pk=run.pk).update(remote_release_attempts=tries, remote_release_at=Now() + timedelta(seconds=delay))
    notes = []
    if released:
        later = f" (try {tries})" if tries > 1 else ""
        notes.append(f"Its {service} resources were deleted{later}: {', '.join(released)}.")
        RunLog.objects.create(run=run, level="WARNING", message=notes[-1])
    if left:
        message = (f"Its {service} resources could not be deleted and may still be billing: {', '.join(left)}; "
                   f"trying again in {delay} s (try {tries}), or delete them in the {service} console.")
        RunLog.objects.create(run=run, level="ERROR", message=message)
        logger.error("Run %s: %s", run.pk, message)
        if tries == 1:  # the error names it once; each later try is in the log
            notes.append(f"Its {service} resources could not be deleted and may still be billing: {', '.join(left)}; "
                         f"the liveness sweep keeps trying (see the log), or delete them in the {service} console.")
    if notes:
        error = Run.objects.filter(pk=run.pk).values_list("error", flat=True).first() or ""
        Run.objects.filter(pk=run.pk).update(error=" ".join([error, *notes]).strip())


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
                retry_remote_releases()  # lost runs' paid resources a deletion left (refused, or cut short)
                from webapp.integrations import alerts

                alerts.tick()  # runs gone quiet, alerts due for (re)delivery; never raises
            dispatch_due_runs()
            from workers.playground import dispatch_due_requests

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
        from webapp.fleet.models import WorkerState

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
                    from webapp.fleet.models import WorkerState

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
        timer = threading.Timer(settings.RUN_SHUTDOWN_GRACE_SECONDS, lambda: [_send(p, signal.SIGKILL) for p in training])
        timer.daemon = True
        timer.start()


def training_processes() -> list:
    """The training processes (``python -m workers.child``) this worker process started, at any depth."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "workers.child" in process.cmdline():
                found.append(process)
        except psutil.Error:
            continue
    return found


def _send(process, sig: int) -> None:
    import psutil

    try:
        os.killpg(process.pid, sig)  # its process group: what it started goes too
    except (ProcessLookupError, PermissionError, psutil.Error):
        pass
