"""Writing reports in batches from a background thread, so training never waits on the database.

A batch that cannot be written (the database is down) is kept and written with the next one when
the database answers again, so an outage loses nothing and training goes on. Every write is an
upsert keyed by (run, key, step), (run, step, position) or a log line's uid, so a batch written
twice (its commit went through but the answer was lost, or a spool replayed) is still stored once.

With a spool folder (a run's own folder, for the training process) every report is also appended
to a segment file there when it is made, before the library goes on to save the step's checkpoint.
A segment is deleted once its batch is stored. So a batch that cannot be written waits on disk, not
in memory (bounded by ``RUN_SPOOL_MAX_MB``; past it reports are dropped and counted), and what a
killed process reported but never stored is written by the run's next attempt, which finds the
segments in the folder it resumes in.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

import orjson
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.utils import timezone

from training.backends.processor import free_space
from webapp.runs.models import AttemptSuperseded, RunLog, lock_for_attempt

logger = logging.getLogger(__name__)


class Spool:
    """Segments of JSON lines in ``folder``, named ``<kind>-<nanoseconds>-<n>[-a<attempt>].jsonl``
    so that their names sort in the order they were written. One segment is open for appending at
    a time.

    With ``attempt`` (a platform attempt's fencing token) the spool is adopted: segments earlier
    attempts left are renamed as this attempt's, and ``<kind>.attempt`` records that this attempt
    holds the folder from now on. A segment named with an attempt older than the one recorded
    there was written by a superseded attempt after it was taken over (a process paused past its
    takeover, killed before it could delete its segments): it is deleted, never replayed."""

    def __init__(self, folder: Path, kind: str, max_bytes: int, attempt: int | None = None) -> None:
        self.folder = Path(folder)
        self.kind = kind
        self.max_bytes = max_bytes
        self.attempt = attempt
        self.folder.mkdir(parents=True, exist_ok=True)
        # What earlier processes (a killed attempt) left: written before anything of this one.
        self.leftovers = self._adopt()
        self._bytes = sum(_size(path) for path in self.leftovers)
        self._file = None
        self._path: Path | None = None
        self._count = 0
        self._created: list[Path] = []
        # Why the last record was refused: the size limit, or the disk (ENOSPC) named by its error.
        self.refused_because = ""
        self.disk_full = False

    def append(self, record: Any) -> bool:
        """Write one record through to the operating system (it survives the process being killed).
        False when the spool is full: the record is not kept."""
        line = _encoded(record) + b"\n"
        if self._bytes + len(line) > self.max_bytes:
            self.refused_because = f"more waited to be stored than {self.max_bytes // (1024 * 1024)} MB of spool on disk hold"
            return False
        try:
            if self._file is None:
                self._path = self._new_segment()
                self._file = open(self._path, "ab", buffering=0)
                self._created.append(self._path)
            start = self._file.tell()
            try:
                self._file.write(line)
            except OSError:
                self._file.truncate(start)  # no torn line for the next record to be appended to
                raise
        except OSError as exc:  # a full disk (ENOSPC) or a failing one: the record is dropped and counted, training goes on
            self.refused_because = f"the spool's disk refused it ({exc.strerror or exc})"
            self.disk_full = exc.errno == errno.ENOSPC
            return False
        self.disk_full = False
        self._bytes += len(line)
        return True

    def publish(self, record: Any) -> bool:
        """Write ``record`` as a segment of its own, whole: written under a name no reader lists,
        then renamed into place, so that another process storing this spool's segments
        (``webapp.dashboard.recording.EpisodeDrain``) never reads one half written. False when the
        spool is full (counted from the disk: the other process deletes what it stored)."""
        line = _encoded(record) + b"\n"
        if self._bytes + len(line) > self.max_bytes:
            self._bytes = sum(_size(path) for path in self.folder.glob(f"{self.kind}-*.jsonl"))
            if self._bytes + len(line) > self.max_bytes:
                self.refused_because = f"more waited to be stored than {self.max_bytes // (1024 * 1024)} MB of spool on disk hold"
                return False
        path = self._new_segment()
        partial = path.with_name(path.name + ".partial")
        try:
            partial.write_bytes(line)
            partial.replace(path)
        except OSError as exc:  # a full disk (ENOSPC) or a failing one: the record is dropped and counted, training goes on
            partial.unlink(missing_ok=True)
            self.refused_because = f"the spool's disk refused it ({exc.strerror or exc})"
            self.disk_full = exc.errno == errno.ENOSPC
            return False
        self.disk_full = False
        self._created.append(path)
        self._bytes += len(line)
        return True

    def _new_segment(self) -> Path:
        """The next segment's name: sorted by when it was made, named for the attempt."""
        self._count += 1
        tag = f"-a{self.attempt}" if self.attempt is not None else ""
        return self.folder / f"{self.kind}-{time.time_ns():020d}-{self._count:06d}{tag}.jsonl"

    def segments(self) -> list[Path]:
        """This spool's attempt's segments in the folder now, oldest first."""
        return [path for path in sorted(self.folder.glob(f"{self.kind}-*.jsonl")) if written_by(path) == self.attempt]

    def _adopt(self) -> list[Path]:
        found = sorted(self.folder.glob(f"{self.kind}-*.jsonl"))
        if self.attempt is None:
            return found
        marker = self.folder / f"{self.kind}.attempt"
        try:
            holder = int(marker.read_text())
        except (OSError, ValueError):
            holder = 0
        if self.attempt < holder:  # this attempt is superseded itself: its writes are refused anyway
            return []
        kept = []
        for path in found:
            writer = written_by(path)  # None, untagged: an older version's, kept
            if writer is not None and writer < holder:
                logger.warning("%s was written by attempt %s after attempt %s took the run over: deleted, not stored.",
                               path, writer, holder)
                path.unlink(missing_ok=True)
                continue
            if writer is not None and writer > self.attempt:
                continue  # a later attempt's (this one is being superseded): left to it
            if writer is not None and writer != self.attempt:
                adopted = path.with_name(_ATTEMPT_TAG.sub(f"-a{self.attempt}.jsonl", path.name))
                path.rename(adopted)
                path = adopted
            kept.append(path)
        partial = marker.with_name(marker.name + ".partial")
        partial.write_text(str(self.attempt))
        partial.replace(marker)
        return kept

    def seal(self) -> Path | None:
        """Close the open segment (its records are the batch being taken) and return it."""
        if self._file is None:
            return None
        self._file.close()
        path, self._file, self._path = self._path, None, None
        return path

    def abandon(self) -> None:
        """Delete every segment this spool wrote: its process's attempt no longer holds the run, and
        a later attempt resuming in this folder must not store what it reported."""
        if self._file is not None:
            self._file.close()
            self._file = self._path = None
        for path in self._created:
            path.unlink(missing_ok=True)

    def discard(self, path: Path) -> None:
        self._bytes -= _size(path)
        path.unlink(missing_ok=True)

    @staticmethod
    def read(path: Path) -> list[Any]:
        """The records of a segment; a torn last line (the writer was killed mid-write) is skipped."""
        records = []
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return records
        for line in data.splitlines():
            try:
                records.append(_decoded(line))
            except ValueError:
                continue
        return records


_paused_runs: set = set()  # runs told that a full disk paused them
_paused_lock = threading.Lock()
_ATTEMPT_TAG = re.compile(r"-a(\d+)\.jsonl$")


def written_by(path: Path) -> int | None:
    """The attempt a spool segment is named for; None for an untagged one."""
    match = _ATTEMPT_TAG.search(path.name)
    return int(match.group(1)) if match else None


def tell_run(run_id: int | None, attempt: int | None, level: str, message: str, writer: str) -> None:
    """A line in the run's log written now, not through a spool (its disk may be full), while
    ``attempt`` holds the run; also in this process's log."""
    logger.warning("%s", message)
    if run_id is None:
        return
    try:
        with transaction.atomic():
            lock_for_attempt(run_id, attempt)
            RunLog.objects.create(run_id=run_id, level=level, time=timezone.now(), message=message)
    except (AttemptSuperseded, DatabaseError) as exc:
        logger.warning("%s: could not tell the run's log (%s)", writer, exc)


def _encoded(record: Any) -> bytes:
    """A record as one line of JSON. orjson: a step of the episode store (token ids of every
    episode) is encoded on the training thread, about 7 times faster than by json (NaN becomes null)."""
    try:
        return orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # what orjson will not take (an integer past 64 bits): json's slower way, marked
        return _JSON_MARK + json.dumps(record, separators=(",", ":")).encode()


# The start of a line json wrote (JSON allows the space): read back by json too, where orjson would
# read an integer past 64 bits as a float.
_JSON_MARK = b" "


def _decoded(line: bytes) -> Any:
    """A line ``_encoded`` wrote. orjson: the supervisor decodes every step of the episode store (a
    step of 256 episodes of 1,000 tokens: 0.15-0.3 s of CPU by json, 2 to 3 times less by orjson).
    A ValueError for a torn line. (A line json wrote before the mark, left in a spool across an
    upgrade, is read by orjson where it can: an integer past 64 bits in it comes back a float.)"""
    if not line.startswith(_JSON_MARK):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:  # json's own (NaN, a lone surrogate), from before the mark
            pass
    return json.loads(line)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class BackgroundFlusher:
    """Calls ``flush()`` every ``flush_seconds`` on its own thread, with its own database
    connection, until ``close()``. Producers append to buffers under ``_lock``; subclasses say how
    a batch is taken from them (``take``), stored (``write``) and put back after a failure (``restore``).

    With ``spool_dir``, producers also call ``spooled(record)`` (under ``_lock``) with a JSON-able
    form of what they buffer, and subclasses say how a batch is rebuilt from records
    (``batch_from_records``): then a batch that cannot be written waits on disk, and segments left
    by an earlier process are written first."""

    spool_kind = "reports"

    def __init__(self, name: str, flush_seconds: float, spool_dir: str | Path | None = None,
                 attempt: int | None = None) -> None:
        self.flush_seconds = flush_seconds
        # Set once a write was refused because the attempt no longer holds its run: nothing more is
        # written or kept, and ``on_superseded`` (if set) stops the attempt.
        self.superseded = False
        self.on_superseded: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flush_loop, name=name, daemon=True)
        self._failing_since: float | None = None
        self._paused_at: float | None = None  # when a full disk paused this writer's producers
        self.spool: Spool | None = None
        self._waiting: list[Path] = []  # spooled segments not stored yet, oldest first
        if spool_dir is not None:
            self.spool = Spool(Path(spool_dir) / "spool", self.spool_kind, settings.RUN_SPOOL_MAX_MB * 1024 * 1024, attempt)
            self._waiting = list(self.spool.leftovers)

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

    def keep_unspooled(self, batch: Any) -> None:
        """After a failed write of a batch whose records wait in the spool: keep what the spool does
        not hold (a drop count) for the next batch (under ``_lock``)."""

    def batch_from_records(self, records: list[Any]) -> Any:
        """The batch a spooled segment's records stand for (only with a spool)."""
        raise NotImplementedError

    def spooled(self, record: Any) -> bool:
        """Append ``record`` to the spool (call under ``_lock``). False when the spool is full and
        the report must be dropped; True, and nothing done, without a spool."""
        if self.superseded:
            return False
        if self.spool is None:
            return True
        while not self.spool.append(record):
            if not (self.spool.disk_full and settings.RUN_ON_FULL_DISK == "pause") or self.superseded:
                return False
            self._wait_for_disk()
        if self._paused_at is not None:
            self._resumed()
        return True

    # -- a full disk, under RUN_ON_FULL_DISK=pause ----------------------------------------------
    def _wait_for_disk(self) -> None:
        """(under ``_lock``) The spool's disk is full: the producer (training) waits here, the lock
        let go meanwhile so the writer goes on storing (and deleting) what waits."""
        if self._paused_at is None:
            self._paused_at = time.monotonic()
            if self._tell_once(True):
                self.tell("ERROR", f"The disk of {self.spool.folder} is full ({free_space(self.spool.folder)} free): "
                                   f"training is paused until it accepts writes again (checked every "
                                   f"{settings.RUN_FULL_DISK_CHECK_SECONDS} s).")
        self._lock.release()
        try:
            time.sleep(settings.RUN_FULL_DISK_CHECK_SECONDS)
        finally:
            self._lock.acquire()

    def _resumed(self) -> None:
        waited, self._paused_at = time.monotonic() - self._paused_at, None
        if self._tell_once(False):
            self.tell("INFO", f"The disk of {self.spool.folder} accepts writes again; training goes on after a pause of {waited:.0f} s.")

    def _tell_once(self, paused: bool) -> bool:
        """One line per pause for the run, whichever of its writers met the full disk first."""
        key = getattr(self, "run_id", None)
        with _paused_lock:
            if paused == (key in _paused_runs):
                return False
            (_paused_runs.add if paused else _paused_runs.discard)(key)
            return True

    def tell(self, level: str, message: str) -> None:
        """A line in the run's log written now, not through the spool (its disk may be full)."""
        tell_run(getattr(self, "run_id", None), getattr(self, "attempt", None), level, message, self._thread.name)

    # -- the writer ------------------------------------------------------------------------------
    def flush(self) -> Any:
        """Write what is buffered, after what waits in the spool. On failure the batch is kept for
        the next try (on disk with a spool, else in memory) and the error raised."""
        if self.superseded:
            return None
        with self._lock:
            batch = self.take()
            segment = self.spool.seal() if self.spool is not None else None
        if segment is not None:
            self._waiting.append(segment)
        try:
            while len(self._waiting) > (1 if segment is not None else 0):  # older reports first
                path = self._waiting[0]
                self.write(self.batch_from_records(Spool.read(path)))
                if self._waiting[:1] == [path]:  # (``abandon``, from another thread, may have emptied it)
                    self._waiting.pop(0)
                self.spool.discard(path)
            result = self.write(batch)
        except AttemptSuperseded:
            logger.error("%s: a write was refused: this attempt no longer holds the run.", self._thread.name)
            self.abandon()
            if self.on_superseded is not None:
                self.on_superseded()
            raise
        except BaseException:
            with self._lock:
                if segment is None:
                    self.restore(batch)
                else:
                    self.keep_unspooled(batch)
            raise
        if segment is not None:
            if segment in self._waiting:
                self._waiting.remove(segment)
            self.spool.discard(segment)
        if self._failing_since is not None:
            logger.warning("%s: the database is back; buffered reports written after %.0f s.",
                           self._thread.name, time.monotonic() - self._failing_since)
            self._failing_since = None
        return result

    def abandon(self) -> None:
        """Write nothing more, and delete what this writer spooled: its attempt no longer holds the run."""
        with self._lock:
            self.superseded = True
            self.take()
            if self.spool is not None:
                self.spool.abandon()
        self._waiting = []

    def stop(self) -> None:
        """Stop the thread; what is left stays (in memory, or in the spool for a later attempt)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

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
            except AttemptSuperseded:
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
                except AttemptSuperseded:
                    return
                except Exception as exc:
                    self._note_failure(exc)
                    close_old_connections()
        finally:
            connection.close()
