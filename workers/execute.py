"""Executing a run: the plain functions behind the Celery task.

``execute_run`` (in the Celery worker process) claims the run, starts ``train_run`` in a child
process of its own process group, heartbeats, watches for a cancel, and kills the group when a
cancelled run does not stop at its next step. ``train_run`` (in the child) builds the
``AgentTrainer`` from the row and records what it reports. Both are callable directly in tests.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import traceback as traceback_module
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, transaction

from webapp.dashboard.recording import DashboardSink
from webapp.registry.models import Backend
from webapp.runs.models import Run, RunLog
from webapp.runs.trainer_args import run_trainer_kwargs
from webapp.runs.recording import DatabaseSink, RunLogHandler, RunRecorder

logger = logging.getLogger(__name__)

# What execute_run reports back to the task.
SKIPPED, BUSY = "skipped", "busy"
POLL_SECONDS = 0.5
# How often the training process checks the database for a cancel (the library polls once per step).
CANCEL_CHECK_SECONDS = 1.0


def run_path_for(run_id: int) -> Path:
    return Path(settings.RUNS_DIR) / str(run_id)


def claim(run_id: int, worker_name: str) -> str | Run:
    """Claim a queued run, respecting its backend's ``max_concurrent_runs``.

    Returns the claimed Run, SKIPPED (not queued any more: cancelled, or another worker has it)
    or BUSY (the backend is at its limit; try again later).
    """
    Run.objects.mark_stale_failed()
    with transaction.atomic():
        run = Run.objects.select_related("backend").filter(pk=run_id).first()
        if run is None or run.status != Run.Status.QUEUED:
            return SKIPPED
        # Lock the backend row so two workers cannot both take its last free slot.
        backend = Backend.objects.select_for_update().get(pk=run.backend_id)
        if not backend.has_capacity():
            return BUSY
        if not run.claim(worker_name):
            return SKIPPED
    Run.objects.filter(pk=run.pk).update(run_path=str(run_path_for(run.pk)))
    run.run_path = str(run_path_for(run.pk))
    return run


def execute_run(run_id: int, worker_name: str) -> str:
    """Claim run ``run_id`` and see it through to a final status. Returns that status, SKIPPED or BUSY."""
    claimed = claim(run_id, worker_name)
    if not isinstance(claimed, Run):
        return claimed
    run = claimed
    run_path = Path(run.run_path)
    run_path.mkdir(parents=True, exist_ok=True)
    output_path = run_path / "process.log"
    _log(run, "INFO", f"Claimed by {worker_name}; starting the training process.")
    try:
        with open(output_path, "ab") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "workers.child", str(run.pk)],
                env=_child_env(run), stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a kill reaches every process it starts
                cwd=settings.BASE_DIR,
            )
    except Exception as exc:
        run.finish(Run.Status.FAILED, error=f"Could not start the training process: {exc}", traceback=traceback_module.format_exc())
        return Run.Status.FAILED
    return _supervise(run, process, output_path)


def _supervise(run: Run, process: subprocess.Popen, output_path: Path) -> str:
    last_beat = time.monotonic()
    cancel_seen_at: float | None = None
    while process.poll() is None:
        time.sleep(POLL_SECONDS)
        now = time.monotonic()
        if now - last_beat >= settings.RUN_HEARTBEAT_SECONDS:
            run.heartbeat()
            last_beat = now
        if cancel_seen_at is None and run.cancel_requested():
            cancel_seen_at = now
            _log(run, "INFO", "Cancel requested; stopping at the next training step.")
        if cancel_seen_at is not None and now - cancel_seen_at > settings.RUN_CANCEL_GRACE_SECONDS:
            _log(run, "WARNING", f"The training process did not stop within {settings.RUN_CANCEL_GRACE_SECONDS} s; terminating it.")
            _terminate_group(process)
            run.finish(Run.Status.CANCELLED, error="Cancelled; the training process was terminated.")
            return Run.Status.CANCELLED
    close_old_connections()
    run.refresh_from_db()
    if not run.is_final:  # the process died before recording an end (crash, OOM kill, signal)
        tail = _tail(output_path)
        if run.cancel_requested():
            run.finish(Run.Status.CANCELLED, error="Cancelled.", traceback=tail)
        else:
            run.finish(Run.Status.FAILED, error=f"The training process exited with code {process.returncode}.", traceback=tail)
    return run.status


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


def _child_env(run: Run) -> dict[str, str]:
    """The worker's environment, with the database the worker uses and the GPU of this worker slot."""
    from django.db import connection

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE", "webapp.settings")
    env["DATABASE_URL"] = database_url(connection.settings_dict)
    env["PYTHONUNBUFFERED"] = "1"
    if run.backend.needs_gpu:
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

class _CancelCheck:
    """``should_stop`` for the library: a cancel requested in the browser, read at most once a second.

    Also stops when the supervising worker process is gone (a worker shut down hard): nobody would
    heartbeat or watch this run any more.
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        self._last = 0.0
        self._cancelled = False
        self._parent = os.getppid()

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._cancelled and now - self._last >= CANCEL_CHECK_SECONDS:
            self._last = now
            self._cancelled = self.run.cancel_requested()
            if not self._cancelled and os.getppid() != self._parent:
                logging.getLogger("training").warning("The worker process is gone; stopping this run.")
                self.run.request_cancel()
                self._cancelled = True
        return self._cancelled


def train_run(run_id: int) -> str:
    """Train a claimed (running) run in this process and record its end. Returns the final status."""
    from training.trainer import AgentTrainer

    run = Run.objects.select_related("agent", "dataset", "reward", "backend").get(pk=run_id)
    if run.status != Run.Status.RUNNING:
        raise ValueError(f"Run {run_id} is {run.status}, not running; claim it first.")
    run_path = run.run_path or str(run_path_for(run.pk))
    recorder = RunRecorder(run.pk).start()
    handler = RunLogHandler(recorder)
    training_logger = logging.getLogger("training")
    training_logger.addHandler(handler)
    if training_logger.getEffectiveLevel() > logging.INFO:
        training_logger.setLevel(logging.INFO)
    should_stop = _CancelCheck(run)
    try:
        sinks = [DatabaseSink(recorder), DashboardSink(run.pk)]
        trainer = AgentTrainer(**run_trainer_kwargs(run, run_path), sinks=sinks, should_stop=should_stop)
        if hasattr(trainer.train_processor, "remote_ids_callback"):  # remote backends: show job/deployment ids as they appear
            trainer.train_processor.remote_ids_callback = lambda ids: Run.objects.filter(pk=run.pk).update(remote_ids=ids)
        final_config = trainer.final_config
        Run.objects.filter(pk=run.pk).update(final_config=final_config.to_dict() if hasattr(final_config, "to_dict") else None)
        training_logger.info("Run %s: training on backend %s in %s", run.pk, trainer.train_engine_name, run_path)
        result = trainer.train()
    except BaseException as exc:  # also KeyboardInterrupt/SystemExit: the row must not stay running
        training_logger.error("Run %s failed: %s", run.pk, exc)
        recorder.close()
        training_logger.removeHandler(handler)
        status = Run.Status.CANCELLED if should_stop._cancelled else Run.Status.FAILED
        # The library's own outcome failures carry their cause and the user code's traceback.
        error = getattr(exc, "summary", None) or f"{exc.__class__.__name__}: {exc}"
        run.finish(status, error=error, traceback=getattr(exc, "user_traceback", None) or traceback_module.format_exc())
        if not isinstance(exc, Exception):
            raise
        return status

    stopped = bool(getattr(result, "stopped", False))
    metrics = {k: v for k, v in (getattr(result, "metrics", None) or {}).items() if _finite(v)}
    checkpoint = getattr(result, "checkpoint", None) or ""
    steps = int(getattr(result, "steps", 0) or 0)
    training_logger.info("Run %s %s after %d step(s).", run.pk, "stopped (cancelled)" if stopped else "finished", steps)
    recorder.close()
    training_logger.removeHandler(handler)
    if checkpoint:
        from webapp.runs.models import Checkpoint

        Checkpoint.objects.update_or_create(run=run, step=steps, defaults={"path": str(checkpoint)})
    status = Run.Status.CANCELLED if stopped or should_stop._cancelled else Run.Status.SUCCEEDED
    fields = {"final_metrics": metrics, "checkpoint": str(checkpoint)}
    if status == Run.Status.SUCCEEDED and not steps:  # never a success without a trained step
        fields["error"] = f"The {run.backend.processor} backend ended after 0 training steps; nothing was learned."
        status = Run.Status.FAILED
    if steps:
        fields["steps"] = max(steps, Run.objects.get(pk=run.pk).steps)
    run.finish(status, **fields)
    return status


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
