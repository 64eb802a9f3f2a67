"""The worker side: a metric sink that stores points in the metric store, sampled episodes and the
episode store (every episode: ``webapp.dashboard.episodes``), and pushes every logged step to live
viewers the moment the trainer reports it.

The training thread only appends to buffers and queues the live push; one writer thread stores
buffers every ``flush_seconds`` with its own database connection.

What waits to be stored is bounded: ``RUN_BUFFER_MAX_POINTS`` points in memory, and with a spool
``RUN_SPOOL_MAX_MB`` on disk. Past either, further points are dropped, counted, logged (a warning
in the worker's log, then an ERROR line in the run's log) and charted as the run's
``overload/dropped_points`` metric, instead of growing without bound.

The episode store's records have a writer of their own (``EpisodeWriter``: its own thread, its own
spool segments ``episodes-*.jsonl`` beside the metrics' ones, its own ``RUN_SPOOL_MAX_MB``; under a
worker the training process only spools them, ``EpisodeHandoff``, and the worker process that
supervises it stores them, ``EpisodeDrain``, off the training process's interpreter), so an
artifact store away holds neither the metrics back nor loses the episodes: a step that cannot be
stored waits in the spool and is stored, once, when the store answers again. They wait a step at a
time, up to ``RUN_BUFFER_MAX_EPISODES`` in memory between two writes; past it, or past the spool's
size, a step's episodes are dropped whole and counted in ``overload/dropped_episodes``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.runs.batching import BackgroundFlusher, Spool, tell_run
from webapp.dashboard import episodes as episode_store
from webapp.dashboard import live
from webapp.dashboard.models import EpisodeSample
from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import AttemptSuperseded, Run, RunLog, lock_for_attempt

logger = logging.getLogger(__name__)
training_logger = logging.getLogger("training")  # what the attempt's log handler puts in the run's log
# How soon a training process that handed its episodes to its supervisor first looks whether they are stored, at its end.
HANDOFF_POLL_SECONDS = 0.01
# How much lower the supervisor's episode storing runs than the rest of its process (and the training process).
DRAIN_NICENESS = 10
DROPPED_KEY = "overload/dropped_points"
DROPPED_EPISODES_KEY = "overload/dropped_episodes"


# Token-level fields: large, and nothing a person reads in the episode viewer.
_TOKEN_FIELDS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "logprobs")


class DashboardSink(BackgroundFlusher):
    """A ``training.tracking.sinks.MetricSink`` for one run: the metric store + episodes + live push.

    While the database is down, points and episodes stay buffered (``webapp.runs.batching``; on disk
    with ``spool_dir``, the run's folder); the live push goes on meanwhile, so viewers still see the
    run train."""

    spool_kind = "dashboard"

    def __init__(self, run_id: int, flush_seconds: float = 0.5, publish: bool = True,
                 spool_dir: str | Path | None = None, attempt: int | None = None, episodes_drained: bool = False) -> None:
        super().__init__(f"run-{run_id}-dashboard", flush_seconds, spool_dir, attempt)
        self.run_id = run_id
        self.attempt = attempt  # the fencing token: points of an attempt that no longer holds the run are refused
        self.publish = publish
        self.writer = SeriesWriter(run_id, attempt)
        self._steps: list[tuple[int, dict[str, float | None]]] = []
        self._buffered = 0  # points in _steps
        self._episodes: list[EpisodeSample] = []
        self._positions: dict[int, int] = {}
        self.max_points = settings.RUN_BUFFER_MAX_POINTS
        self.dropped = 0  # points dropped over the run (the overload metric)
        self._dropped_unreported = 0
        self._dropped_episodes_charted = 0  # the episode writer's drops already charted
        self._last_step = 0
        # The episode store's records: their own writer, thread and spool (an artifact store away
        # holds them, not the metrics). With ``episodes_drained`` (a training process under its
        # worker's supervision, and a spool) another process stores them: this one only spools them.
        if episodes_drained and spool_dir is not None:
            self.episode_writer: EpisodeWriter | EpisodeHandoff = EpisodeHandoff(run_id, spool_dir, attempt)
        else:
            self.episode_writer = EpisodeWriter(run_id, flush_seconds, spool_dir, attempt)
            self.episode_writer.on_superseded = self._episodes_superseded
        if publish:
            # Start the publisher thread now: it loads the channel layer (~70 ms of imports) while
            # the run starts up, instead of delaying the first logged step's push.
            live.publisher()
        self.start()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if v is not None and math.isfinite(v) else None) for k, v in metrics.items()}
        with self._lock:
            self._last_step = max(self._last_step, step)
            if self._buffered + len(clean) <= self.max_points and self.spooled({"points": [step, clean]}):
                self._steps.append((step, clean))
                self._buffered += len(clean)
            else:
                if not self._dropped_unreported:
                    logger.warning("run %s: more metric points wait to be stored than the buffer holds (%s points in "
                                   "memory, %s MB on disk); dropping points until the store catches up.",
                                   self.run_id, self.max_points, settings.RUN_SPOOL_MAX_MB)
                self.dropped += len(clean)
                self._dropped_unreported += len(clean)
        if self.publish:
            live.publish_metrics(self.run_id, step, clean)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        with self._lock:
            for episode in episodes:
                position = self._positions.get(step, 0)
                self._positions[step] = position + 1
                row = episode_row(self.run_id, step, position, episode)
                if self.spooled({"episode": [step, position, row.reward, row.num_turns, row.termination_reason, row.data]}):
                    self._episodes.append(row)
        if self.publish:
            live.publish(self.run_id, {"type": "run.episodes", "step": step, "count": len(episodes)})

    def store_episodes(self, step: int, records: list[dict[str, Any]]) -> None:
        """A step's episode store records (``training.tracking.episodes``): handed to the episode
        writer (buffered whole and spooled; Parquet in the artifact store, rows in the index)."""
        self.episode_writer.store(step, records)

    @property
    def dropped_episodes(self) -> int:
        return self.episode_writer.dropped

    def _episodes_superseded(self) -> None:
        self.abandon()
        if self.on_superseded is not None:
            self.on_superseded()

    def abandon(self) -> None:
        super().abandon()
        self.episode_writer.abandon()

    def take(self):
        steps, self._steps = self._steps, []
        buffered, self._buffered = self._buffered, 0
        episodes, self._episodes = self._episodes, []
        dropped, self._dropped_unreported = self._dropped_unreported, 0
        dropped_episodes = self.episode_writer.dropped
        newly_dropped_episodes = dropped_episodes > self._dropped_episodes_charted
        self._dropped_episodes_charted = dropped_episodes
        if dropped or newly_dropped_episodes:
            steps.append((self._last_step, {
                **({DROPPED_KEY: float(self.dropped)} if dropped else {}),
                **({DROPPED_EPISODES_KEY: float(dropped_episodes)} if newly_dropped_episodes else {}),
            }))
        return steps, buffered, episodes, dropped, newly_dropped_episodes

    def restore(self, batch) -> None:
        steps, buffered, episodes, dropped, dropped_episodes = batch
        if dropped or dropped_episodes:
            steps = steps[:-1]  # the overload point is made again, with the new total
        self._steps = steps + self._steps  # the store keeps the last value of a re-sent step
        self._buffered += buffered
        self._episodes = episodes + self._episodes
        self._dropped_unreported += dropped
        if dropped_episodes:
            self._dropped_episodes_charted = 0

    def keep_unspooled(self, batch) -> None:
        # The drop notices are in no segment: made again with the next batch.
        self._dropped_unreported += batch[3]
        if batch[4]:
            self._dropped_episodes_charted = 0

    def batch_from_records(self, records: list) -> tuple:
        steps, episodes = [], []
        for record in records:
            if "points" in record:
                step, metrics = record["points"]
                steps.append((step, metrics))
            elif "episode" in record:
                step, position, reward, num_turns, termination_reason, data = record["episode"]
                episodes.append(EpisodeSample(run_id=self.run_id, step=step, position=position, reward=reward,
                                              num_turns=num_turns, termination_reason=termination_reason, data=data))
            elif "stored" in record:  # an older version spooled the episode store's records here: its writer takes them
                step, items = record["stored"]
                self.episode_writer.store(step, items)
        return steps, sum(len(m) for _, m in steps), episodes, 0, False

    def write(self, batch) -> int:
        steps, buffered, episodes, dropped, _ = batch
        with transaction.atomic():  # one check of the attempt's token (the run's row locked) for the whole batch
            if steps:
                self.writer.write_steps(steps)
            elif dropped or episodes:
                lock_for_attempt(self.run_id, self.attempt)
            self._write_rest(dropped, episodes)
        return buffered

    def _write_rest(self, dropped: int, episodes: list[EpisodeSample]) -> None:
        if dropped:
            RunLog.objects.create(run_id=self.run_id, level="ERROR", time=timezone.now(), message=(
                f"{dropped} metric point(s) were dropped ({self.dropped} in all, through step {self._last_step}): "
                f"{self._why_dropped()}."))
        if episodes:
            EpisodeSample.objects.bulk_create(
                episodes, update_conflicts=True, unique_fields=["run", "step", "position"],
                update_fields=["reward", "num_turns", "termination_reason", "data"],
            )

    def _why_dropped(self) -> str:
        if self.spool is not None and self.spool.refused_because.startswith("the spool's disk"):
            return self.spool.refused_because
        return (f"more waited to be stored than the buffer holds ({self.max_points} points in memory, "
                f"{settings.RUN_SPOOL_MAX_MB} MB on disk): the database was unreachable or too slow")

    def close(self) -> None:
        try:
            self.episode_writer.close()
        except Exception as exc:  # noqa: BLE001 (the artifact store still away: the run's metrics and outcome go on)
            self.episode_writer.tell("ERROR", (
                f"Episodes of the episode store could not be stored before the run ended ({type(exc).__name__}: {exc}); "
                f"they wait in the run folder's spool, for an attempt that resumes in it."))
        try:
            super().close()  # after the episode writer: its drops are charted with the last batch
        finally:
            if self.publish:
                live.publisher().flush()


class EpisodeWriter(BackgroundFlusher):
    """The episode store's writer for one run's attempt: each step's records (``store``), buffered
    whole and spooled (segments ``episodes-*.jsonl`` in the run folder's spool), stored by its own
    thread, a step at a time: asked whether this attempt still holds the run, its Parquet files
    written (``put_step_bodies``, no lock held: a slow store never holds the run's row), then its
    index rows in a transaction that locks the run's row for this attempt first (a superseded
    attempt writes no row; a file of it no row names is never read). A batch the store
    refuses (the artifact store or the database away) waits, on disk with a spool, and is written
    again, oldest first, until it goes through: a step is written under the same file name and its
    rows upserted, so a step written twice is stored once. What does not fit (``max_episodes`` in
    memory between two writes, the spool's size) is dropped whole and counted in ``dropped``."""

    spool_kind = "episodes"

    def __init__(self, run_id: int, flush_seconds: float = 0.5, spool_dir: str | Path | None = None,
                 attempt: int | None = None) -> None:
        super().__init__(f"run-{run_id}-episodes", flush_seconds, spool_dir, attempt)
        self.run_id = run_id
        self.attempt = attempt
        self.max_episodes = settings.RUN_BUFFER_MAX_EPISODES
        self._stored: list[tuple[int, list[dict[str, Any]]]] = []
        self._stored_count = 0
        self.dropped = 0  # records dropped over the run
        self._dropped_unreported = 0
        self._last_step = 0
        self.start()

    def store(self, step: int, records: list[dict[str, Any]]) -> None:
        with self._lock:
            if self.superseded:  # this attempt no longer holds the run: nothing of it is kept, nothing to count
                return
            self._last_step = max(self._last_step, step)
            if self._stored_count + len(records) <= self.max_episodes and self.spooled({"stored": [step, records]}):
                self._stored.append((step, records))
                self._stored_count += len(records)
            else:
                if not self._dropped_unreported:
                    logger.warning("run %s: more episodes wait to be stored than the buffer holds (%s in memory); "
                                   "dropping whole steps of them until the store catches up.", self.run_id, self.max_episodes)
                self.dropped += len(records)
                self._dropped_unreported += len(records)

    def take(self):
        stored, self._stored = self._stored, []
        self._stored_count = 0
        dropped, self._dropped_unreported = self._dropped_unreported, 0
        return stored, dropped

    def restore(self, batch) -> None:
        stored, dropped = batch
        self._stored = stored + self._stored
        self._stored_count += sum(len(records) for _, records in stored)
        self._dropped_unreported += dropped

    def keep_unspooled(self, batch) -> None:
        self._dropped_unreported += batch[1]

    def batch_from_records(self, records: list) -> tuple:
        return [tuple(record["stored"]) for record in records if "stored" in record], 0

    def write(self, batch) -> int:
        stored, dropped = batch
        for step, records in stored:
            # The bodies go to the artifact store outside the run's row lock: a slow or unreachable
            # store must not hold the row, which the supervisor's heartbeat waits for (held for
            # seconds, the run was taken for lost). Asked first whether this attempt still holds
            # the run; its file, named by its attempt, is read only once its rows are written,
            # under the lock.
            if not self._holds_run():
                raise AttemptSuperseded(f"run {self.run_id} is no longer held by attempt {self.attempt}")
            files = episode_store.put_step_bodies(self.run_id, self.attempt, step, records)
            with transaction.atomic():
                lock_for_attempt(self.run_id, self.attempt)
                episode_store.index_step_bodies(self.run_id, self.attempt, step, files)
        if dropped:
            with transaction.atomic():
                lock_for_attempt(self.run_id, self.attempt)
                RunLog.objects.create(run_id=self.run_id, level="ERROR", time=timezone.now(), message=(
                    f"{dropped} episode(s) were not kept in the episode store ({self.dropped} in all, through step "
                    f"{self._last_step}): more waited to be stored than {self.max_episodes} episodes in memory or "
                    f"{settings.RUN_SPOOL_MAX_MB} MB of spool on disk hold."))
        return sum(len(records) for _, records in stored)

    def _holds_run(self) -> bool:
        """False once the run is held by another attempt, or ended (as ``lock_for_attempt`` judges:
        a row this connection cannot read is no answer; the write that follows fails and is retried)."""
        if self.attempt is None:
            return True
        row = Run.objects.filter(pk=self.run_id).values_list("status", "attempts").first()
        return row is None or (row[0] == Run.Status.RUNNING and row[1] == self.attempt)


class EpisodeDrain(EpisodeWriter):
    """The episode store's writer in the process that supervises a training process (the worker's,
    ``workers.execute``): it stores the segments the training process's ``EpisodeHandoff``
    publishes in the run folder's spool (this attempt's, oldest first, found at each flush) as
    ``EpisodeWriter`` stores its own: Parquet, then index rows under the attempt's fence, a segment
    deleted once stored, retried while the store or the database is away. The training process's
    steps never wait on it, nor share an interpreter lock with it."""

    def __init__(self, run_id: int, spool_dir: str | Path, attempt: int | None, flush_seconds: float = 0.05) -> None:
        super().__init__(run_id, flush_seconds, spool_dir, attempt)

    def store(self, step: int, records: list[dict[str, Any]]) -> None:
        raise TypeError("an EpisodeDrain stores what the training process spooled; it takes no records")

    def _flush_loop(self) -> None:
        # Below the training process on a busy CPU: this thread alone (Linux's nice is per thread).
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DRAIN_NICENESS)
        except OSError:
            pass
        super()._flush_loop()

    def flush(self) -> Any:
        if not self.superseded:
            known = set(self._waiting)
            self._waiting.extend(path for path in self.spool.segments() if path not in known)
        return super().flush()


class EpisodeHandoff:
    """The training process's side of the episode store when its supervising worker process stores
    the episodes (``EpisodeDrain``): each step's records are written to the run folder's spool as a
    segment of their own, whole, and nothing else is done here: no thread, no Parquet, no database.
    (Stored from a thread of the training process, the episodes slowed its steps: the two threads
    share one interpreter lock. bench/episodes.py, training.) Nothing is held in memory; past
    ``RUN_SPOOL_MAX_MB`` on disk a step's episodes are dropped whole, counted in ``dropped``.

    ``close`` waits until the supervisor has stored every segment this attempt spooled. When the
    supervising process is gone (it was killed: the run will be resumed), this process stores them
    itself, as ``EpisodeWriter`` does."""

    def __init__(self, run_id: int, spool_dir: str | Path, attempt: int | None) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.spool_dir = spool_dir
        self.spool = Spool(Path(spool_dir) / "spool", EpisodeWriter.spool_kind, settings.RUN_SPOOL_MAX_MB * 1024 * 1024, attempt)
        self.dropped = 0
        self.superseded = False
        self._dropping = False
        self._parent = os.getppid()
        self._lock = threading.Lock()

    def store(self, step: int, records: list[dict[str, Any]]) -> None:
        with self._lock:
            if self.superseded:
                return
            kept = self.spool.publish({"stored": [step, records]})
            if not kept:
                self.dropped += len(records)
            told, self._dropping = self._dropping, not kept
        if not kept and not told:  # once per stretch of drops, in the run's log (the attempt's log handler)
            training_logger.error("The episodes of step %s and of the steps after it are not kept in the episode store "
                                  "until the store catches up (%s dropped in all): %s.", step, self.dropped,
                                  self.spool.refused_because)

    def tell(self, level: str, message: str) -> None:
        tell_run(self.run_id, self.attempt, level, message, f"run-{self.run_id}-episodes")

    def abandon(self) -> None:
        with self._lock:
            self.superseded = True
            self.spool.abandon()

    def close(self) -> None:
        """Wait (up to ``RUN_DATABASE_RETRY_SECONDS``) until the supervisor has stored what this
        attempt spooled; raise if it has not by then (it waits in the spool for the next attempt)."""
        deadline = time.monotonic() + settings.RUN_DATABASE_RETRY_SECONDS
        delay = HANDOFF_POLL_SECONDS
        while not self.superseded and self.spool.segments():
            if os.getppid() != self._parent:  # no supervisor any more: stored from here
                EpisodeWriter(self.run_id, 3600, self.spool_dir, self.attempt).close()
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.spool.segments())} step(s) of episodes were not stored by the worker "
                                   f"within {settings.RUN_DATABASE_RETRY_SECONDS} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)  # at once at a run's end; seldom through an outage


def episode_row(run_id: int, step: int, position: int, episode: dict[str, Any]) -> EpisodeSample:
    # Token ids are dropped; their counts stay, so the viewer can say how many tokens each turn trained.
    # Without token ids (verl's rollout dump has none) there is no count, rather than a false 0.
    data = {k: v for k, v in episode.items() if k not in _TOKEN_FIELDS}
    if isinstance(episode.get("response_mask"), list) and episode["response_mask"]:
        data["trained_tokens"] = sum(1 for m in episode["response_mask"] if m)
    data["trajectories"] = [
        {**{k: v for k, v in trajectory.items() if k != "steps"},
         "steps": [{**{k: v for k, v in turn.items() if k not in _TOKEN_FIELDS},
                    **({"response_tokens": len(turn["response_ids"])} if isinstance(turn.get("response_ids"), list) else {})}
                   for turn in trajectory.get("steps", [])]}
        for trajectory in episode.get("trajectories", [])
    ]
    reward = episode.get("reward")
    return EpisodeSample(
        run_id=run_id, step=step, position=position,
        reward=float(reward) if isinstance(reward, (int, float)) and math.isfinite(reward) else None,
        num_turns=int(episode.get("num_turns") or 0),
        termination_reason=str(episode.get("termination_reason") or "")[:40],
        data=_jsonable(data),
    )


def _jsonable(value: Any) -> Any:
    """Episodes carry arbitrary task and info objects; keep what JSON can hold, str() the rest."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
