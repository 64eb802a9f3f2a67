"""Executing a run: the plain functions behind the Celery task.

``execute_run`` (in the Celery worker process) claims the run, starting its next attempt, starts
``train_run`` in a child process of its own session (``workers.processes``), heartbeats, watches
for a cancel, and kills the child's processes when a cancelled run does not stop at its next step.
``train_run`` (in the child) builds the ``AgentTrainer`` from the row and trains it inside the
attempt's lifecycle (``workers.lifecycle.Attempt``), which records what it reports and its end.
Both are callable directly in tests.

Nothing here gives a run up lightly. A run is ``cancelled`` only when a person cancelled it. When
the worker shuts down (SIGTERM: a deploy) or the supervising worker process disappears, the
training process saves a checkpoint at its next step and queues the run again; the next attempt
resumes from that checkpoint in the run's own folder. While the database is down both processes
keep going: reports are buffered (``webapp.runs.batching``) and row changes retried until it is back.
"""

from __future__ import annotations

import logging
import signal
import time
import traceback as traceback_module
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone

from training.platform.artifacts import CheckpointUploadSink
from training.platform.probe import check_platform_keys
from training.trainer import AgentTrainer
from webapp.dashboard.recording import DashboardSink, EpisodeDrain
from webapp.integrations.tracking import prepare_run
from webapp.policy.checks import check_spec, load_training_plugins, private_values
from webapp.registry.models import Backend
from webapp.runs import artifacts
from webapp.runs.models import Run, RunLog
from webapp.runs.recording import DatabaseSink
from webapp.runs.trainer_args import attempt_kwargs
from workers.lifecycle import Attempt, requeue_or_recover, with_database
from workers.processes import Child, kill_session, start_child, tail, terminate_session
from workers.releases import release_in_background

logger = logging.getLogger(__name__)

# The Celery task that executes a run (``workers.tasks``), sent by name by the dispatcher.
EXECUTE_RUN = "workers.execute_run"
# What execute_run reports back to the task.
SKIPPED, BUSY = "skipped", "busy"
POLL_SECONDS = 0.5
# A run whose backend is at max_concurrent_runs is sent again this much later.
BUSY_RETRY_SECONDS = 30
# The training process's exit code when it stopped to be resumed by a later attempt.
EXIT_REQUEUED = 75
# The training process's flag: its supervisor (``_supervise``) stores the episodes it spools.
DRAINED = "--episodes-drained"


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
    claimed = with_database(claiming, "claim the run")
    if not isinstance(claimed, Run):
        return claimed
    run = claimed
    run_path = Path(run.run_path)
    run_path.mkdir(parents=True, exist_ok=True)
    output_path = run_path / "process.log"
    limit = run.backend.max_attempts
    resuming = f" (attempt {run.attempts} of {limit}, resuming from its last checkpoint)" if run.attempts > 1 else ""
    try:
        needs_gpu = run.backend.needs_gpu
        with open(output_path, "ab") as output:
            process = start_child("workers.child", str(run.pk), DRAINED, output=output, uses_gpu=needs_gpu)
    except Exception as exc:
        run.finish(Run.Status.FAILED, error=f"Could not start the training process: {exc}", traceback=traceback_module.format_exc())
        return Run.Status.FAILED
    try:
        with_database(lambda: _log(run, "INFO", f"Claimed by {worker_name}{resuming}; its training process {process.started}."),
                      "log the claim")
    except DatabaseError:  # the line is lost, not the run: its supervision rides out the outage
        logger.warning("Run %s: the claim could not be logged; the database is away.", run.pk)
    return _supervise(run, process, output_path)


def _supervise(run: Run, process: Child, output_path: Path) -> str:
    # The episode store's records the training process spools are stored from here, off its interpreter.
    drain = EpisodeDrain(run.pk, run.folder(), run.attempts)
    try:
        return _watch(run, process, output_path, drain)
    finally:
        drain.stop()


def _watch(run: Run, process: Child, output_path: Path, drain: EpisodeDrain) -> str:
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
                    kill_session(process)
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
            terminate_session(process)
            _store_spooled_episodes(run, drain)
            status = run.stopped_status()
            run.finish(status, error=f"{status.capitalize()}; the training process was terminated.")
            return status
    _store_spooled_episodes(run, drain)
    return with_database(lambda: _after_exit(run, process, output_path), "record how the run ended")


def _store_spooled_episodes(run: Run, drain: EpisodeDrain) -> None:
    """What the training process spooled and the drain has not stored yet (it was killed, or ended
    without waiting), stored while this attempt still holds the run."""
    try:
        drain.close()
    except Exception as exc:  # noqa: BLE001 (the store still away: they wait in the spool for a resumed attempt)
        logger.warning("Run %s: episodes spooled by the training process were not stored (%s: %s).",
                       run.pk, type(exc).__name__, exc)


def _given_up(run: Run) -> bool:
    """After a refused heartbeat: True when another attempt (or nobody) holds the run now, False
    when this attempt's training process has just recorded the end itself."""
    current = Run.objects.filter(pk=run.pk).values_list("status", "attempts").first()
    return current is None or not (current[0] in Run.FINAL and current[1] == run.attempts)


def _after_exit(run: Run, process: Child, output_path: Path) -> str:
    close_old_connections()
    attempt = run.attempts
    run.refresh_from_db()
    code = process.returncode
    if run.attempts != attempt or run.is_final or run.status == Run.Status.QUEUED:
        return run.status  # it recorded its end or re-queued itself, or another attempt has the run
    last_words = tail(output_path)
    if run.cancel_requested():
        status = run.stopped_status()
        run.finish(status, error=f"{status.capitalize()}.", traceback=last_words)
        return run.status
    if code == EXIT_REQUEUED:
        return requeue_or_recover(run, "the training process stopped to be resumed.")
    if code < 0:  # killed by a signal (OOM killer, an operator): worth another attempt
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        status = run.recover(f"The training process was killed by {name}.")
        if status in Run.FINAL:  # its last attempt: nothing runs the teardown of what it provisioned
            release_in_background(run)
        return status or run.status
    run.finish(Run.Status.FAILED, error=f"The training process exited with code {code}.", traceback=last_words)
    return run.status


def _log(run: Run, level: str, message: str) -> None:
    RunLog.objects.create(run=run, level=level, message=message)


# -- the training process ------------------------------------------------------------------------

def train_run(run_id: int, on_lost: Callable[[], None] | None = None, episodes_drained: bool = False) -> str:
    """Train a claimed (running) run in this process and record its end. Returns the run's status
    after it: final, or queued when the run stopped to be resumed by a later attempt.

    ``on_lost`` is called once the attempt is found superseded; the training process passes
    ``workers.processes.kill_own_session``. Without it the attempt stops at its next step or file write.
    ``episodes_drained``: the supervising worker process stores the episode store's records
    (``EpisodeDrain`` in ``_supervise``); this process only spools them."""
    with Attempt(run_id, on_lost) as attempt:
        run, run_path = attempt.run, attempt.run_path
        load_training_plugins()
        kwargs = attempt_kwargs(run, run_path)  # the spec the run was validated with, revocations checked again
        attempt.hide(private_values(kwargs))  # what the run's viewers read
        uploader = attempt.start_uploads()  # a shared store: what earlier attempts stored
        artifacts.fetch_trained_model(run.model)  # a model another run trained, from the store
        dashboard = attempt.fence.guard(DashboardSink(run.pk, spool_dir=run_path, attempt=run.attempts,
                                                         episodes_drained=episodes_drained))
        sinks = [dashboard]
        try:  # the trainer closes its sinks when it trains; one that is never built must close them here
            sinks = [DatabaseSink(attempt.recorder), dashboard, *prepare_run(run, kwargs)]  # the project's trackers, alerts
            if uploader is not None:
                sinks.append(CheckpointUploadSink(uploader))
                # The backend's own rotation could delete a checkpoint before it is stored; the store keeps
                # the project's number and the uploader clears stored ones from the scratch folder.
                kwargs["config"]["trainer.max_checkpoints"] = 0
            trainer = AgentTrainer(**kwargs, sinks=sinks, **attempt.trainer_hooks())
            if uploader is not None:  # the store keeps the run's best checkpoints by the backend's own rule
                uploader.best = getattr(trainer.train_processor, "best_checkpoint_steps", None)
            spec = check_spec(kwargs, run.config_overrides)  # what the form checked, checked again where it runs
            check_platform_keys(trainer, spec["pinned"], spec["user_keys"])
            if hasattr(trainer.train_processor, "remote_ids_callback"):  # remote backends: show job/deployment ids as they appear
                trainer.train_processor.remote_ids_callback = lambda ids: attempt.this_attempts().update(remote_ids=ids)
            attempt.this_attempts().update(final_config=recorded_config(trainer))
            logging.getLogger("training").info("Run %s: training on backend %s in %s (attempt %s)",
                                               run.pk, trainer.train_engine_name, run_path, run.attempts)
        except BaseException:
            close_unused(sinks)
            raise
        attempt.train(trainer)
    return attempt.status


def close_unused(sinks: list[Any]) -> None:
    """Close the sinks of a trainer that was never built (their flush threads would outlive the attempt)."""
    for sink in sinks:
        try:
            sink.close()
        except Exception:  # noqa: BLE001 - the attempt's own error is the one to report
            logging.getLogger("training").warning("Closing %s failed.", type(sink).__name__, exc_info=True)


def recorded_config(trainer: Any) -> dict[str, Any] | None:
    """The config the trainer resolved, as the run page shows it: with the settings it said change
    nothing on the backend (``ignored_keys``: key -> value and why), as the run's config.yaml has them."""
    final_config = trainer.final_config
    if not hasattr(final_config, "to_dict"):  # a processor registered by a user may return its own type
        return None
    recorded = final_config.to_dict()
    ignored = getattr(trainer.train_processor, "ignored_keys", None)
    if ignored:
        recorded["ignored_keys"] = ignored
    return recorded
