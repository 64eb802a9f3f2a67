"""Where a run's log lines land: written to the database in batches. (Its metric points go to the
metric store through ``webapp.dashboard.recording.DashboardSink``.)

The training thread (and the library's episode threads) only append to buffers; one flusher
thread writes them every ``flush_seconds`` with its own database connection, so training never
waits on the database. Each stored batch is announced with ``run_logs_written``, which the
dashboard pushes to the run's live viewers.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from webapp.runs.batching import BackgroundFlusher
from webapp.runs.models import Run, RunLog, lock_for_attempt, run_logs_written


class RunRecorder(BackgroundFlusher):
    """Buffers log lines of one run and writes them in batches (``start()`` the background writer,
    or call ``flush()``). While the database is down they stay buffered and are written when it is
    back; with ``spool_dir`` (the run's folder) they wait on disk instead (``webapp.runs.batching``).
    Each log line has a uid, so a line written twice is stored once."""

    spool_kind = "records"

    def __init__(self, run_id: int, flush_seconds: float = 1.0, max_log_lines: int | None = None,
                 spool_dir: str | Path | None = None, attempt: int | None = None) -> None:
        super().__init__(f"run-{run_id}-recorder", flush_seconds, spool_dir, attempt)
        self.run_id = run_id
        self.attempt = attempt  # the fencing token: lines of an attempt that no longer holds the run are refused
        self.max_log_lines = max_log_lines or settings.RUN_LOG_MAX_LINES
        self._logs: list[RunLog] = []
        self._log_count = RunLog.objects.filter(run_id=run_id).count()
        self._dropped = 0
        self._dropped_taken = 0  # in the batch being written: counted again should it fail

    # -- producers (any thread) --------------------------------------------------------------
    def add_log(self, level: str, message: str) -> None:
        with self._lock:
            if self._log_count >= self.max_log_lines:
                return
            self._log_count += 1
            if self._log_count == self.max_log_lines:
                level, message = "WARNING", f"Log truncated at {self.max_log_lines} lines; the full log is in the run directory."
            self._add_log_line(RunLog(uid=uuid.uuid4(), run_id=self.run_id, level=level, message=message, time=timezone.now()))

    def _add_log_line(self, line: RunLog) -> None:
        """(under ``_lock``)"""
        if self.spooled({"log": [str(line.uid), line.time.isoformat(), line.level, line.message]}):
            self._logs.append(line)
        else:
            self._dropped += 1  # the spool is full: keep the disk bounded

    # -- the writer ---------------------------------------------------------------------------
    def take(self):
        logs, self._logs = self._logs, []
        self._dropped_taken, self._dropped = self._dropped, 0
        if self._dropped_taken:
            # Not spooled (the spool is what refused them): written with this batch, else made again with the next.
            why = (self.spool.refused_because if self.spool is not None and self.spool.refused_because.startswith("the spool's disk")
                   else f"the database was unreachable for longer than {settings.RUN_SPOOL_MAX_MB} MB of spool on disk lasts")
            logs.append(RunLog(uid=uuid.uuid4(), run_id=self.run_id, level="ERROR", time=timezone.now(),
                               message=f"{self._dropped_taken} log line(s) were dropped: {why}."))
        return logs

    def keep_unspooled(self, batch) -> None:
        self._dropped += self._dropped_taken

    def batch_from_records(self, records: list) -> list:
        # Metric points in segments left by older versions are in the dashboard's spool too.
        return [RunLog(uid=uid, run_id=self.run_id, level=level, message=message, time=datetime.fromisoformat(time))
                for uid, time, level, message in (record["log"] for record in records if "log" in record)]

    def restore(self, batch) -> None:
        self._logs = batch + self._logs

    def write(self, batch) -> None:
        logs = batch
        if logs:
            with transaction.atomic():
                lock_for_attempt(self.run_id, self.attempt)
                # A line already stored (a spooled batch written again) is left as it is.
                RunLog.objects.bulk_create(logs, update_conflicts=True, unique_fields=["uid"], update_fields=["uid"])
            run_logs_written.send(RunRecorder, run_id=self.run_id, lines=[
                {"id": line.pk, "time": line.time.isoformat(), "level": line.level, "message": line.message} for line in logs
            ])


class DatabaseSink:
    """A ``training.tracking.sinks.MetricSink`` that writes the run's log lines when the run ends. Metric
    points are stored once, by ``webapp.dashboard.recording.DashboardSink``."""

    def __init__(self, recorder: RunRecorder) -> None:
        self.recorder = recorder

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        pass  # DashboardSink stores them

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass  # webapp.dashboard.recording.DashboardSink stores them for the episode viewer

    def log_optimizer_state(self, record: dict[str, Any]) -> None:
        """What a fork carried of its parent checkpoint's optimizer state, on the run's row while this
        attempt holds it (``forks.optimizer_note`` words it). Once, as training begins: a database away
        then costs the record (the note says it was not reported), never the run."""
        rows = Run.objects.filter(pk=self.recorder.run_id, status=Run.Status.RUNNING)
        if self.recorder.attempt is not None:
            rows = rows.filter(attempts=self.recorder.attempt)
        try:
            rows.update(optimizer_state={"carried": bool(record.get("carried")), "why": str(record.get("why") or "")[:1000]})
        except DatabaseError as exc:
            logging.getLogger("training").warning("Run %s: what the fork carried of its optimizer state was not recorded "
                                                  "(%s).", self.recorder.run_id, exc.__class__.__name__)

    def close(self) -> None:
        self.recorder.flush()


class RunLogHandler(logging.Handler):
    """Sends log records (of the ``training`` logger) to the run's log lines, through ``redact``
    (the registry's arguments taken out: ``policy.checks.redact``) once the run's are known."""

    def __init__(self, recorder: RunRecorder, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.recorder = recorder
        self.redact: Callable[[str], str] = lambda text: text

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self.recorder.add_log(record.levelname, self.redact(message))
        except Exception:
            self.handleError(record)
