"""Where a run's reports land: metric points and log lines, written to the database in batches.

The training thread (and the library's episode threads) only append to buffers; one flusher
thread writes them every ``flush_seconds`` with its own database connection, so training never
waits on the database.
"""

from __future__ import annotations

import logging
import math
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from webapp.batching import BackgroundFlusher
from webapp.dashboard.live import publish_logs
from webapp.runs.models import MetricPoint, Run, RunLog


class RunRecorder(BackgroundFlusher):
    """Buffers metric points and log lines of one run and writes them in batches (``start()``
    the background writer, or call ``flush()``). While the database is down the buffers grow (up
    to ``RUN_BUFFER_MAX_POINTS`` points) and are written when it is back; with ``spool_dir`` (the
    run's folder) they wait on disk instead (``webapp.batching``). Each log line has a uid, so a
    line written twice is stored once."""

    spool_kind = "records"

    def __init__(self, run_id: int, flush_seconds: float = 1.0, max_log_lines: int | None = None,
                 spool_dir: str | Path | None = None) -> None:
        super().__init__(f"run-{run_id}-recorder", flush_seconds, spool_dir)
        self.run_id = run_id
        self.max_log_lines = max_log_lines or settings.RUN_LOG_MAX_LINES
        self._points: dict[tuple[str, int], MetricPoint] = {}
        self._logs: list[RunLog] = []
        self._log_count = RunLog.objects.filter(run_id=run_id).count()
        self._max_step = 0
        self._dropped = 0

    # -- producers (any thread) --------------------------------------------------------------
    def add_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = timezone.now()
        with self._lock:
            clean_metrics = {
                key: None if value is None or math.isnan(value) or math.isinf(value) else float(value)
                for key, value in metrics.items()
            }
            if not self.spooled({"points": [step, now.isoformat(), clean_metrics]}):
                self._dropped += len(clean_metrics)  # the spool is full: keep the disk bounded
                return
            for key, clean in clean_metrics.items():
                if (key, step) not in self._points and len(self._points) >= settings.RUN_BUFFER_MAX_POINTS:
                    self._dropped += 1  # the database has been down for very long: keep memory bounded
                    continue
                # A re-sent (key, step) replaces the buffered one; the database upserts the rest.
                self._points[(key, step)] = MetricPoint(run_id=self.run_id, key=key, step=step, value=clean, time=now)
            self._max_step = max(self._max_step, step)

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

    # -- the writer ---------------------------------------------------------------------------
    def take(self):
        points, self._points = self._points, {}
        logs, self._logs = self._logs, []
        if self._dropped:
            self._logs = logs
            self._add_log_line(RunLog(uid=uuid.uuid4(), run_id=self.run_id, level="ERROR", time=timezone.now(), message=(
                f"{self._dropped} metric point(s) were dropped: the database was unreachable for longer "
                f"than the buffer lasts ({settings.RUN_BUFFER_MAX_POINTS} points in memory, "
                f"{settings.RUN_SPOOL_MAX_MB} MB on disk).")))
            logs, self._logs = self._logs, []
            self._dropped = 0
        return points, logs, self._max_step

    def batch_from_records(self, records: list) -> tuple:
        points: dict[tuple[str, int], MetricPoint] = {}
        logs: list[RunLog] = []
        for record in records:
            if "points" in record:
                step, time, metrics = record["points"]
                for key, value in metrics.items():
                    points[(key, step)] = MetricPoint(run_id=self.run_id, key=key, step=step, value=value,
                                                      time=datetime.fromisoformat(time))
            elif "log" in record:
                uid, time, level, message = record["log"]
                logs.append(RunLog(uid=uid, run_id=self.run_id, level=level, message=message, time=datetime.fromisoformat(time)))
        return points, logs, max((step for _, step in points), default=0)

    def restore(self, batch) -> None:
        points, logs, _ = batch
        self._points = {**points, **self._points}  # what arrived since is newer
        self._logs = logs + self._logs

    def write(self, batch) -> None:
        points, logs, max_step = batch
        if points:
            MetricPoint.objects.bulk_create(
                list(points.values()), update_conflicts=True, unique_fields=["run", "key", "step"],
                update_fields=["value", "time"],
            )
            Run.objects.filter(pk=self.run_id, steps__lt=max_step).update(steps=max_step)
        if logs:
            # A line already stored (a spooled batch written again) is left as it is.
            RunLog.objects.bulk_create(logs, update_conflicts=True, unique_fields=["uid"], update_fields=["uid"])
            publish_logs(self.run_id, [
                {"id": line.pk, "time": line.time.isoformat(), "level": line.level, "message": line.message} for line in logs
            ])


class DatabaseSink:
    """A ``training.sinks.MetricSink`` that records metrics of a run in the database."""

    def __init__(self, recorder: RunRecorder) -> None:
        self.recorder = recorder

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.recorder.add_metrics(step, metrics)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass  # webapp.dashboard.recording.DashboardSink stores them for the episode viewer

    def close(self) -> None:
        self.recorder.flush()


class RunLogHandler(logging.Handler):
    """Sends log records (of the ``training`` logger) to the run's log lines."""

    def __init__(self, recorder: RunRecorder, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self.recorder.add_log(record.levelname, message)
        except Exception:
            self.handleError(record)
