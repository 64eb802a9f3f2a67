"""Writing reports in batches from a background thread, so training never waits on the database.

A batch that cannot be written (the database is down) goes back into the buffers and is written
with the next one when the database answers again, so an outage loses nothing and training goes
on. Every write is an upsert keyed by (run, key, step) or (run, step, position), so a batch
written twice (its commit went through but the answer was lost) is still stored once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)


class BackgroundFlusher:
    """Calls ``flush()`` every ``flush_seconds`` on its own thread, with its own database
    connection, until ``close()``. Producers append to buffers under ``_lock``; subclasses say how
    a batch is taken from them (``take``), stored (``write``) and put back after a failure (``restore``)."""

    def __init__(self, name: str, flush_seconds: float) -> None:
        self.flush_seconds = flush_seconds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flush_loop, name=name, daemon=True)
        self._failing_since: float | None = None

    def start(self):
        self._thread.start()
        return self

    # -- what subclasses define ----------------------------------------------------------------
    def take(self) -> Any:
        """Empty the buffers (under ``_lock``) and return their contents as one batch."""
        raise NotImplementedError

    def write(self, batch: Any) -> Any:
        raise NotImplementedError

    def restore(self, batch: Any) -> None:
        """Put a batch that could not be written back in front of what arrived since (under ``_lock``)."""
        raise NotImplementedError

    # -- the writer ------------------------------------------------------------------------------
    def flush(self) -> Any:
        """Write what is buffered. On failure the batch is kept for the next try and the error raised."""
        with self._lock:
            batch = self.take()
        try:
            result = self.write(batch)
        except BaseException:
            with self._lock:
                self.restore(batch)
            raise
        if self._failing_since is not None:
            logger.warning("%s: the database is back; buffered reports written after %.0f s.",
                           self._thread.name, time.monotonic() - self._failing_since)
            self._failing_since = None
        return result

    def close(self) -> None:
        """Stop the thread and write what is left (from the calling thread), retrying for up to
        ``RUN_DATABASE_RETRY_SECONDS`` while the database is down."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        deadline = time.monotonic() + settings.RUN_DATABASE_RETRY_SECONDS
        delay = 0.5
        while True:
            try:
                self.flush()
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise
                self._note_failure(exc)
                close_old_connections()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _note_failure(self, exc: Exception) -> None:
        if self._failing_since is None:  # one warning per outage, not one traceback per tick
            self._failing_since = time.monotonic()
            logger.warning("%s: writing a batch failed (%s: %s); keeping it and retrying.",
                           self._thread.name, exc.__class__.__name__, exc)

    def _flush_loop(self) -> None:
        try:
            while not self._stop.wait(self.flush_seconds):
                try:
                    self.flush()
                except Exception as exc:
                    self._note_failure(exc)
                    close_old_connections()
        finally:
            connection.close()
