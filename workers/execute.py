"""Executing a run: the plain functions behind the Celery task.

``execute_run`` (in the Celery worker process) claims the run, starting its next attempt, starts
``train_run`` in a child process of its own process group, heartbeats, watches for a cancel, and
kills the group when a cancelled run does not stop at its next step. ``train_run`` (in the child)
builds the ``AgentTrainer`` from the row and records what it reports. Both are callable directly
in tests.

Nothing here gives a run up lightly. A run is ``cancelled`` only when a person cancelled it. When
the worker shuts down (SIGTERM: a deploy) or the supervising worker process disappears, the
training process saves a checkpoint at its next step and queues the run again; the next attempt
resumes from that checkpoint in the run's own folder. While the database is down both processes
keep going: reports are buffered (``webapp.batching``) and row changes retried until it is back.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback as traceback_module
from datetime import timedelta
from pathlib import Path
from typing import Callable, TypeVar

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from training.platform.artifacts import CheckpointUploadSink

from training.errors import ArtifactStoreError, RunSuperseded
from webapp.dashboard.recording import DashboardSink
from webapp.integrations.tracking import prepare_run
from webapp.registry.models import Backend
from webapp.runs.models import AttemptSuperseded, Run, RunLog, lock_for_attempt
from webapp.policy.checks import check_spec, load_training_plugins, private_values, redact
from webapp.runs.trainer_args import attempt_kwargs
from webapp.runs.recording import DatabaseSink, RunLogHandler, RunRecorder
from webapp.runs import artifacts

logger = logging.getLogger(__name__)

# What execute_run reports back to the task.
SKIPPED, BUSY = "skipped", "busy"
POLL_SECONDS = 0.5
# How often the training process checks the database for a cancel (the library polls once per step).
CANCEL_CHECK_SECONDS = 1.0
# A run whose backend is at max_concurrent_runs is sent again this much later.
BUSY_RETRY_SECONDS = 30
# The training process's exit code when it stopped to be resumed by a later attempt.
EXIT_REQUEUED = 75

T = TypeVar("T")


def claim(run_id: int, worker_name: str, retried: bool = False) -> str | Run:
    """Claim a queued run, respecting its backend's ``max_concurrent_runs``.

    Returns the claimed Run, SKIPPED (not queued any more: cancelled, or another worker has it)
    or BUSY (the backend is at its limit: the dispatcher sends it again in BUSY_RETRY_SECONDS).
    ``retried``: an earlier try failed with the database unreachable, perhaps after its claim went
    through; a run running for this worker is then this claim's.
    """
    with transaction.atomic():
        run = Run.objects.select_related("backend").filter(pk=run_id).first()
        if retried and run is not None and run.status == Run.Status.RUNNING and run.worker == worker_name:
            return _with_folder(run)
        if run is None or run.status != Run.Status.QUEUED:
            return SKIPPED
        # Lock the backend row so two workers cannot both take its last free slot.
        backend = Backend.objects.select_for_update().get(pk=run.backend_id)
        if not backend.has_capacity():
            later = timezone.now() + timedelta(seconds=BUSY_RETRY_SECONDS)
            Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED).update(dispatch_at=later)
            return BUSY
        if not run.claim(worker_name):
            return SKIPPED
    return _with_folder(run)


def _with_folder(run: Run) -> Run:
    # A resumed attempt gets the folder (and checkpoints) of the first; with a shared artifact store,
    # a scratch folder on this worker, filled from the store.
    run.run_path = str(artifacts.scratch_folder(run))
    Run.objects.filter(pk=run.pk).update(run_path=run.run_path)
    return run


def execute_run(run_id: int, worker_name: str) -> str:
    """Claim run ``run_id`` and see this attempt through. Returns the status the run has after it
    (final, or queued when it was re-queued), SKIPPED or BUSY."""
    tries = 0

    def claiming() -> str | Run:
        nonlocal tries
        tries += 1
        return claim(run_id, worker_name, retried=tries > 1)

    # A database away at the claim delays the run; it neither fails it nor costs it a lost attempt.
    claimed = _with_database(claiming, "claim the run")
    if not isinstance(claimed, Run):
        return claimed
    run = claimed
    run_path = Path(run.run_path)
    run_path.mkdir(parents=True, exist_ok=True)
    output_path = run_path / "process.log"
    limit = run.backend.max_attempts
    resuming = f" (attempt {run.attempts} of {limit}, resuming from its last checkpoint)" if run.attempts > 1 else ""
    try:
        env = _child_env(run)
        process = _take_spare(env)
        how = "the training process started ahead takes it" if process else "starting the training process"
        _with_database(lambda: _log(run, "INFO", f"Claimed by {worker_name}{resuming}; {how}."), "log the claim")
        if process is not None and not _hand_over(process, run.pk, output_path):
            process = None
        if process is None:
            with open(output_path, "ab") as output:
                process = subprocess.Popen(
                    [sys.executable, "-m", "workers.child", str(run.pk)],
                    env=env, stdout=output, stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: a kill reaches every process it starts
                    cwd=settings.BASE_DIR,
                )
    except Exception as exc:
        run.finish(Run.Status.FAILED, error=f"Could not start the training process: {exc}", traceback=traceback_module.format_exc())
        return Run.Status.FAILED
    try:
        return _supervise(run, process, output_path)
    finally:
        start_spare()  # while this worker is idle: the next run (a resumed one too) starts warm


# -- a warm training process ---------------------------------------------------------------------
# Importing torch, transformers and TRL takes a new training process 5-10 s (more on a loaded
# machine). Each worker process keeps one started ahead (``workers.child --wait``): libraries
# imported, waiting on its stdin for a run. A run claimed by this worker takes it; the next spare is
# started only once that run is over, so a worker that runs one run never starts one for nothing.
_spare: tuple[subprocess.Popen, dict[str, str]] | None = None
_keep_spares = False  # set in Celery's pool processes (workers.celery_app), not where runs are executed directly


def keep_spares() -> None:
    """From now on this process keeps a spare training process (when ``RUN_WARM_PROCESS`` is on)."""
    global _keep_spares
    _keep_spares = True
    start_spare()


def start_spare() -> None:
    """Start this worker process's spare training process, unless there is one, the process keeps
    none, or ``RUN_WARM_PROCESS`` is off."""
    global _spare
    if not (_keep_spares and settings.RUN_WARM_PROCESS) or (_spare is not None and _spare[0].poll() is None):
        return
    try:
        env = _child_env(None)
        process = subprocess.Popen(
            [sys.executable, "-m", "workers.child", "--wait"], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=settings.BASE_DIR,
        )
    except Exception:  # noqa: BLE001 (no spare: the next run starts a process of its own)
        logger.warning("Could not start a spare training process.", exc_info=True)
        return
    _spare = (process, env)


def stop_spares() -> None:
    """This process keeps no spare any more, and the one it has is stopped (the pool process is
    exiting: a spare started by the last run's end would otherwise import torch for nothing, an
    orphan, after its worker has gone)."""
    global _keep_spares, _spare
    _keep_spares = False
    spare, _spare = _spare, None
    if spare is not None:
        _terminate_group(spare[0], wait_seconds=1.0)


def _take_spare(env: dict[str, str]) -> subprocess.Popen | None:
    """This worker's spare training process; None when there is none alive or it was started with
    another environment (a run given a GPU, another database)."""
    global _spare
    spare, _spare = _spare, None
    if spare is None:
        return None
    process, spare_env = spare
    if process.poll() is not None or spare_env != env:
        _terminate_group(process, wait_seconds=1.0)
        return None
    return process


def _hand_over(process: subprocess.Popen, run_id: int, output_path: Path) -> bool:
    """Tell a spare to train ``run_id``, writing its output to ``output_path``."""
    try:
        process.stdin.write(f"{run_id} {output_path}\n".encode())
        process.stdin.close()
        return True
    except OSError:
        _terminate_group(process, wait_seconds=1.0)
        return False


def _supervise(run: Run, process: subprocess.Popen, output_path: Path) -> str:
    last_beat = time.monotonic()
    cancel_seen_at: float | None = None
    database_down = False
    while process.poll() is None:
        time.sleep(POLL_SECONDS)
        now = time.monotonic()
        try:
            if now - last_beat >= settings.RUN_HEARTBEAT_SECONDS:
                if not run.heartbeat() and _given_up(run):
                    # Not SIGTERM: that asks for a checkpoint, and this attempt may write nothing more.
                    logger.warning("Run %s: attempt %s was given up on; killing its training process.", run.pk, run.attempts)
                    _kill_group(process)
                    return Run.objects.get(pk=run.pk).status
                last_beat = now
            if cancel_seen_at is None and run.cancel_requested():
                cancel_seen_at = now
                _log(run, "INFO", "Cancel requested; stopping at the next training step.")
            if database_down:
                logger.warning("Run %s: the database is back.", run.pk)
                database_down = False
        except DatabaseError as exc:  # training goes on; heartbeats resume when the database is back
            if not database_down:
                logger.warning("Run %s: the database is unreachable (%s); the run goes on.", run.pk, exc)
            database_down = True
            close_old_connections()
            continue
        if cancel_seen_at is not None and now - cancel_seen_at > settings.RUN_CANCEL_GRACE_SECONDS:
            _log(run, "WARNING", f"The training process did not stop within {settings.RUN_CANCEL_GRACE_SECONDS} s; terminating it.")
            _terminate_group(process)
            status = run.stopped_status()
            run.finish(status, error=f"{status.capitalize()}; the training process was terminated.")
            return status
    return _with_database(lambda: _after_exit(run, process, output_path), "record how the run ended")


def _given_up(run: Run) -> bool:
    """After a refused heartbeat: True when another attempt (or nobody) holds the run now, False
    when this attempt's training process has just recorded the end itself."""
    current = Run.objects.filter(pk=run.pk).values_list("status", "attempts").first()
    return current is None or not (current[0] in Run.FINAL and current[1] == run.attempts)


def _after_exit(run: Run, process: subprocess.Popen, output_path: Path) -> str:
    close_old_connections()
    attempt = run.attempts
    run.refresh_from_db()
    code = process.returncode
    if run.attempts != attempt or run.is_final or run.status == Run.Status.QUEUED:
        return run.status  # it recorded its end or re-queued itself, or another attempt has the run
    tail = _tail(output_path)
    if run.cancel_requested():
        status = run.stopped_status()
        run.finish(status, error=f"{status.capitalize()}.", traceback=tail)
        return run.status
    if code == EXIT_REQUEUED:
        return _requeue_or_recover(run, "the training process stopped to be resumed.")
    if code < 0:  # killed by a signal (OOM killer, an operator): worth another attempt
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        status = run.recover(f"The training process was killed by {name}.")
        if status in Run.FINAL:  # its last attempt: nothing runs the teardown of what it provisioned
            from workers.housekeeping import release_in_background

            release_in_background(run)
        return status or run.status
    run.finish(Run.Status.FAILED, error=f"The training process exited with code {code}.", traceback=tail)
    return run.status


def _requeue_or_recover(run: Run, reason: str) -> str:
    if run.requeue(reason):
        return Run.Status.QUEUED
    run.refresh_from_db()
    return run.status


def _with_database(action: Callable[[], T], what: str) -> T:
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


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    process.wait()


def _terminate_group(process: subprocess.Popen, wait_seconds: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_seconds)
            return
        except subprocess.TimeoutExpired:
            continue


def _child_env(run: Run | None) -> dict[str, str]:
    """The worker's environment, with the database the worker uses and the GPU of this worker slot
    (``run`` None: a spare's, which no GPU run can use)."""
    from django.db import connection

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE", "webapp.settings")
    env["DATABASE_URL"] = database_url(connection.settings_dict)
    env["PYTHONUNBUFFERED"] = "1"
    if run is not None and run.backend.needs_gpu:
        gpu = gpu_for_this_worker()
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def gpu_for_this_worker() -> str | None:
    """One GPU per worker process: child N of ``celery worker -Q gpu --concurrency=<GPUs>`` gets GPU N
    (of ``CUDA_VISIBLE_DEVICES`` when the worker was given a subset)."""
    from billiard.process import current_process

    index = getattr(current_process(), "index", None) or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        from training.utils import cuda_device_count

        devices = [str(i) for i in range(cuda_device_count())]
    return devices[index % len(devices)] if devices else None


def database_url(settings_dict: dict) -> str:
    """A DATABASE_URL for the connection Django uses now (so test databases carry over to children)."""
    engine = settings_dict["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    scheme = {"django.db.backends.postgresql": "postgres", "django.db.backends.mysql": "mysql"}.get(engine)
    if scheme is None:
        raise ValueError(f"Cannot hand database engine {engine} to a training process.")
    from urllib.parse import quote

    auth = quote(settings_dict.get("USER") or "")
    if settings_dict.get("PASSWORD"):
        auth += ":" + quote(settings_dict["PASSWORD"])
    host = settings_dict.get("HOST") or "localhost"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"{scheme}://{auth + '@' if auth else ''}{host}{port}/{settings_dict['NAME']}"


def _tail(path: Path, max_bytes: int = 20000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-max_bytes:].decode("utf-8", "replace")


def _log(run: Run, level: str, message: str) -> None:
    RunLog.objects.create(run=run, level=level, message=message)


# -- the training process ------------------------------------------------------------------------

class _StopCheck:
    """``should_stop`` for the library, and why it said stop.

    A cancel requested in the browser (read at most once a second) stops the run for good. A
    SIGTERM (the worker shuts down) or the loss of the supervising worker process pauses it: it
    stops at the next step with a checkpoint and is queued again. A database that does not answer
    is no reason to stop.
    """

    def __init__(self, run: Run, fence: "_Fence") -> None:
        self.run = run
        self.fence = fence
        self._last = 0.0
        self._parent = os.getppid()
        self.cancelled = False
        self.pause_reason = ""

    def pause(self, reason: str) -> None:
        if not self.pause_reason:
            self.pause_reason = reason
            logging.getLogger("training").warning("Stopping at the next step to be resumed later: %s", reason)

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


class _Fence:
    """The attempt's fencing token in its training process: the attempt number.

    Every write of the run carries it. The metric store and the log writer check it under a lock
    on the run's row in the write's own transaction (``lock_for_attempt``); status changes check it
    in their filtered update; the files the library writes (checkpoints, the final model) ask
    ``may_write`` first. Once the run is found held by another attempt (or ended), the attempt
    stops: ``on_lost`` runs (the training process kills its own process group), so a process paused
    past its takeover writes nothing more when it wakes.
    """

    def __init__(self, run: Run, on_lost: Callable[[], None] | None = None) -> None:
        self.run_id, self.attempt = run.pk, run.attempts
        self.on_lost = on_lost
        self.writers: list = []  # the attempt's report writers: their spooled reports are deleted when it is lost
        self.lost = False
        self._renewed = time.monotonic()

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


def kill_this_attempt() -> None:
    """``on_lost`` of a training process (its own process group): nothing of it runs on."""
    os.killpg(os.getpgrp(), signal.SIGKILL)


def train_run(run_id: int, on_lost: Callable[[], None] | None = None) -> str:
    """Train a claimed (running) run in this process and record its end. Returns the run's status
    after it: final, or queued when the run stopped to be resumed by a later attempt.

    ``on_lost`` is called once the attempt is found superseded (``_Fence``); the training process
    passes ``kill_this_attempt``. Without it the attempt stops at its next step or file write."""
    from training.platform.probe import check_platform_keys
    from training.trainer import AgentTrainer

    # A database away at start-up delays the run (RUN_DATABASE_RETRY_SECONDS at most), never fails it.
    run = _with_database(lambda: Run.objects.select_related("agent", "dataset", "reward", "backend").get(pk=run_id),
                         "load the run")
    if run.status != Run.Status.RUNNING:
        raise ValueError(f"Run {run_id} is {run.status}, not running; claim it first.")
    run_path = str(run.folder())
    fence = _Fence(run, on_lost)
    # Reports are spooled in the run's folder until stored: what a killed attempt reported but did
    # not store, this one writes first, so a step logged before a checkpoint is never lost.
    recorder = _with_database(lambda: RunRecorder(run.pk, spool_dir=run_path, attempt=run.attempts), "count the run's log lines")
    recorder.on_superseded = fence.superseded
    fence.writers.append(recorder)
    recorder.start()
    handler = RunLogHandler(recorder)
    training_logger = logging.getLogger("training")
    training_logger.addHandler(handler)
    if training_logger.getEffectiveLevel() > logging.INFO:
        training_logger.setLevel(logging.INFO)
    should_stop = _StopCheck(run, fence)
    previous_sigterm = signal.signal(signal.SIGTERM, lambda *_: should_stop.pause("the worker is shutting down.")) \
        if threading.current_thread() is threading.main_thread() else None
    uploader = None
    training = False
    try:
        load_training_plugins()
        kwargs = attempt_kwargs(run, run_path)  # the spec the run was validated with, revocations checked again
        hidden = private_values(kwargs)
        handler.redact = lambda text: redact(text, hidden)  # what the run's viewers read
        uploader = artifacts.start_uploads(run, Path(run_path), may_write=fence.may_write)  # a shared store: what earlier attempts stored
        artifacts.fetch_trained_model(run.model)  # a model another run trained, from the store
        dashboard = DashboardSink(run.pk, spool_dir=run_path, attempt=run.attempts)
        dashboard.on_superseded = fence.superseded
        fence.writers.append(dashboard)
        sinks = [DatabaseSink(recorder), dashboard, *prepare_run(run, kwargs)]  # the project's trackers, alerts
        if uploader is not None:
            sinks.append(CheckpointUploadSink(uploader))
            # The backend's own rotation could delete a checkpoint before it is stored; the store keeps
            # the project's number and the uploader clears stored ones from the scratch folder.
            kwargs["config"]["trainer.max_checkpoints"] = 0
        trainer = AgentTrainer(**kwargs, sinks=sinks, should_stop=should_stop, may_write=fence.may_write,
                               on_full_disk="pause" if settings.RUN_ON_FULL_DISK == "pause" else "fail")
        trainer.train_processor.full_disk_check_seconds = settings.RUN_FULL_DISK_CHECK_SECONDS
        spec = check_spec(kwargs, run.config_overrides)  # what the form checked, checked again where it runs
        check_platform_keys(trainer, spec["pinned"], spec["user_keys"])
        if hasattr(trainer.train_processor, "remote_ids_callback"):  # remote backends: show job/deployment ids as they appear
            trainer.train_processor.remote_ids_callback = lambda ids: _this_attempts(run).update(remote_ids=ids)
        final_config = trainer.final_config
        _this_attempts(run).update(final_config=final_config.to_dict() if hasattr(final_config, "to_dict") else None)
        training_logger.info("Run %s: training on backend %s in %s (attempt %s)", run.pk, trainer.train_engine_name, run_path, run.attempts)
        training = True
        result = trainer.train()
    except BaseException as exc:  # also KeyboardInterrupt/SystemExit: the row must not stay running
        if fence.lost or isinstance(exc, RunSuperseded):
            fence.superseded()
            recorder.abandon()
            training_logger.removeHandler(handler)
            return _with_database(lambda: Run.objects.get(pk=run.pk).status, "read the run's status")
        if not training and _database_unreachable(exc):
            # Not the run's fault, nor a lost attempt: the next attempt starts once the database is back.
            recorder.close()
            training_logger.removeHandler(handler)
            reason = f"The database was unreachable while the run started ({exc.__class__.__name__})."
            return _with_database(lambda: _requeue_or_recover(run, reason), "re-queue the run")
        training_logger.error("Run %s failed: %s", run.pk, exc)
        _store_what_is_left(uploader, run, run_path, timeout=30)
        recorder.close()
        training_logger.removeHandler(handler)
        if isinstance(exc, Exception) and should_stop.pause_reason and not should_stop.cancelled:
            # Stopping to be resumed went wrong: count it as a lost attempt (a limited number are retried).
            reason = f"{should_stop.pause_reason[:-1]}, and stopping raised {exc.__class__.__name__}: {exc}."
            return _with_database(lambda: run.recover(reason) or run.status, "re-queue the run")
        status = _with_database(run.stopped_status, "read why the run stopped") if should_stop.cancelled else Run.Status.FAILED
        # The library's own outcome failures carry their cause and the user code's traceback.
        error = handler.redact(getattr(exc, "summary", None) or f"{exc.__class__.__name__}: {exc}")
        trace = handler.redact(getattr(exc, "user_traceback", None) or traceback_module.format_exc())
        _with_database(lambda: run.finish(status, error=error, traceback=trace), "record the run's end")
        if not isinstance(exc, Exception):
            raise
        return status
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)

    if fence.lost:
        recorder.abandon()
        training_logger.removeHandler(handler)
        return _with_database(lambda: Run.objects.get(pk=run.pk).status, "read the run's status")
    stopped = bool(getattr(result, "stopped", False))
    steps = int(getattr(result, "steps", 0) or 0)
    checkpoint = getattr(result, "checkpoint", None) or ""
    if should_stop.pause_reason and not should_stop.cancelled:
        # The checkpoint it stopped with is what the next attempt, on any worker, resumes from.
        _store_what_is_left(uploader, run, run_path, timeout=settings.RUN_SHUTDOWN_GRACE_SECONDS / 2)
        recorder.close()
        training_logger.removeHandler(handler)
        reason = f"{should_stop.pause_reason[0].upper()}{should_stop.pause_reason[1:-1]}; stopped after step {steps} with a checkpoint."
        return _with_database(lambda: _requeue_or_recover(run, reason), "re-queue the run")
    try:  # never succeeded before its final model is stored
        if uploader is not None and not fence.may_write():
            recorder.abandon()
            training_logger.removeHandler(handler)
            return _with_database(lambda: Run.objects.get(pk=run.pk).status, "read the run's status")
        artifacts.finish_uploads(uploader, run, Path(run_path), checkpoint, settings.ARTIFACTS_FINISH_SECONDS)
    except ArtifactStoreError as exc:
        training_logger.error("Run %s: its files could not be stored: %s", run.pk, exc)
        recorder.close()
        training_logger.removeHandler(handler)
        error = f"Trained {steps} step(s), but the final model could not be stored in the artifact store: {exc}"

        def fail() -> str:
            run.finish(Run.Status.FAILED, error=error)
            return Run.objects.get(pk=run.pk).status

        return _with_database(fail, "record the run's end")
    recorder.close()
    training_logger.removeHandler(handler)
    metrics = {k: v for k, v in (getattr(result, "metrics", None) or {}).items() if _finite(v)}
    warnings = [handler.redact(str(w)) for w in getattr(result, "warnings", None) or []]
    training_logger.info("Run %s %s after %d step(s).", run.pk, "stopped (cancelled)" if stopped else "finished", steps)
    return _with_database(lambda: _record_end(run, stopped or should_stop.cancelled, steps, metrics, str(checkpoint), warnings),
                          "record the run's end")


def _store_what_is_left(uploader, run: Run, run_path: str, timeout: float) -> None:
    """An attempt that stops early stores what it saved (checkpoints, logs) for the next one, as far
    as the store takes it within ``timeout`` seconds."""
    if uploader is None:
        return
    try:
        artifacts.finish_uploads(uploader, run, Path(run_path), None, timeout)
    except ArtifactStoreError as exc:
        logging.getLogger("training").warning("Run %s: not everything it saved could be stored: %s", run.pk, exc)


def _record_end(run: Run, cancelled: bool, steps: int, metrics: dict, checkpoint: str, warnings: list[str] | None = None) -> str:
    if checkpoint:
        from webapp.runs.models import Checkpoint

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


def _this_attempts(run: Run):
    """The run's row while this attempt holds it (an update through it changes nothing otherwise)."""
    return Run.objects.filter(pk=run.pk, attempts=run.attempts, status=Run.Status.RUNNING)


def _database_unreachable(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, DatabaseError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
