"""Publishing a run's news to its websocket viewers through the channel layer.

Training threads must never wait on the network, so ``publish`` only queues the event; one
publisher thread per process sends queued events with its own event loop (channels-redis keeps
its connections per loop), merging metric events of one run that queued up while it was busy.

The channel layer may lose a message (channels-redis drops what overflows a group's capacity; a
reconnect or a restart loses what was in flight), so every metric message sent for a run carries
the run's next sequence number (``seq``). The counter is shared by every process that publishes
for the run (the worker, and web processes taking reports over the API): a viewer that sees a
number skipped knows points are missing and reads them back from the store.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import functools
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any, Protocol

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def group_name(run_id: int) -> str:
    return f"run-{run_id}"


def user_group(user_id: int) -> str:
    """The websockets ``user_id`` has open (any run): told to re-check access when theirs shrinks."""
    return f"viewer-user-{user_id}"


def share_link_group(link_id: int) -> str:
    """The websockets opened through share link ``link_id``."""
    return f"viewer-share-{link_id}"


def recheck_access(group: str) -> None:
    """Ask the sockets in ``group`` to re-check their access once the current transaction commits
    (before that, their check would still see the old rows)."""
    from asgiref.sync import async_to_sync
    from django.db import transaction

    def send() -> None:
        try:
            async_to_sync(get_channel_layer().group_send)(group, {"type": "access.check"})
        except Exception:  # the change stands; a broker outage only delays the sockets' closing
            logger.exception("asking %s to re-check access failed", group)

    transaction.on_commit(send)


# A run's Redis counter outlives a week of silence; a counter that expired reads as a gap once.
SEQUENCE_TTL_SECONDS = 7 * 24 * 3600


class Sequences(Protocol):
    """Per-run sequence numbers of live metric messages."""

    def next(self, run_id: int) -> int:
        """The number of the message about to be sent for ``run_id``: one more than the last one."""

    def current(self, run_id: int) -> int:
        """The number of the last message numbered for ``run_id`` (0 before the first)."""


class RedisSequences:
    """The counters in Redis (``INCR``), shared by every process and machine using the platform's Redis.

    A run's counter expires ``SEQUENCE_TTL_SECONDS`` after its last message: a run that publishes
    again later starts from 1, which its viewers take for a gap and read back from the store."""

    def __init__(self, url: str) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)

    @staticmethod
    def key(run_id: int) -> str:
        return f"dashboard:live-seq:{run_id}"

    def next(self, run_id: int) -> int:
        pipeline = self._redis.pipeline(transaction=False)  # one round trip for both commands
        pipeline.incr(self.key(run_id))
        pipeline.expire(self.key(run_id), SEQUENCE_TTL_SECONDS)
        return int(pipeline.execute()[0])

    def current(self, run_id: int) -> int:
        return int(self._redis.get(self.key(run_id)) or 0)


class FileSequences:
    """The counters in files, one per run under ``folder``, each changed under an exclusive
    ``flock``: the embedded mode's processes (the worker, the web server taking API reports) share
    them without a server, as they share the channel layer's files."""

    def __init__(self, folder: str | Path) -> None:
        self._folder = Path(folder)

    def next(self, run_id: int) -> int:
        self._folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self._folder / str(run_id), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            number = _read_number(descriptor) + 1
            os.pwrite(descriptor, str(number).encode().ljust(20), 0)  # fixed width: no truncate needed
            return number
        finally:
            os.close(descriptor)  # releases the lock

    def current(self, run_id: int) -> int:
        try:
            descriptor = os.open(self._folder / str(run_id), os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH)
            return _read_number(descriptor)
        finally:
            os.close(descriptor)


def _read_number(descriptor: int) -> int:
    text = os.pread(descriptor, 32, 0).strip()
    return int(text) if text else 0


@functools.cache
def sequences() -> Sequences:
    """This process's counters: in Redis when ``REDIS_URL`` is set, else in files under ``VAR_DIR``."""
    from django.conf import settings

    return RedisSequences(settings.REDIS_URL) if settings.REDIS_URL else FileSequences(settings.VAR_DIR / "live-seq")


class Publisher:
    """Sends ``(run_id, event)`` pairs to the run's group from a background thread; each metric
    message sent gets the run's next sequence number (one counter increment per message, however
    many steps were merged into it)."""

    def __init__(self, layer=None, sequences: Sequences | None = None) -> None:
        self._layer = layer
        self._sequences = sequences
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="dashboard-publisher", daemon=True)
        self._thread.start()

    def publish(self, run_id: int, event: dict[str, Any]) -> None:
        self._queue.put((run_id, event))

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until what was published so far has been sent."""
        done = threading.Event()
        self._queue.put((None, done))
        done.wait(timeout)

    def _loop(self) -> None:
        loop = asyncio.new_event_loop()
        layer = self._layer or get_channel_layer()
        numbers = self._sequences or sequences()
        failing = False
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for run_id, event in _merge(batch):
                if run_id is None:
                    event.set()
                    continue
                try:
                    if event.get("type") == "run.metrics":
                        event = {**event, "seq": numbers.next(run_id)}
                    loop.run_until_complete(layer.group_send(group_name(run_id), event))
                    if failing:
                        logger.warning("publishing live updates works again")
                    failing = False
                except Exception as exc:  # a broker outage loses live pushes only; the database has the points
                    if not failing:  # one warning per outage
                        logger.warning("publishing to run %s failed (%s: %s); live updates pause until the broker is back",
                                       run_id, exc.__class__.__name__, exc)
                    failing = True


def _merge(batch: list[tuple]) -> list[tuple]:
    """Consecutive metric events of one run become one event (order otherwise kept)."""
    merged: list[tuple] = []
    for run_id, event in batch:
        if (merged and run_id is not None and event.get("type") == "run.metrics"
                and merged[-1][0] == run_id and merged[-1][1].get("type") == "run.metrics"):
            merged[-1] = (run_id, {"type": "run.metrics", "steps": merged[-1][1]["steps"] + event["steps"]})
        else:
            merged.append((run_id, event))
    return merged


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def publisher() -> Publisher:
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            _publisher = Publisher()
            atexit.register(_publisher.flush)
        return _publisher


def publish(run_id: int, event: dict[str, Any]) -> None:
    """Queue ``event`` (a channel-layer message: its ``type`` names the consumer handler) for run ``run_id``."""
    publisher().publish(run_id, event)


def publish_metrics(run_id: int, step: int, metrics: dict[str, float | None]) -> None:
    publish(run_id, {"type": "run.metrics", "steps": [[step, metrics]]})


def status_of(run) -> dict[str, Any]:
    """What a run page keeps current of a run besides its points and log: the live push and the
    backlog a viewer opens with both send this (``started_at`` and ``worker`` are set when a worker
    claims a queued run: a page opened before that shows them without a reload)."""
    return {
        "status": run.status, "steps": run.steps, "error": run.error,
        "started_at": run.started_at.isoformat() if run.started_at else None, "worker": run.worker,
        "attempts": run.attempts,  # a new number: the page reads the attempts again (their marks on the charts)
    }


def publish_status(run) -> None:
    publish(run.pk, {"type": "run.status", **status_of(run)})


def publish_logs(run_id: int, lines: list[dict[str, Any]]) -> None:
    publish(run_id, {"type": "run.logs", "lines": lines})
