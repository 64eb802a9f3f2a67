"""One attempt of a claimed run in its training process, from its start to one recorded end.

``Attempt`` is a context manager (as NetBox's ``JobRunner``): on entry it loads the run, starts
the attempt's report writer and log handler, its stop check and its SIGTERM handler; the body
builds the trainer and trains (``Attempt.train``); on exit, however the body ended, the attempt
ends in exactly one way, recorded once:

* **superseded**: another attempt holds the run (or it ended). Nothing more is written: what it
  reported but did not store is dropped, its row is left to the attempt that holds it.
* **re-queued**: it stopped to be resumed (the worker shuts down, the supervising worker process
  is gone) with a checkpoint, or the database was away while it started. The next attempt
  resumes from the checkpoint in the run's folder (or the artifact store).
* **recovered**: stopping to be resumed went wrong; counted as a lost attempt (its backend's
  ``max_attempts`` bound how many are tried again).
* **finished**: it ended by itself (succeeded, or failed) or was cancelled by a person.

Every write of the attempt is fenced by its attempt number (``Fence``): the reports and log lines
under a lock of the run's row (``lock_for_attempt``), row changes in their filtered update,
checkpoints and the final model written in the attempt's own folder (``<run>/attempts/<n>``) and
published into the run's by a rename under that lock (``Fence.holding``), uploads after
``may_write``, the end itself by ``Run.finish``'s filtered update. The attempt's own folder names its
training process as its writer; once the attempt has ended and nothing of that process runs, each
worker's housekeeping removes the folder (``remove_ended_attempt_folders``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, TypeVar

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.db.models.functions import Now

from training.backends.processor import attempt_folder
from training.platform.artifacts import ArtifactStoreError, RunUploader
from training.errors import OwnerUnknown, RunSuperseded
from webapp.policy.checks import redact
from webapp.runs import artifacts
from webapp.checkpoints.models import CheckpointAlias
from webapp.runs.artifacts import RUN_FOLDER
from webapp.runs.models import AttemptSuperseded, Checkpoint, Run, RunAttempt, lock_for_attempt
from webapp.runs.recording import RunLogHandler, RunRecorder
from workers.processes import record_writer, writer_gone

logger = logging.getLogger(__name__)
training_logger = logging.getLogger("training")

# How often the training process checks the database for a cancel (the library polls once per step).
CANCEL_CHECK_SECONDS = 1.0

T = TypeVar("T")


def with_database(action: Callable[[], T], what: str) -> T:
    """``action()``, retried with backoff while the database is unreachable (up to RUN_DATABASE_RETRY_SECONDS)."""
    deadline = time.monotonic() + settings.RUN_DATABASE_RETRY_SECONDS
    delay = 0.5
    while True:
        try:
            return action()
        except DatabaseError as exc:
            if time.monotonic() > deadline:
                raise
            logger.warning("Cannot %s yet, the database is unreachable (%s); retrying in %.0f s.", what, exc, delay)
            close_old_connections()
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def requeue_or_recover(run: Run, reason: str) -> str:
    """Queue the run again for its next attempt (or, past its backend's ``max_attempts``, its
    status as ``Run.requeue`` left it). Returns the run's status."""
    if run.requeue(reason):
        return Run.Status.QUEUED
    run.refresh_from_db()
    return run.status


class Fence:
    """The attempt's fencing token in its training process: the attempt number.

    Every write of the run carries it. The metric store and the log writer check it under a lock
    on the run's row in the write's own transaction (``lock_for_attempt``); status changes check it
    in their filtered update; the files the library writes (checkpoints, the final model) ask
    ``may_write`` first. Once the run is found held by another attempt (or ended), the attempt
    stops: ``on_lost`` runs (the training process kills its own session), so a process paused
    past its takeover writes nothing more when it wakes.
    """

    def __init__(self, run: Run, on_lost: Callable[[], None] | None = None) -> None:
        self.run_id, self.attempt = run.pk, run.attempts
        self.on_lost = on_lost
        self.writers: list = []  # the attempt's report writers: their spooled reports are deleted when it is lost
        self.lost = False
        self._renewed = time.monotonic()

    def guard(self, writer: T) -> T:
        """A report writer of this attempt: it says when its write found the run held by another
        attempt, and what it spooled is dropped once the attempt is lost."""
        writer.on_superseded = self.superseded
        self.writers.append(writer)
        return writer

    def may_write(self) -> bool:
        """Before a file of the run is written: whether this attempt still holds the run. Asking
        renews the run's heartbeat, a lease: no other attempt can take the run over within
        RUN_STALE_SECONDS of it. With the database away, a recent lease answers; past half the
        stale window the write waits for the database (a cut-off worker cannot know whether the
        run was taken over meanwhile)."""
        if self.lost:
            return False
        deadline = time.monotonic() + settings.RUN_DATABASE_RETRY_SECONDS
        delay = 0.5
        while True:
            asked = time.monotonic()
            try:
                held = Run.objects.filter(pk=self.run_id, attempts=self.attempt, status=Run.Status.RUNNING).update(
                    heartbeat_at=Now()) == 1
                break
            except DatabaseError:
                close_old_connections()
                if asked - self._renewed < settings.RUN_STALE_SECONDS / 2:
                    return True
                if asked > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        if held:
            self._renewed = asked
            return True
        self.superseded()
        return False

    def holding(self, action: Callable[[], None], wait: bool = False) -> bool:
        """Run ``action`` (a rename that publishes a checkpoint or the final model into the run's
        folder) only while this attempt holds the run, inside a transaction that locks the run's
        row first: a takeover, which updates the row, waits for it, so none slips between the
        check and the rename. Returns whether it ran. With the database away it raises
        ``OwnerUnknown`` at once, or with ``wait`` once RUN_DATABASE_RETRY_SECONDS have passed."""
        if self.lost:
            return False
        deadline = time.monotonic() + settings.RUN_DATABASE_RETRY_SECONDS
        delay = 0.5
        while True:
            try:
                with transaction.atomic():
                    lock_for_attempt(self.run_id, self.attempt)
                    action()
                return True
            except AttemptSuperseded:
                self.superseded()
                return False
            except DatabaseError as exc:
                close_old_connections()
                if not wait or time.monotonic() > deadline:
                    raise OwnerUnknown(f"the database is unreachable ({exc.__class__.__name__})") from exc
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def superseded(self) -> None:
        """Another attempt holds the run (or it ended): stop writing, and stop."""
        if self.lost:
            return
        self.lost = True
        logger.error("Run %s: attempt %s no longer holds the run; it writes nothing more and stops.", self.run_id, self.attempt)
        for writer in self.writers:
            writer.abandon()
        if self.on_lost is not None:
            self.on_lost()


class StopCheck:
    """``should_stop`` for the library, and why it said stop.

    A cancel requested in the browser (read at most once a second) stops the run for good. A
    SIGTERM (the worker shuts down) or the loss of the supervising worker process pauses it: it
    stops at the next step with a checkpoint and is queued again. A database that does not answer
    is no reason to stop. A row held by another attempt is the fence's to act on.
    """

    def __init__(self, run: Run, fence: Fence) -> None:
        self.run = run
        self.fence = fence
        self._last = 0.0
        self._parent = os.getppid()
        self.cancelled = False
        self.pause_reason = ""

    def pause(self, reason: str) -> None:
        if not self.pause_reason:
            self.pause_reason = reason
            training_logger.warning("Stopping at the next step to be resumed later: %s", reason)

    def __call__(self) -> bool:
        now = time.monotonic()
        if not (self.cancelled or self.pause_reason) and now - self._last >= CANCEL_CHECK_SECONDS:
            self._last = now
            if os.getppid() != self._parent:
                self.pause("the supervising worker process is gone.")
            try:
                row = Run.objects.filter(pk=self.run.pk).values_list("cancel_requested_at", "status", "attempts").first()
            except DatabaseError:
                close_old_connections()
            else:
                self.cancelled = row is not None and row[0] is not None
                if row is None or row[1] != Run.Status.RUNNING or row[2] != self.fence.attempt:
                    self.fence.superseded()
        return self.cancelled or bool(self.pause_reason) or self.fence.lost


class Attempt:
    """``with Attempt(run_id) as attempt: ... attempt.train(trainer)``; then ``attempt.status`` is
    the run's status after it: final, or queued when it stopped to be resumed by a later attempt.

    ``on_lost`` is called once the attempt is found superseded (``Fence``); the training process
    passes ``workers.processes.kill_own_group``. Without it the attempt stops at its next step or
    file write. An exception of the body is recorded as the attempt's end and not raised again,
    unless it is not an ``Exception`` (KeyboardInterrupt, SystemExit): that one is recorded, then raised.
    """

    def __init__(self, run_id: int, on_lost: Callable[[], None] | None = None) -> None:
        self.run_id = run_id
        self.on_lost = on_lost
        self.uploader: RunUploader | None = None
        self.training = False  # the trainer was built and checked: a failure from now on is the run's
        self.result: Any = None
        self.status = ""
        self._hidden: list[str] = []
        self._previous_sigterm: Any = None

    def __enter__(self) -> "Attempt":
        # A database away at start-up delays the run (RUN_DATABASE_RETRY_SECONDS at most), never fails it.
        run = with_database(lambda: Run.objects.select_related("agent", "dataset", "reward", "backend").get(pk=self.run_id),
                            "load the run")
        if run.status != Run.Status.RUNNING:
            raise ValueError(f"Run {self.run_id} is {run.status}, not running; claim it first.")
        self.run = run
        self.run_path = str(run.folder())
        self.fence = Fence(run, self.on_lost)
        # Its own folder names this process's session: once none of it runs, the folder is removed
        # (remove_ended_attempt_folders), and not before; a folder without it is kept.
        try:
            record_writer(attempt_folder(self.run_path, run.attempts))
        except OSError as exc:  # a full disk, say: the run goes on, its folder stays after it
            logger.warning("Run %s: attempt %s could not record its writer (%s); its folder will be kept.",
                           run.pk, run.attempts, exc)
        self._record_host()
        # Reports are spooled in the run's folder until stored: what a killed attempt reported but did
        # not store, this one writes first, so a step logged before a checkpoint is never lost.
        self.recorder = self.fence.guard(with_database(
            lambda: RunRecorder(run.pk, spool_dir=self.run_path, attempt=run.attempts), "count the run's log lines"))
        self.recorder.start()
        self.log_handler = RunLogHandler(self.recorder)
        self.log_handler.redact = self.redact
        training_logger.addHandler(self.log_handler)
        if training_logger.getEffectiveLevel() > logging.INFO:
            training_logger.setLevel(logging.INFO)
        self.should_stop = StopCheck(run, self.fence)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(
                signal.SIGTERM, lambda *_: self.should_stop.pause("the worker is shutting down."))
        return self

    def __exit__(self, exc_type, exc: BaseException | None, tb) -> bool:
        try:
            self.status = self._end(exc)
        finally:
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            training_logger.removeHandler(self.log_handler)
        return exc is None or isinstance(exc, Exception) or self.fence.lost

    def _record_host(self) -> None:
        """The machine this attempt trains on, on its ``RunAttempt`` row, written under the run's lock
        for this attempt (``Fence.holding``): an attempt that no longer holds the run writes nothing.
        With the database away it is left unsaid; the run does not wait for it."""
        host = socket.gethostname()[:200]
        try:
            self.fence.holding(lambda: RunAttempt.objects.filter(run_id=self.run_id, number=self.fence.attempt).update(host=host))
        except OwnerUnknown:
            logger.warning("Run %s: attempt %s's host was not recorded (the database is unreachable).", self.run_id, self.fence.attempt)

    # -- what the body uses ----------------------------------------------------------------------

    def hide(self, values: list[str]) -> None:
        """Values (keys, tokens) the run's viewers must never read: redacted from its log and errors."""
        self._hidden = list(values)

    def redact(self, text: str) -> str:
        return redact(text, self._hidden)

    def start_uploads(self) -> RunUploader | None:
        """With a shared artifact store: fetch what earlier attempts stored, and store what this one
        saves, each upload after ``may_write``. None without a store."""
        self.uploader = artifacts.start_uploads(self.run, Path(self.run_path), may_write=self.fence.may_write,
                                                kept=self.aliased_steps)
        return self.uploader

    def this_attempts(self):
        """The run's row while this attempt holds it (an update through it changes nothing otherwise)."""
        return Run.objects.filter(pk=self.run.pk, attempts=self.run.attempts, status=Run.Status.RUNNING)

    def trainer_hooks(self) -> dict[str, Any]:
        """The ``AgentTrainer`` arguments through which the attempt holds the library: its stop
        check, its fence on every file (checkpoints, the final model: written in the attempt's own
        folder, published into the run's under ``Fence.holding``), and what a full disk does
        (``RUN_ON_FULL_DISK``)."""
        return {"should_stop": self.should_stop, "may_write": self.fence.may_write,
                "attempt": self.run.attempts, "write_fence": self.fence.holding, "kept_checkpoints": self.aliased_steps,
                "on_full_disk": "pause" if settings.RUN_ON_FULL_DISK == "pause" else "fail"}

    def aliased_steps(self) -> set[int]:
        """The steps of this run's checkpoints that a project alias names: the rotation keeps them."""
        return set(CheckpointAlias.objects.filter(run_id=self.run_id).values_list("step", flat=True))

    def train(self, trainer) -> None:
        """Train; how it ended is recorded on exit."""
        trainer.train_processor.full_disk_check_seconds = settings.RUN_FULL_DISK_CHECK_SECONDS
        self.training = True
        self.result = trainer.train()

    # -- the one end -----------------------------------------------------------------------------

    def _end(self, exc: BaseException | None) -> str:
        if self.fence.lost or isinstance(exc, RunSuperseded):
            return self._superseded()
        stop = self.should_stop
        if exc is not None:
            if not self.training and database_unreachable(exc):
                # Not the run's fault, nor a lost attempt: the next attempt starts once the database is back.
                return self._requeue(f"The database was unreachable while the run started ({exc.__class__.__name__}).",
                                     store_seconds=0)
            training_logger.error("Run %s failed: %s", self.run.pk, exc)
            if isinstance(exc, Exception) and stop.pause_reason and not stop.cancelled:
                # Stopping to be resumed went wrong: count it as a lost attempt (a limited number are retried).
                return self._recover(f"{stop.pause_reason[:-1]}, and stopping raised {exc.__class__.__name__}: {exc}.")
            status = with_database(self.run.stopped_status, "read why the run stopped") if stop.cancelled else Run.Status.FAILED
            # The library's own outcome failures carry their cause and the user code's traceback.
            error = self.redact(getattr(exc, "summary", None) or f"{exc.__class__.__name__}: {exc}")
            trace = self.redact(getattr(exc, "user_traceback", None) or "".join(traceback.format_exception(exc)))
            return self._finish_failed(status, error, trace)
        steps = int(getattr(self.result, "steps", 0) or 0)
        if stop.pause_reason and not stop.cancelled:
            # The checkpoint it stopped with is what the next attempt, on any worker, resumes from.
            reason = f"{stop.pause_reason[0].upper()}{stop.pause_reason[1:-1]}; stopped after step {steps} with a checkpoint."
            return self._requeue(reason, store_seconds=settings.RUN_SHUTDOWN_GRACE_SECONDS / 2)
        return self._finish()

    def _superseded(self) -> str:
        self.fence.superseded()
        self.recorder.abandon()
        # Whoever took the run over ended this attempt's row (the sweep: lost); if nobody did, it was superseded.
        with_database(lambda: RunAttempt.end(self.run_id, self.fence.attempt, RunAttempt.Cause.SUPERSEDED,
                                             "Another attempt holds the run, or it ended."), "record the attempt's end")
        return with_database(lambda: Run.objects.get(pk=self.run.pk).status, "read the run's status")

    def _requeue(self, reason: str, store_seconds: float) -> str:
        self._store_what_is_left(store_seconds)
        self.recorder.close()
        return with_database(lambda: requeue_or_recover(self.run, reason), "re-queue the run")

    def _recover(self, reason: str) -> str:
        self._store_what_is_left(30)
        self.recorder.close()
        return with_database(lambda: self.run.recover(reason) or self.run.status, "re-queue the run")

    def _finish_failed(self, status: str, error: str, trace: str = "") -> str:
        self._store_what_is_left(30)
        self.recorder.close()

        def finish() -> str:
            self.run.finish(status, error=error, traceback=trace)
            return Run.objects.get(pk=self.run.pk).status

        return with_database(finish, "record the run's end")

    def _finish(self) -> str:
        result = self.result
        stopped = bool(getattr(result, "stopped", False)) or self.should_stop.cancelled
        steps = int(getattr(result, "steps", 0) or 0)
        checkpoint = str(getattr(result, "checkpoint", None) or "")
        if self.uploader is not None:  # never succeeded before its final model is stored
            if not self.fence.may_write():
                return self._superseded()
            try:
                artifacts.finish_uploads(self.uploader, self.run, Path(self.run_path), checkpoint, settings.ARTIFACTS_FINISH_SECONDS)
            except ArtifactStoreError as exc:
                training_logger.error("Run %s: its files could not be stored: %s", self.run.pk, exc)
                self.uploader = None  # nothing more to store: what it could, it did
                return self._finish_failed(Run.Status.FAILED, f"Trained {steps} step(s), but the final model could not "
                                           f"be stored in the artifact store: {exc}")
        self.recorder.close()
        metrics = {k: v for k, v in (getattr(result, "metrics", None) or {}).items() if _finite(v)}
        warnings = [self.redact(str(w)) for w in getattr(result, "warnings", None) or []]
        training_logger.info("Run %s %s after %d step(s).", self.run.pk, "stopped (cancelled)" if stopped else "finished", steps)
        return with_database(lambda: record_end(self.run, stopped, steps, metrics, checkpoint, warnings), "record the run's end")

    def _store_what_is_left(self, timeout: float) -> None:
        """An attempt that stops early stores what it saved (checkpoints, logs) for the next one, as far
        as the store takes it within ``timeout`` seconds."""
        if self.uploader is None or timeout <= 0:
            return
        try:
            artifacts.finish_uploads(self.uploader, self.run, Path(self.run_path), None, timeout)
        except ArtifactStoreError as exc:
            training_logger.warning("Run %s: not everything it saved could be stored: %s", self.run.pk, exc)


def record_end(run: Run, cancelled: bool, steps: int, metrics: dict, checkpoint: str, warnings: list[str] | None = None) -> str:
    """Record how an attempt that ended by itself (or was cancelled) ended. Returns the run's status."""
    if checkpoint:
        with transaction.atomic():  # the checkpoint row only while this attempt holds the run
            try:
                lock_for_attempt(run.pk, run.attempts)
            except AttemptSuperseded:
                return Run.objects.get(pk=run.pk).status
            Checkpoint.objects.update_or_create(run=run, step=steps, defaults={"path": checkpoint})
    # The end itself is fenced by its own filtered update (this attempt, still running), outside
    # the lock's transaction: its status is pushed to the run's viewers as it changes, and a page
    # told "succeeded" before the commit would read the row still running.
    status = run.stopped_status() if cancelled else Run.Status.SUCCEEDED
    fields = {"final_metrics": metrics, "checkpoint": checkpoint}
    if status == Run.Status.SUCCEEDED and not steps:  # never a success without a trained step
        fields["error"] = f"The {run.backend.processor} backend ended after 0 training steps; nothing was learned."
        status = Run.Status.FAILED
    if status == Run.Status.SUCCEEDED:  # a success that learnt nothing says so (a stopped run is not judged)
        fields["warnings"] = warnings or []
    if steps:
        fields["steps"] = max(steps, Run.objects.get(pk=run.pk).steps)
    if not run.finish(status, **fields):
        return Run.objects.get(pk=run.pk).status
    return status


def remove_ended_attempt_folders(runs_dir: str | Path | None = None) -> list[Path]:
    """Remove the folders (``<run>/attempts/<n>``) of ended attempts whose writer is gone, under
    ``runs_dir`` (default RUNS_DIR, this machine's run folders). An attempt has ended when its run
    has (succeeded, failed, cancelled, pruned) or a later attempt was claimed (it was superseded, or
    re-queued); its writer is gone when ``workers.processes.writer_gone`` says that no process of
    its session can run any more: a writer on another machine, or still alive (frozen), keeps its
    folder until a worker of its own machine finds it gone. What such a folder holds was never
    published (what was is in the run's folder, hard-linked, untouched by this), or is a copy of
    what was: an unpublished or superseded checkpoint, a staging folder, verl's metrics file and
    rollout dumps. A folder that the run's row names (its ``checkpoint``, a checkpoint row) is
    kept. Returns the folders removed. Called by each worker's housekeeping thread."""
    root = Path(runs_dir if runs_dir is not None else settings.RUNS_DIR)
    found: dict[int, tuple[str, Path]] = {}
    try:
        for attempts in root.glob("*/attempts"):
            match = RUN_FOLDER.match(attempts.parent.name)
            if match and attempts.is_dir():
                found[int(match[1])] = (match[2], attempts)
    except OSError:
        return []
    if not found:
        return []
    named: dict[int, list[str]] = {}
    for run_id, path in Checkpoint.objects.filter(run_id__in=found).values_list("run_id", "path"):
        named.setdefault(run_id, []).append(path)
    removed = []
    for run_id, uid, status, current, checkpoint in Run.objects.filter(pk__in=found).values_list(
            "pk", "uid", "status", "attempts", "checkpoint"):
        uid_hex, attempts = found[run_id]
        if uid.hex != uid_hex:
            continue
        names = [Path(path).resolve() for path in [checkpoint, *named.get(run_id, [])] if path]
        for folder in sorted(attempts.iterdir()):
            if not folder.name.isdigit() or not (status in Run.FINAL or int(folder.name) < current):
                continue
            if any(name.is_relative_to(folder.resolve()) for name in names) or not writer_gone(folder):
                continue
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
                logger.info("Run %s: removed the folder of its ended attempt %s (%s).", run_id, folder.name, folder)
        try:
            attempts.rmdir()  # once the last is gone
        except OSError:
            pass
    return removed


def database_unreachable(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, DatabaseError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
