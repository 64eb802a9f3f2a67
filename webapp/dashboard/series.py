"""The metric store: writing points, folding them into blocks, and reading them back raw or
downsampled. Nothing above this module knows how points are laid out (``webapp.dashboard.models``).

Writing: each ``SeriesWriter.write`` appends one ``SeriesTail`` row with every point of the batch
and keeps each key's latest value on the run's row (``Run.latest_values``, ``Run.steps``), so no
page ever walks points to show them. Once the run's tail holds ``TAIL_FOLD_POINTS`` points, or the
run ends, the tail is folded into per-key blocks.

Reading: the blocks, then the tail on top; a (key, step) present twice keeps its latest value.
Downsampling keeps spikes: every bucket contributes its minimum and its maximum, each at the step
where it happened, and the series' last point is always included. Long ranges are answered from
block summaries alone (no point payload is read); short ones decode the blocks' points with numpy,
except in a request for many runs at once (compare), where a bucket of ``DIGEST_SPAN`` points or
more is answered from the blocks' digests (the extremes of every ``DIGEST_SPAN`` points).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections.abc import Iterable

import numpy as np
from django.conf import settings
from django.core.cache import caches
from django.db import connection, transaction
from django.db.models import Max, Min, Q, Sum
from django.utils import timezone

from webapp.dashboard.models import (
    BLOCK_SIZE, DIGEST_SPAN, SUMMARY_BLOCKS, TAIL_FOLD_POINTS, SeriesBlock, SeriesSummary, SeriesTail, digest_of, unpack,
    unpack_digest,
)
from webapp.runs.models import Run, last_step_of, lock_for_attempt

logger = logging.getLogger(__name__)

# Points per series per chart: a bucket gives two (its min and max), plus the last point.
DEFAULT_POINTS = 1500
MAX_POINTS = 5000
# Up to this many blocks in a range their points are read and bucketed; past it the summaries do.
PAYLOAD_BLOCK_LIMIT = 64
SUMMARY_FIELDS = ("run_id", "index", "first_step", "last_step", "count",
                  "min_value", "min_step", "max_value", "max_step", "last_value")
MAX_KEYS_PER_BATCH = 65535  # key ids are stored as uint16

Arrays = tuple[np.ndarray, np.ndarray]
_NO_STEPS = np.array([], dtype="<i8")
_NO_VALUES = np.array([], dtype="<f8")


class SeriesWriter:
    """Stores points of one run.

    Each write appends one tail row and updates the run's latest values under a lock on the run's
    row, so two writers of one run (an attempt resumed beside the one it replaced, reports arriving
    over the API at once) never lose each other's points, and the fold sees every tail row. A step
    sent again is stored again and the later value counts: a replayed step is stored once.
    """

    def __init__(self, run_id: int, attempt: int | None = None) -> None:
        self.run_id = run_id
        self.attempt = attempt  # a platform attempt's fencing token: its writes are refused once it no longer holds the run

    def write(self, points: Iterable[tuple[str, int, float | None]]) -> int:
        """Store ``(key, step, value)`` points; a step sent again replaces its value. Returns how many."""
        keys: dict[str, int] = {}
        key_ids: list[int] = []
        steps: list[int] = []
        values: list[float] = []
        for key, step, value in points:
            key_ids.append(keys.setdefault(key, len(keys)))
            steps.append(int(step))
            values.append(math.nan if value is None or not math.isfinite(value) else float(value))
        if len(keys) > MAX_KEYS_PER_BATCH:
            raise ValueError(f"{len(keys)} metric keys in one batch; at most {MAX_KEYS_PER_BATCH}.")
        return self._store(list(keys), np.array(key_ids, dtype="<u2"), np.array(steps, dtype="<i8"),
                           np.array(values, dtype="<f8"))

    def write_steps(self, logged: list[tuple[int, dict[str, float | None]]]) -> int:
        """Store ``(step, {key: value})`` pairs as a trainer logs them (None: not a finite number).
        The same as ``write`` for their points, packed a step at a time rather than a point at a time."""
        keys: dict[str, int] = {}
        known: dict[tuple, np.ndarray] = {}
        ids, steps, values = [], [], []
        for step, metrics in logged:
            names = tuple(metrics)
            local = known.get(names)
            if local is None:
                local = known[names] = np.array([keys.setdefault(k, len(keys)) for k in names], dtype=np.int64)
            ids.append(local)
            steps.append(np.full(len(names), step, dtype="<i8"))
            values.extend(metrics.values())
        if len(keys) > MAX_KEYS_PER_BATCH:
            raise ValueError(f"{len(keys)} metric keys in one batch; at most {MAX_KEYS_PER_BATCH}.")
        if not ids:
            return 0
        value_array = np.array(values, dtype="<f8")  # None becomes NaN
        value_array[~np.isfinite(value_array)] = np.nan
        return self._store(list(keys), np.concatenate(ids).astype("<u2"), np.concatenate(steps), value_array)

    def _store(self, names: list[str], ids: np.ndarray, step_array: np.ndarray, value_array: np.ndarray) -> int:
        count = len(step_array)
        if not count:
            return 0
        latest = _latest_per_key(names, ids, step_array, value_array)
        ranges = _ranges_per_key(names, ids, value_array)
        with transaction.atomic():
            run = lock_for_attempt(self.run_id, self.attempt)
            if run is None:
                raise Run.DoesNotExist(f"run {self.run_id} does not exist")
            SeriesTail.objects.create(
                run_id=self.run_id, count=count, first_step=int(step_array.min()), last_step=int(step_array.max()),
                keys=names, key_ids=ids.tobytes(), steps=step_array.tobytes(), values=value_array.tobytes(),
            )
            pending = run["tail_points"] + count
            fold = pending >= TAIL_FOLD_POINTS
            Run.objects.filter(pk=self.run_id).update(
                latest_values={**(run["latest_values"] or {}), **latest}, metrics_at=timezone.now(),
                value_ranges=_widened(run["value_ranges"] or {}, ranges),
                steps=max(run["steps"], min(int(step_array.max()), 2**31 - 1), 0), tail_points=0 if fold else pending,
            )
            if fold:
                _fold_locked(self.run_id)
        return count

    def fold(self) -> int:
        """Fold the run's tail into blocks now (a run that ended). Returns the points folded."""
        with transaction.atomic():
            if not Run.objects.select_for_update().filter(pk=self.run_id).exists():
                return 0
            Run.objects.filter(pk=self.run_id).update(tail_points=0)
            return _fold_locked(self.run_id)


def _latest_per_key(names: list[str], ids: np.ndarray, steps: np.ndarray, values: np.ndarray) -> dict[str, float | None]:
    """Each key's value at its highest step in the batch (the last one sent, for a step sent twice)."""
    order = np.lexsort((np.arange(len(ids)), steps, ids))
    sorted_ids = ids[order]
    last = order[np.r_[sorted_ids[1:] != sorted_ids[:-1], True]]
    return {names[int(ids[i])]: _finite_or_none(values[i]) for i in last}


def _ranges_per_key(names: list[str], ids: np.ndarray, values: np.ndarray) -> dict[str, dict[str, float]]:
    """Each key's lowest and highest finite value in the batch (keys with none are left out)."""
    finite = np.isfinite(values)
    ids, values = ids[finite], values[finite]
    order = np.argsort(ids, kind="stable")
    ids, values = ids[order], values[order]
    bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True]) if len(ids) else []
    return {names[int(ids[a])]: {"min": float(values[a:b].min()), "max": float(values[a:b].max())}
            for a, b in zip(bounds[:-1], bounds[1:])}


def _widened(ranges: dict, batch: dict[str, dict[str, float]]) -> dict:
    """``ranges`` widened to take in ``batch``'s. A replayed step's earlier value stays counted
    until the next fold, which computes every range again from the blocks (``_ranges_from_summaries``)."""
    merged = dict(ranges)
    for key, new in batch.items():
        old = merged.get(key)
        merged[key] = new if not old else {"min": min(old["min"], new["min"]), "max": max(old["max"], new["max"])}
    return merged


def _ranges_from_summaries(run_id: int) -> dict[str, dict[str, float]]:
    """Each key's range over its folded points, from the summaries' extremes (no point is read)."""
    rows = (SeriesSummary.objects.filter(run_id=run_id).values("key")
            .annotate(low=Min("min_value"), high=Max("max_value")).order_by())
    return {row["key"]: {"min": row["low"], "max": row["high"]} for row in rows if row["low"] is not None}


def _fold_locked(run_id: int) -> int:
    """Move the run's tail into blocks (the caller holds the run's row lock). New points become
    new blocks of up to ``BLOCK_SIZE`` points; a replayed step a closed block holds is replaced there."""
    rows = _fetch_bytes(SeriesTail.objects.filter(run_id=run_id).order_by("id")
                        .values_list("run_id", "id", "keys", "key_ids", "steps", "values"))
    if not rows:
        return 0
    tail = _decode_tail(rows)[run_id]
    existing = {row["key"]: row for row in SeriesBlock.objects.filter(run_id=run_id, key__in=list(tail))
                .values("key").annotate(index=Max("index"), last_step=Max("last_step"))}
    new_blocks: list[SeriesBlock] = []
    rewritten: list[SeriesBlock] = []
    for key, (steps, values) in tail.items():
        index, closed_through = -1, None
        if key in existing:
            index, closed_through = existing[key]["index"], existing[key]["last_step"]
        if closed_through is not None and steps[0] <= closed_through:
            replayed = steps <= closed_through
            left = _replace_in_closed(run_id, key, steps[replayed], values[replayed], rewritten)
            keep = ~replayed
            keep[np.flatnonzero(replayed)[left]] = True  # steps no closed block holds stay new points
            steps, values = steps[keep], values[keep]
        for first in range(0, len(steps), BLOCK_SIZE):
            index += 1
            new_blocks.append(block_row(run_id, key, index, steps[first:first + BLOCK_SIZE], values[first:first + BLOCK_SIZE]))
    if rewritten:
        SeriesBlock.objects.bulk_update(rewritten, ["count", "first_step", "last_step", "min_value", "min_step",
                                                    "max_value", "max_step", "last_value", "steps", "values", "digest"])
    SeriesBlock.objects.bulk_create(new_blocks, batch_size=500)
    _update_summaries(run_id, new_blocks, rewritten)
    SeriesTail.objects.filter(run_id=run_id, id__lte=max(row[1] for row in rows)).delete()
    # Every point is in a block now (the caller's lock keeps writers out): the exact ranges, a
    # replayed step's replaced value no longer among them.
    Run.objects.filter(pk=run_id).update(value_ranges=_ranges_from_summaries(run_id))
    return sum(len(s) for s, _ in tail.values())


# Block columns a summary is computed from, in this order (``_combine`` reads them by position).
_PART_FIELDS = ("first_step", "last_step", "count", "min_value", "min_step", "max_value", "max_step", "last_value")
_SUMMARY_UPDATE = (*_PART_FIELDS, "blocks")


def _update_summaries(run_id: int, new_blocks: list[SeriesBlock], rewritten: list[SeriesBlock]) -> None:
    """Bring the summaries of the groups the fold touched up to date (the caller holds the run's lock).
    A group that only gained blocks is its old summary combined with them; a group where a replay
    rewrote a block is computed again from all its blocks. Either way the result is the summary of
    the group's blocks as they now are, so a fold replayed any number of times gives the same rows."""
    recompute = {(b.key, b.index // SUMMARY_BLOCKS) for b in rewritten}
    appended: dict[tuple[str, int], list[SeriesBlock]] = {}
    for block in new_blocks:
        group = (block.key, block.index // SUMMARY_BLOCKS)
        if group not in recompute:
            appended.setdefault(group, []).append(block)
    rows: list[SeriesSummary] = []
    if appended:
        old = {}
        condition = Q()
        for key, group in appended:
            condition |= Q(key=key, index=group)
        for summary in SeriesSummary.objects.filter(condition, run_id=run_id).values_list("key", "index", *_SUMMARY_UPDATE):
            old[summary[:2]] = [tuple(summary[2:])]
        for (key, group), blocks in appended.items():
            parts = old.get((key, group), []) + [(*(getattr(b, f) for f in _PART_FIELDS), 1) for b in blocks]
            rows.append(_summary_row(run_id, key, group, parts))
    if recompute:
        rows.extend(summaries_from_blocks(run_id, recompute))
    if rows:
        SeriesSummary.objects.bulk_create(rows, batch_size=500, update_conflicts=True,
                                          unique_fields=["run", "key", "index"], update_fields=list(_SUMMARY_UPDATE))


def summaries_from_blocks(run_id: int, groups: Iterable[tuple[str, int]] | None = None) -> list[SeriesSummary]:
    """The summary rows of these ``(key, group)`` pairs (all of the run's when None), computed from
    the block rows (their summary columns only; no point payload is read)."""
    blocks = SeriesBlock.objects.filter(run_id=run_id)
    if groups is not None:
        condition = Q()
        for key, group in groups:
            condition |= Q(key=key, index__gte=group * SUMMARY_BLOCKS, index__lt=(group + 1) * SUMMARY_BLOCKS)
        blocks = blocks.filter(condition)
    parts: dict[tuple[str, int], list[tuple]] = {}
    for key, index, *columns in blocks.order_by("key", "index").values_list("key", "index", *_PART_FIELDS).iterator(chunk_size=5000):
        parts.setdefault((key, index // SUMMARY_BLOCKS), []).append((*columns, 1))
    return [_summary_row(run_id, key, group, group_parts) for (key, group), group_parts in parts.items()]


def rebuild_summaries(run_id: int) -> int:
    """Write every summary of the run again from its blocks (blocks written other than by the fold,
    as the scale benchmark's bulk load does). Returns how many rows."""
    rows = summaries_from_blocks(run_id)
    with transaction.atomic():
        SeriesSummary.objects.filter(run_id=run_id).delete()
        SeriesSummary.objects.bulk_create(rows, batch_size=1000)
        run = Run.objects.select_for_update().filter(pk=run_id).values("value_ranges").first()
        if run is not None:
            Run.objects.filter(pk=run_id).update(value_ranges=_widened(run["value_ranges"] or {}, _ranges_from_summaries(run_id)))
    return len(rows)


def _summary_row(run_id: int, key: str, group: int, parts: list[tuple]) -> SeriesSummary:
    """One summary of ``parts``: rows of ``_PART_FIELDS`` plus how many blocks each stands for."""
    first_step, last_step, count, min_value, min_step, max_value, max_step, last_value, blocks = _combine(parts)
    return SeriesSummary(run_id=run_id, key=key, index=group, first_step=first_step, last_step=last_step, count=count,
                         min_value=min_value, min_step=min_step, max_value=max_value, max_step=max_step,
                         last_value=last_value, blocks=blocks)


def _combine(parts: list[tuple]) -> tuple:
    """Summary columns over parts, in order: the lowest minimum and highest maximum (the earlier part
    on a tie), and the last value of the part reaching the highest step."""
    lows = [p for p in parts if p[3] is not None]
    highs = [p for p in parts if p[5] is not None]
    low = min(lows, key=lambda p: p[3]) if lows else (None,) * 5
    high = max(highs, key=lambda p: p[5]) if highs else (None,) * 7
    last = max(parts, key=lambda p: p[1])
    return (min(p[0] for p in parts), last[1], sum(p[2] for p in parts), low[3], low[4], high[5], high[6], last[7],
            sum(p[8] for p in parts))


def _replace_in_closed(run_id: int, key: str, steps: np.ndarray, values: np.ndarray, rewritten: list) -> np.ndarray:
    """Put replayed values into the closed blocks holding their steps; returns a mask of the steps
    that no block holds (logged late into a range already closed)."""
    left = np.ones(len(steps), dtype=bool)
    blocks = SeriesBlock.objects.filter(run_id=run_id, key=key, first_step__lte=int(steps.max()), last_step__gte=int(steps.min()))
    for block in blocks:
        block_steps, block_values = block.arrays()
        position = np.searchsorted(block_steps, steps)
        inside = position < len(block_steps)
        hit = inside.copy()
        hit[inside] = block_steps[position[inside]] == steps[inside]
        hit &= left
        if hit.any():
            block_values = block_values.copy()
            block_values[position[hit]] = values[hit]
            left &= ~hit
            row = block_row(run_id, key, block.index, block_steps, block_values)
            row.pk = block.pk
            rewritten.append(row)
    return left


def block_row(run_id: int, key: str, index: int, steps: np.ndarray, values: np.ndarray) -> SeriesBlock:
    steps = np.ascontiguousarray(steps, dtype="<i8")
    values = np.ascontiguousarray(values, dtype="<f8")
    finite = np.isfinite(values)
    extremes = {}
    if finite.any():
        lo = int(np.where(finite, values, np.inf).argmin())
        hi = int(np.where(finite, values, -np.inf).argmax())
        extremes = {"min_value": float(values[lo]), "min_step": int(steps[lo]),
                    "max_value": float(values[hi]), "max_step": int(steps[hi])}
    return SeriesBlock(
        run_id=run_id, key=key, index=index, first_step=int(steps[0]), last_step=int(steps[-1]),
        count=len(steps), last_value=_finite_or_none(values[-1]), steps=steps.tobytes(), values=values.tobytes(),
        digest=digest_of(steps, values), **extremes,
    )


def _decode_tail(rows: list[tuple]) -> dict[int, dict[str, Arrays]]:
    """Tail rows ``(run_id, id, keys, key_ids, steps, values)`` in id order -> {run: {key: (steps, values)}},
    sorted by step, each step once (the value of the latest row)."""
    by_run: dict[int, list[tuple]] = {}
    for row in rows:
        by_run.setdefault(row[0], []).append(row)
    result: dict[int, dict[str, Arrays]] = {}
    for run_id, run_rows in by_run.items():
        names: dict[str, int] = {}
        ids, steps, values = [], [], []
        for _, _, keys, raw_ids, raw_steps, raw_values in run_rows:
            keys = _json(keys)
            local = np.array([names.setdefault(k, len(names)) for k in keys], dtype=np.int64)
            ids.append(local[np.frombuffer(bytes(raw_ids), dtype="<u2")])
            chunk_steps, chunk_values = unpack(raw_steps, raw_values)
            steps.append(chunk_steps)
            values.append(chunk_values)
        all_ids, all_steps, all_values = np.concatenate(ids), np.concatenate(steps), np.concatenate(values)
        order = np.lexsort((np.arange(len(all_ids)), all_steps, all_ids))
        sorted_ids, sorted_steps = all_ids[order], all_steps[order]
        last = np.r_[(sorted_ids[1:] != sorted_ids[:-1]) | (sorted_steps[1:] != sorted_steps[:-1]), True]
        order = order[last]
        sorted_ids = all_ids[order]
        bounds = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1], True])
        key_names = list(names)
        result[run_id] = {
            key_names[int(sorted_ids[a])]: (all_steps[order[a:b]], all_values[order[a:b]])
            for a, b in zip(bounds[:-1], bounds[1:])
        }
    return result


def _json(value):
    import json

    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _tail(run_ids: list[int]) -> dict[int, dict[str, Arrays]]:
    rows = _fetch_bytes(SeriesTail.objects.filter(run_id__in=run_ids).order_by("run_id", "id")
                        .values_list("run_id", "id", "keys", "key_ids", "steps", "values"))
    return _decode_tail(rows) if rows else {}


def _merge(parts: list[Arrays]) -> Arrays:
    """Concatenate (steps, values) parts, later parts winning a step they share; sorted by step."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return _NO_STEPS, _NO_VALUES
    if len(parts) == 1:
        steps, values = parts[0]
        if len(steps) < 2 or (np.diff(steps) > 0).all():
            return steps, values
    steps = np.concatenate([s for s, _ in parts])
    values = np.concatenate([v for _, v in parts])
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    last = np.r_[steps[1:] != steps[:-1], True]
    return steps[last], values[last]


# -- reading ---------------------------------------------------------------------------------------

def one_snapshot(read):
    """A reader of blocks and tail that sees the store at one moment. A fold (the tail moved into
    blocks, at every ``TAIL_FOLD_POINTS`` and when the run ends) committed between its block query
    and its tail query would otherwise hide the points it moved from both. On PostgreSQL the reads
    share one REPEATABLE READ transaction (inside a caller's transaction they share that one); the
    readers also read the tail before the blocks, so where there is no snapshot a fold in between
    shows its points twice (merged: each step once), never not at all."""
    @functools.wraps(read)
    def in_one_snapshot(*args, **kwargs):
        if connection.vendor != "postgresql" or connection.in_atomic_block:
            return read(*args, **kwargs)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return read(*args, **kwargs)

    return in_one_snapshot


def keys_of(run_id: int) -> list[str]:
    """Every key the run has logged (kept on its row by the writer)."""
    values = Run.objects.filter(pk=run_id).values_list("latest_values", flat=True).first()
    return sorted(values or {})


def points_after(run_id: int, after: int, through: int | None = None) -> dict[str, list[list]]:
    """Every point with ``after < step <= through``, as {key: [[step, value], ...]} sorted by step."""
    return {key: _pairs(steps, values) for key, (steps, values) in arrays_after(run_id, after, through).items()}


@one_snapshot
def points_after_at_most(run_id: int, after: int, limit: int, keys: list[str] | None = None,
                         through: int | None = None) -> dict[str, list[list]] | None:
    """``points_after`` (of ``keys``, default all), or None when more than ``limit`` points lie in
    the range. The blocks wholly inside it are counted first, so a long range is refused without
    reading its points; what is read past that is at most ``limit`` points plus the one block of
    each key that the range's start cuts, and the tail."""
    inside = SeriesBlock.objects.filter(run_id=run_id, first_step__gt=after)
    if through is not None:
        inside = inside.filter(last_step__lte=through)
    if keys is not None:
        inside = inside.filter(key__in=keys)
    if (inside.aggregate(n=Sum("count"))["n"] or 0) > limit:
        return None
    arrays = arrays_after(run_id, after, through, keys)
    if sum(len(steps) for steps, _ in arrays.values()) > limit:
        return None
    return {key: _pairs(steps, values) for key, (steps, values) in arrays.items()}


@one_snapshot
def arrays_after(run_id: int, after: int, through: int | None = None, keys: list[str] | None = None) -> dict[str, Arrays]:
    """``points_after`` as numpy arrays: {key: (steps, values)}, each step once, sorted by step."""
    tail = _tail([run_id]).get(run_id, {})  # before the blocks (``one_snapshot``)
    blocks = SeriesBlock.objects.filter(run_id=run_id, last_step__gt=after)
    if through is not None:
        blocks = blocks.filter(first_step__lte=through)
    if keys is not None:
        blocks = blocks.filter(key__in=keys)
    parts: dict[str, list[Arrays]] = {}
    for key, raw_steps, raw_values in _fetch_bytes(blocks.order_by("key", "index").values_list("key", "steps", "values")):
        parts.setdefault(key, []).append(unpack(raw_steps, raw_values))
    for key, arrays in tail.items():
        if keys is None or key in keys:
            parts.setdefault(key, []).append(arrays)
    result: dict[str, Arrays] = {}
    for key, key_parts in parts.items():
        steps, values = _merge(key_parts)
        keep = steps > after
        if through is not None:
            keep &= steps <= through
        if keep.any():
            result[key] = (steps[keep], values[keep])
    return dict(sorted(result.items()))


def windows(run_id: int, steps_per_window: int = 2000):
    """Every point of the run, a window of steps at a time, in step order: yields
    {key: (steps, values)} for each window that holds points (the CSV export streams these).
    Empty windows widen the next one, so a series with large gaps in its steps is crossed quickly."""
    last = last_step_of(run_id)
    width = steps_per_window
    first = _first_step(run_id)
    if first is None:
        return
    after = first - 1
    while after < last:
        through = min(after + width, last)
        found = arrays_after(run_id, after, through)
        if found:
            width = steps_per_window
            yield found
        else:
            width *= 2
        after = through


def _first_step(run_id: int) -> int | None:
    found = [v for v in (SeriesBlock.objects.filter(run_id=run_id).aggregate(m=Min("first_step"))["m"],
                         SeriesTail.objects.filter(run_id=run_id).aggregate(m=Min("first_step"))["m"]) if v is not None]
    return min(found) if found else None


def all_points(run_ids: list[int], key: str) -> dict[int, Arrays]:
    """Every point of ``key`` of each run (a sweep's intermediate values)."""
    return {run_id: arrays_after(run_id, -(2**62), keys=[key]).get(key, (_NO_STEPS, _NO_VALUES)) for run_id in run_ids}


def downsample(run_id: int, key: str, start: int | None = None, end: int | None = None,
               points: int = DEFAULT_POINTS) -> dict:
    """The series ``key`` of a run between steps ``start`` and ``end``, at most about ``points`` points."""
    return downsample_many([run_id], key, start, end, points)[run_id]


@one_snapshot
def downsample_many(run_ids: list[int], key: str, start: int | None = None, end: int | None = None,
                    points: int = DEFAULT_POINTS, arrays: bool = False) -> dict[int, dict]:
    """``downsample`` for several runs with a few queries in all (the compare page's runs).
    ``arrays``: each series' ``x`` and ``y`` as numpy arrays (int64 steps, float64 values, NaN where
    not finite) instead of lists (``None`` where not finite), for a caller that packs them.

    Each run's range is read at the coarsest level that still gives a bucket at least one row: the
    group summaries when the range holds at least as many whole groups as the chart has buckets (the
    groups cut by the range's ends are read as their blocks), else the block summaries, else, for a
    range of few blocks, their points. When the runs of few blocks hold more blocks together than
    that (the compare page's many runs: a thousand runs of 10k steps are 160 MB of points per key),
    those whose chart buckets span DIGEST_SPAN points or more are read from the blocks' digests: the
    same extremes at a sixteenth of the bytes. One run's chart stays exact (its points' buckets)."""
    points = max(8, min(int(points), MAX_POINTS))
    buckets = max(1, (points - 1) // 2)
    tails = _tail(run_ids)  # before the blocks (``one_snapshot``)
    summaries = _summary_level(run_ids, key, start, end, buckets)
    blocks = SeriesBlock.objects.filter(key=key)
    if start is not None:
        blocks = blocks.filter(last_step__gte=start)
    if end is not None:
        blocks = blocks.filter(first_step__lte=end)
    block_runs = [run_id for run_id in run_ids if run_id not in summaries]
    # The blocks of the ranges read at the block level, and of the groups the ends of the others cut.
    wanted = Q(run_id__in=block_runs) if block_runs else Q()
    for run_id, (_, cut) in summaries.items():
        for group in cut:
            wanted |= Q(run_id=run_id, index__gte=group * SUMMARY_BLOCKS, index__lt=(group + 1) * SUMMARY_BLOCKS)
    rows_of: dict[int, list[tuple]] = {run_id: [] for run_id in block_runs}
    for run_id, (rows, _) in summaries.items():
        rows_of[run_id] = list(rows)
    if wanted:
        for row in _fetch_bytes(blocks.filter(wanted).order_by("run_id", "index").values_list(*SUMMARY_FIELDS)):
            rows_of[row[0]].append(row)
    # One more query reads the points of the runs whose range spans few blocks (the same blocks).
    needs_payload = [run_id for run_id in block_runs if 0 < len(rows_of[run_id]) <= PAYLOAD_BLOCK_LIMIT]
    digests: dict[int, list] = {}
    if sum(len(rows_of[run_id]) for run_id in needs_payload) > PAYLOAD_BLOCK_LIMIT:
        coarse = [run_id for run_id in needs_payload if sum(row[4] for row in rows_of[run_id]) / buckets >= DIGEST_SPAN]
        if coarse:
            query = blocks.filter(run_id__in=coarse).order_by("run_id", "index").values_list("run_id", "digest")
            for run_id, digest in _fetch_bytes(query):
                digests.setdefault(run_id, []).append(digest)
            for run_id in [run_id for run_id, found in digests.items() if any(d is None for d in found)]:
                del digests[run_id]  # blocks copied in by a migration without digests: read their points
            needs_payload = [run_id for run_id in needs_payload if run_id not in digests]
    payloads: dict[int, list[Arrays]] = {}
    if needs_payload:
        query = blocks.filter(run_id__in=needs_payload).order_by("run_id", "index").values_list("run_id", "steps", "values")
        for run_id, raw_steps, raw_values in _fetch_bytes(query):
            payloads.setdefault(run_id, []).append(unpack(raw_steps, raw_values))
    # Runs read from digests: those with no tail points of the key (ended runs) bucketed all at once.
    at_once = [run_id for run_id in digests if key not in tails.get(run_id, {})]
    result = _from_digests(at_once, rows_of, digests, key, points) if at_once else {}
    for run_id in run_ids:
        rows = rows_of[run_id]
        tail = tails.get(run_id, {}).get(key)
        if run_id in result:
            continue
        if run_id in digests:
            table = _digest_table([rows], [digests[run_id]])
            result[run_id] = _from_summaries(key, np.column_stack([np.zeros(len(table)), table]), tail, start, end, points)
        elif run_id not in summaries and len(rows) <= PAYLOAD_BLOCK_LIMIT:
            steps, values = _merge(payloads.get(run_id, []) + ([tail] if tail is not None else []))
            result[run_id] = _from_points(key, steps, values, start, end, points)
        else:
            result[run_id] = _from_summaries(key, rows, tail, start, end, points)
    return result if arrays else {run_id: as_lists(series) for run_id, series in result.items()}


def downsample_ended(runs: list[dict], key: str, start: int | None = None, end: int | None = None,
                     points: int = DEFAULT_POINTS) -> dict[int, dict]:
    """``downsample_many(..., arrays=True)`` of ``runs`` (rows with ``pk``, ``uid``, ``status`` and
    ``metrics_at``), each ended run's series kept in the ``series`` cache for
    ``SERIES_CACHE_SECONDS``: comparing a thousand ended runs again reads a thousand small entries
    instead of their blocks. An entry is named by the run's ``uid`` and the time of its last write
    (the writer sets ``metrics_at`` on every write, a replayed step included), so a write makes
    new entries and never serves old ones. Running runs are always read from the store (their
    next flush would leave an entry stale). A cache that fails (Redis down) is read past: the
    chart comes from the store and the failure is logged."""
    ended = {run["pk"]: _cache_name(run, key, start, end, points) for run in runs
             if run["status"] in Run.FINAL and settings.SERIES_CACHE_SECONDS > 0}
    cache = caches["series"]
    try:
        found = cache.get_many(list(ended.values())) if ended else {}
    except Exception:
        logger.warning("the series cache could not be read; charts are read from the store", exc_info=True)
        found = {}
    result = {pk: found[name] for pk, name in ended.items() if name in found}
    missing = [run["pk"] for run in runs if run["pk"] not in result]
    if missing:
        computed = downsample_many(missing, key, start, end, points, arrays=True)
        result.update(computed)
        try:
            cache.set_many({ended[pk]: computed[pk] for pk in missing if pk in ended}, settings.SERIES_CACHE_SECONDS)
        except Exception:
            logger.warning("the series cache could not be written", exc_info=True)
    return result


def _cache_name(run: dict, key: str, start, end, points: int) -> str:
    written = run["metrics_at"].isoformat() if run["metrics_at"] else "-"
    query = hashlib.sha256(f"{key}\0{start}\0{end}\0{points}".encode()).hexdigest()[:32]
    return f"series:{run['uid'].hex}:{written}:{query}"


def as_lists(series: dict) -> dict:
    """A series of ``downsample_many(..., arrays=True)`` as JSON takes it: lists, ``None`` for a
    value that is not finite."""
    values = series["y"]
    return {**series, "x": series["x"].tolist(),
            "y": values.tolist() if np.isfinite(values).all() else [_finite_or_none(v) for v in values.tolist()]}


def _summary_level(run_ids: list[int], key: str, start, end, buckets: int) -> dict[int, tuple[list[tuple], set[int]]]:
    """The runs whose range holds at least ``buckets`` whole groups: {run: (the summaries of the
    groups inside the range, the groups the range's ends cut)}."""
    summaries = SeriesSummary.objects.filter(run_id__in=run_ids, key=key)
    if start is not None:
        summaries = summaries.filter(last_step__gte=start)
    if end is not None:
        summaries = summaries.filter(first_step__lte=end)
    inside: dict[int, list[tuple]] = {}
    cut: dict[int, set[int]] = {}
    for row in _fetch_bytes(summaries.order_by("run_id", "index").values_list(*SUMMARY_FIELDS)):
        whole = (start is None or row[2] >= start) and (end is None or row[3] <= end)
        if whole:
            inside.setdefault(row[0], []).append(row)
        else:
            cut.setdefault(row[0], set()).add(row[1])
    return {run_id: (rows, cut.get(run_id, set())) for run_id, rows in inside.items() if len(rows) >= buckets}


def _fetch_bytes(query) -> list[tuple]:
    """Rows of a ``values_list`` query. On PostgreSQL the payload comes in binary: hex-encoded text
    doubles what crosses the socket and its decoding was most of the compare page's query time."""
    if connection.vendor != "postgresql":
        return list(query)
    import psycopg

    sql, params = query.query.sql_with_params()
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, binary=True)
        return cursor.fetchall()


def _in_range(steps: np.ndarray, start, end) -> np.ndarray:
    keep = np.ones(len(steps), dtype=bool)
    if start is not None:
        keep &= steps >= start
    if end is not None:
        keep &= steps <= end
    return keep


def _from_points(key: str, steps: np.ndarray, values: np.ndarray, start, end, points: int) -> dict:
    keep = _in_range(steps, start, end)
    steps, values = steps[keep], values[keep]
    total = len(steps)
    if total <= points:
        return _series(key, steps, values, total, raw=True)
    buckets = (points - 1) // 2
    size = math.ceil(total / buckets)
    padded = np.full(buckets * size, np.nan)
    padded[:total] = values
    grid = padded.reshape(buckets, size)
    finite = np.isfinite(grid)
    has_any = finite.any(axis=1)
    low = np.where(finite, grid, np.inf).argmin(axis=1) + np.arange(buckets) * size
    high = np.where(finite, grid, -np.inf).argmax(axis=1) + np.arange(buckets) * size
    chosen = np.unique(np.concatenate([low[has_any], high[has_any], [total - 1]]))
    chosen = chosen[chosen < total]
    return _series(key, steps[chosen], values[chosen], total, raw=False)


def _from_summaries(key: str, rows: list[tuple], tail: Arrays | None, start, end, points: int) -> dict:
    """Buckets of whole rows (block or group summaries, or both), each bucket giving its extremes
    (vectorised: a 100M-point series is ~1,500 groups, a 10M-point one ~10k blocks). Rows are
    bucketed by the points they hold, in step order. Tail points past the rows are summarised like
    blocks, a block's worth at a time."""
    table = np.array(rows, dtype=np.float64)[:, 1:]  # None (a block of no finite value) becomes NaN
    end_of_rows = int(table[:, 2].max())
    if tail is not None:
        steps, values = tail
        keep = _in_range(steps, start, end) & (steps > end_of_rows)
        steps, values = steps[keep], values[keep]
        extra = [_summary_of(steps[i:i + BLOCK_SIZE], values[i:i + BLOCK_SIZE]) for i in range(0, len(steps), BLOCK_SIZE)]
        if extra:
            table = np.vstack([table, np.array(extra, dtype=np.float64)])
    table = table[np.argsort(table[:, 1], kind="stable")]
    _, _, last_step, count, min_value, min_step, max_value, max_step, last_value = table.T
    buckets = max(1, (points - 1) // 2)
    if len(table) <= buckets:
        bucket = np.arange(len(table))
    else:
        before = np.cumsum(count) - count
        bucket = np.floor(before * buckets / max(count.sum(), 1)).astype(np.int64)
    low = np.where(np.isnan(min_value), np.inf, min_value)
    high = np.where(np.isnan(max_value), -np.inf, max_value)
    by_low, by_high = np.lexsort((low, bucket)), np.lexsort((-high, bucket))  # stable: the earlier row on a tie
    first_of_bucket = np.r_[True, bucket[1:] != bucket[:-1]]  # bucket is sorted, and so stays sorted in both orders
    low_at, high_at = by_low[first_of_bucket], by_high[first_of_bucket]
    low_at, high_at = low_at[np.isfinite(low[low_at])], high_at[np.isfinite(high[high_at])]
    final = int(last_step.argmax())
    chosen_steps = np.concatenate([min_step[low_at], max_step[high_at], last_step[final:final + 1]])
    chosen_values = np.concatenate([min_value[low_at], max_value[high_at], last_value[final:final + 1]])
    order = np.argsort(chosen_steps, kind="stable")
    steps, values = chosen_steps[order].astype("<i8"), chosen_values[order]
    unique = np.r_[steps[1:] != steps[:-1], True]
    return _series(key, steps[unique], values[unique], int(count.sum()), raw=False)


def _digest_table(rows_per_run: list[list[tuple]], digests_per_run: list[list[bytes]]) -> np.ndarray:
    """Block rows (``SUMMARY_FIELDS``) and their digests -> one summary row (the columns past run_id)
    per digest row, in order: its extremes from the digest; its count; its block's index, step range
    and last value (rows of one block share them, so sorting by first step keeps their order and the
    last row reaching the highest step carries the block's last value)."""
    blocks = np.array([row for rows in rows_per_run for row in rows], dtype=np.float64).reshape(-1, len(SUMMARY_FIELDS))
    digests = [bytes(d) for found in digests_per_run for d in found]
    extremes = unpack_digest(b"".join(digests))
    spans = np.array([len(d) for d in digests], dtype=np.int64) // (8 * extremes.shape[1])
    block_of = np.repeat(np.arange(len(blocks)), spans)
    within = np.arange(len(block_of)) - np.repeat(np.cumsum(spans) - spans, spans)
    last_span = within == spans[block_of] - 1
    count = np.where(last_span, blocks[block_of, 4] - DIGEST_SPAN * within, DIGEST_SPAN)
    table = np.empty((len(block_of), 9))
    table[:, 0:3] = blocks[block_of, 1:4]  # index, first step, last step
    table[:, 3] = count
    table[:, 4:8] = extremes
    table[:, 8] = blocks[block_of, 9]
    return table


def _from_digests(run_ids: list[int], rows_of: dict[int, list[tuple]], digests: dict[int, list[bytes]], key: str,
                  points: int) -> dict[int, dict]:
    """``_from_summaries`` of each run's digest rows (no tail points), for many runs in one numpy pass:
    the same buckets and points, without a thousand runs' worth of small numpy calls."""
    buckets = max(1, (points - 1) // 2)
    table = _digest_table([rows_of[run_id] for run_id in run_ids], [digests[run_id] for run_id in run_ids])
    sizes = np.array([sum(len(bytes(d)) for d in digests[run_id]) for run_id in run_ids]) // (8 * 4)
    run_of = np.repeat(np.arange(len(run_ids)), sizes)
    start_of_run = np.cumsum(sizes) - sizes
    count = table[:, 3]
    totals = np.add.reduceat(count, start_of_run)
    before = np.cumsum(count) - np.repeat(np.cumsum(totals) - totals, sizes) - count
    by_points = np.floor(before * buckets / np.maximum(totals[run_of], 1)).astype(np.int64)
    bucket = np.where((sizes <= buckets)[run_of], np.arange(len(table)) - start_of_run[run_of], by_points)
    group = np.cumsum(np.r_[True, (run_of[1:] != run_of[:-1]) | (bucket[1:] != bucket[:-1])]) - 1
    low = np.where(np.isnan(table[:, 4]), np.inf, table[:, 4])
    high = np.where(np.isnan(table[:, 6]), -np.inf, table[:, 6])
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])

    def first_reaching(values, extreme):  # per group, the first row holding its extreme (the earlier row on a tie)
        hits = np.flatnonzero(values == extreme[group])
        return hits[np.unique(group[hits], return_index=True)[1]]

    low_at = first_reaching(low, np.minimum.reduceat(low, starts))
    high_at = first_reaching(high, np.maximum.reduceat(high, starts))
    low_at, high_at = low_at[np.isfinite(low[low_at])], high_at[np.isfinite(high[high_at])]
    last_row = start_of_run + sizes - 1  # the run's last block: its last step and value are the series' last point
    chosen_run = np.concatenate([run_of[low_at], run_of[high_at], np.arange(len(run_ids))])
    steps = np.concatenate([table[low_at, 5], table[high_at, 7], table[last_row, 2]]).astype("<i8")
    values = np.concatenate([table[low_at, 4], table[high_at, 6], table[last_row, 8]])
    order = np.lexsort((steps, chosen_run))
    chosen_run, steps, values = chosen_run[order], steps[order], values[order]
    keep = np.r_[(chosen_run[1:] != chosen_run[:-1]) | (steps[1:] != steps[:-1]), True]
    chosen_run, steps, values = chosen_run[keep], steps[keep], values[keep]
    bounds = np.searchsorted(chosen_run, np.arange(len(run_ids) + 1))
    return {run_id: _series(key, steps[bounds[i]:bounds[i + 1]], values[bounds[i]:bounds[i + 1]], int(totals[i]), raw=False)
            for i, run_id in enumerate(run_ids)}


def _summary_of(steps: np.ndarray, values: np.ndarray) -> list[float]:
    """A block-summary row (as ``SUMMARY_FIELDS`` past run_id) of some tail points."""
    finite = np.isfinite(values)
    if finite.any():
        lo = int(np.where(finite, values, np.inf).argmin())
        hi = int(np.where(finite, values, -np.inf).argmax())
        extremes = [values[lo], steps[lo], values[hi], steps[hi]]
    else:
        extremes = [np.nan, np.nan, np.nan, np.nan]
    return [np.nan, steps[0], steps[-1], len(steps), *extremes, values[-1]]


def _series(key: str, steps: np.ndarray, values: np.ndarray, total: int, raw: bool) -> dict:
    return {"key": key, "x": steps, "y": values, "raw": raw, "count": int(total),
            "last_step": int(steps[-1]) if len(steps) else -1}


def _pairs(steps: np.ndarray, values: np.ndarray) -> list[list]:
    return [[s, _finite_or_none(v)] for s, v in zip(steps.tolist(), values.tolist())]


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
