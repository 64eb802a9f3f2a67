"""The metric store: writing points, folding them into blocks, and reading them back raw or
downsampled. Nothing above this module knows how points are laid out (``webapp.dashboard.models``).

Writing: each ``SeriesWriter.write`` appends one ``SeriesTail`` row with every point of the batch
and keeps each key's latest value on the run's row (``Run.latest_values``, ``Run.steps``), so no
page ever walks points to show them. Once the run's tail holds ``TAIL_FOLD_POINTS`` points, or the
run ends, the tail is folded into per-key blocks.

Reading: the blocks, then the tail on top; a (key, step) present twice keeps its latest value.
Downsampling keeps spikes: every bucket contributes its minimum and its maximum, each at the step
where it happened, and the series' last point is always included. Long ranges are answered from
block summaries alone (no point payload is read); short ones decode the blocks' points with numpy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import numpy as np
from django.db import connection, transaction
from django.db.models import Max, Min, Sum
from django.utils import timezone

from webapp.dashboard.models import BLOCK_SIZE, TAIL_FOLD_POINTS, SeriesBlock, SeriesTail, unpack
from webapp.runs.models import Run

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

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id

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
        with transaction.atomic():
            run = Run.objects.select_for_update().filter(pk=self.run_id).values("latest_values", "steps", "tail_points").first()
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
                                                    "max_value", "max_step", "last_value", "steps", "values"])
    SeriesBlock.objects.bulk_create(new_blocks, batch_size=500)
    SeriesTail.objects.filter(run_id=run_id, id__lte=max(row[1] for row in rows)).delete()
    return sum(len(s) for s, _ in tail.values())


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
        **extremes,
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

def keys_of(run_id: int) -> list[str]:
    """Every key the run has logged (kept on its row by the writer)."""
    values = Run.objects.filter(pk=run_id).values_list("latest_values", flat=True).first()
    return sorted(values or {})


def keys_of_runs(run_ids: list[int]) -> list[str]:
    """Every key any of these runs has logged."""
    keys: set[str] = set()
    for values in Run.objects.filter(pk__in=run_ids).values_list("latest_values", flat=True):
        keys.update(values or {})
    return sorted(keys)


def last_step_of(run_id: int) -> int:
    """The highest step any key of the run has reached (-1 for none)."""
    block = SeriesBlock.objects.filter(run_id=run_id).aggregate(m=Max("last_step"))["m"]
    tail = SeriesTail.objects.filter(run_id=run_id).aggregate(m=Max("last_step"))["m"]
    found = [int(v) for v in (block, tail) if v is not None]
    return max(found, default=-1)


def count_after(run_id: int, after: int) -> int:
    """An upper bound on how many points of the run lie after ``after`` (whole blocks and tail rows are counted)."""
    blocks = SeriesBlock.objects.filter(run_id=run_id, last_step__gt=after).aggregate(n=Sum("count"))["n"] or 0
    return blocks + (SeriesTail.objects.filter(run_id=run_id, last_step__gt=after).aggregate(n=Sum("count"))["n"] or 0)


def points_after(run_id: int, after: int, through: int | None = None) -> dict[str, list[list]]:
    """Every point with ``after < step <= through``, as {key: [[step, value], ...]} sorted by step."""
    return {key: _pairs(steps, values) for key, (steps, values) in arrays_after(run_id, after, through).items()}


def arrays_after(run_id: int, after: int, through: int | None = None, keys: list[str] | None = None) -> dict[str, Arrays]:
    """``points_after`` as numpy arrays: {key: (steps, values)}, each step once, sorted by step."""
    blocks = SeriesBlock.objects.filter(run_id=run_id, last_step__gt=after)
    if through is not None:
        blocks = blocks.filter(first_step__lte=through)
    if keys is not None:
        blocks = blocks.filter(key__in=keys)
    parts: dict[str, list[Arrays]] = {}
    for key, raw_steps, raw_values in _fetch_bytes(blocks.order_by("key", "index").values_list("key", "steps", "values")):
        parts.setdefault(key, []).append(unpack(raw_steps, raw_values))
    for key, arrays in _tail([run_id]).get(run_id, {}).items():
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


def downsample_many(run_ids: list[int], key: str, start: int | None = None, end: int | None = None,
                    points: int = DEFAULT_POINTS) -> dict[int, dict]:
    """``downsample`` for several runs with three queries in all (the compare page's runs)."""
    points = max(8, min(int(points), MAX_POINTS))
    blocks = SeriesBlock.objects.filter(run_id__in=run_ids, key=key)
    if start is not None:
        blocks = blocks.filter(last_step__gte=start)
    if end is not None:
        blocks = blocks.filter(first_step__lte=end)
    summaries: dict[int, list[tuple]] = {run_id: [] for run_id in run_ids}
    for row in _fetch_bytes(blocks.order_by("run_id", "index").values_list(*SUMMARY_FIELDS)):
        summaries[row[0]].append(row)
    # One more query reads the points of the runs whose range spans few blocks (the same blocks).
    needs_payload = [run_id for run_id, rows in summaries.items() if 0 < len(rows) <= PAYLOAD_BLOCK_LIMIT]
    payloads: dict[int, list[Arrays]] = {}
    if needs_payload:
        query = blocks.filter(run_id__in=needs_payload).order_by("run_id", "index").values_list("run_id", "steps", "values")
        for run_id, raw_steps, raw_values in _fetch_bytes(query):
            payloads.setdefault(run_id, []).append(unpack(raw_steps, raw_values))
    tails = _tail(run_ids)
    result = {}
    for run_id, rows in summaries.items():
        tail = tails.get(run_id, {}).get(key)
        if len(rows) <= PAYLOAD_BLOCK_LIMIT:
            steps, values = _merge(payloads.get(run_id, []) + ([tail] if tail is not None else []))
            result[run_id] = _from_points(key, steps, values, start, end, points)
        else:
            result[run_id] = _from_summaries(key, rows, tail, start, end, points)
    return result


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
    """Buckets of whole blocks, each giving its extremes (vectorised: a 10M-point series is ~10k
    blocks). Tail points past the blocks are summarised the same way, a block's worth at a time."""
    table = np.array(rows, dtype=np.float64)[:, 1:]  # None (a block of no finite value) becomes NaN
    _, _, last_step, count, min_value, min_step, max_value, max_step, last_value = table.T
    end_of_blocks = int(last_step.max())
    if tail is not None:
        steps, values = tail
        keep = _in_range(steps, start, end) & (steps > end_of_blocks)
        steps, values = steps[keep], values[keep]
        extra = [_summary_of(steps[i:i + BLOCK_SIZE], values[i:i + BLOCK_SIZE]) for i in range(0, len(steps), BLOCK_SIZE)]
        if extra:
            table = np.vstack([table, np.array(extra, dtype=np.float64)])
            _, _, last_step, count, min_value, min_step, max_value, max_step, last_value = table.T
    buckets = max(1, (points - 1) // 2)
    per_bucket = math.ceil(len(table) / buckets)
    groups = math.ceil(len(table) / per_bucket)
    pad = groups * per_bucket - len(table)
    low = np.pad(np.where(np.isnan(min_value), np.inf, min_value), (0, pad), constant_values=np.inf).reshape(groups, per_bucket)
    high = np.pad(np.where(np.isnan(max_value), -np.inf, max_value), (0, pad), constant_values=-np.inf).reshape(groups, per_bucket)
    low_at = low.argmin(axis=1) + np.arange(groups) * per_bucket
    high_at = high.argmax(axis=1) + np.arange(groups) * per_bucket
    has_low = np.isfinite(low.min(axis=1))
    chosen_steps = np.concatenate([min_step[low_at[has_low]], max_step[high_at[has_low]], last_step[-1:]])
    chosen_values = np.concatenate([min_value[low_at[has_low]], max_value[high_at[has_low]], last_value[-1:]])
    order = np.argsort(chosen_steps, kind="stable")
    steps, values = chosen_steps[order].astype("<i8"), chosen_values[order]
    unique = np.r_[steps[1:] != steps[:-1], True]
    return _series(key, steps[unique], values[unique], int(count.sum()), raw=False)


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
    return {
        "key": key, "x": steps.tolist(),
        "y": values.tolist() if np.isfinite(values).all() else [_finite_or_none(v) for v in values.tolist()],
        "raw": raw, "count": int(total), "last_step": int(steps[-1]) if len(steps) else -1,
    }


def _pairs(steps: np.ndarray, values: np.ndarray) -> list[list]:
    return [[s, _finite_or_none(v)] for s, v in zip(steps.tolist(), values.tolist())]


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
