"""Writing reports in batches from a background thread, so training never waits on the database."""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)


class BackgroundFlusher:
    """Calls ``flush()`` every ``flush_seconds`` on its own thread, with its own database
    connection, until ``close()``. A failed flush is logged and retried at the next tick: a
    database hiccup must not end a training run. Producers append to buffers under ``_lock``."""

    def __init__(self, name: str, flush_seconds: float) -> None:
        self.flush_seconds = flush_seconds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flush_loop, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def flush(self) -> object:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the thread and write what is left (from the calling thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.flush()

    def _flush_loop(self) -> None:
        try:
            while not self._stop.wait(self.flush_seconds):
                try:
                    self.flush()
                except Exception:
                    logger.exception("%s: writing a batch failed; retrying at the next tick", self._thread.name)
                    close_old_connections()
        finally:
            connection.close()
