"""Writing metric points into blocks, and reading them back raw or downsampled.

Downsampling keeps spikes: every bucket contributes its minimum and its maximum, each at the step
where it happened, and the series' last point is always included. Long ranges are answered from
block summaries alone (no point payload is read); short ones decode the blocks' points with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from django.db import connection, transaction
from django.db.models import Max, OuterRef, Subquery, Sum

from webapp.dashboard.models import BLOCK_SIZE, SeriesBlock, unpack
from webapp.runs.models import Run

# Points per series per chart: a bucket gives two (its min and max), plus the last point.
DEFAULT_POINTS = 1500
MAX_POINTS = 5000
# Up to this many blocks in a range their points are read and bucketed; past it the summaries do.
PAYLOAD_BLOCK_LIMIT = 64
SUMMARY_FIELDS = ("run_id", "key", "index", "first_step", "last_step", "count",
                  "min_value", "min_step", "max_value", "max_step", "last_value")


class SeriesWriter:
    """Appends points of one run to its blocks.

    Each write reads the open blocks it extends in the same transaction, under a lock on the run's
    row: two writers of one run (an attempt resumed beside the one it replaced, reports arriving
    over the API at once) each rewriting an open block from their own copy would drop each other's
    points. A step written again replaces its value, so a replayed step is stored once.
    """

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id

    def write(self, points: Iterable[tuple[str, int, float | None]]) -> int:
        """Store ``(key, step, value)`` points; a step sent again replaces its value. Returns how many."""
        by_key: dict[str, dict[int, float]] = {}
        count = 0
        for key, step, value in points:
            clean = math.nan if value is None or not math.isfinite(value) else float(value)
            by_key.setdefault(key, {})[int(step)] = clean
            count += 1
        if not by_key:
            return 0
        with transaction.atomic():
            list(Run.objects.select_for_update().filter(pk=self.run_id).values_list("pk"))
            opened = self._open_blocks(list(by_key))
            rows: list[SeriesBlock] = []
            for key, new in by_key.items():
                index, steps, values = opened.get(key, (0, [], []))
                if index > 0 and min(new) < (steps[0] if steps else math.inf):
                    rows.extend(self._rewrite_closed(key, new, index))
                merged = dict(zip(steps, values))
                merged.update(new)
                ordered = sorted(merged.items())
                while ordered:
                    chunk, ordered = ordered[:BLOCK_SIZE], ordered[BLOCK_SIZE:]
                    rows.append(block_row(self.run_id, key, index, chunk))
                    index += 1
            if rows:
                SeriesBlock.objects.bulk_create(
                    rows, update_conflicts=True, unique_fields=["run", "key", "index"],
                    update_fields=["first_step", "last_step", "count", "min_value", "min_step", "max_value",
                                   "max_step", "last_value", "steps", "values"],
                )
        return count

    def _rewrite_closed(self, key: str, new: dict[int, float], open_index: int) -> list[SeriesBlock]:
        """Re-sent steps that live in already full blocks replace their values there (and leave ``new``)."""
        rows = []
        old = SeriesBlock.objects.filter(run_id=self.run_id, key=key, index__lt=open_index,
                                         first_step__lte=max(new), last_step__gte=min(new))
        for block in old:
            steps, values = block.arrays()
            values = values.copy()
            position = {s: i for i, s in enumerate(steps.tolist())}
            hits = [s for s in new if s in position]
            for step in hits:
                values[position[step]] = new.pop(step)
            if hits:
                rows.append(block_row(self.run_id, key, block.index, list(zip(steps.tolist(), values.tolist()))))
        return rows

    def _open_blocks(self, keys: list[str]) -> dict[str, tuple[int, list[int], list[float]]]:
        """{key: (index, steps, values)} of the block each key's next points go to (one query)."""
        last_index = SeriesBlock.objects.filter(run_id=OuterRef("run_id"), key=OuterRef("key")).order_by("-index").values("index")[:1]
        opened = {}
        for last in SeriesBlock.objects.filter(run_id=self.run_id, key__in=keys, index=Subquery(last_index)):
            if last.count >= BLOCK_SIZE:
                opened[last.key] = (last.index + 1, [], [])
            else:
                steps, values = last.arrays()
                opened[last.key] = (last.index, steps.tolist(), values.tolist())
        return opened


def block_row(run_id: int, key: str, index: int, points: list[tuple[int, float]]) -> SeriesBlock:
    steps = np.fromiter((s for s, _ in points), dtype="<i8", count=len(points))
    values = np.fromiter((v for _, v in points), dtype="<f8", count=len(points))
    finite = np.isfinite(values)
    extremes = {}
    if finite.any():
        masked_low = np.where(finite, values, np.inf)
        masked_high = np.where(finite, values, -np.inf)
        lo, hi = int(masked_low.argmin()), int(masked_high.argmax())
        extremes = {"min_value": float(values[lo]), "min_step": int(steps[lo]),
                    "max_value": float(values[hi]), "max_step": int(steps[hi])}
    return SeriesBlock(
        run_id=run_id, key=key, index=index, first_step=int(steps[0]), last_step=int(steps[-1]),
        count=len(points), last_value=_finite_or_none(values[-1]), steps=steps.tobytes(), values=values.tobytes(),
        **extremes,
    )


# -- reading ---------------------------------------------------------------------------------------

def keys_of(run_id: int) -> list[str]:
    return sorted(SeriesBlock.objects.filter(run_id=run_id).values_list("key", flat=True).distinct())


def keys_of_runs(run_ids: list[int]) -> list[str]:
    """Every key any of these runs has logged."""
    return sorted(SeriesBlock.objects.filter(run_id__in=run_ids).values_list("key", flat=True).distinct())


def last_step_of(run_id: int) -> int:
    """The highest step any key of the run has reached (-1 for none)."""
    value = SeriesBlock.objects.filter(run_id=run_id).aggregate(m=Max("last_step"))["m"]
    return -1 if value is None else int(value)


def count_after(run_id: int, after: int) -> int:
    """An upper bound on how many points of the run lie after ``after`` (whole blocks are counted)."""
    return SeriesBlock.objects.filter(run_id=run_id, last_step__gt=after).aggregate(n=Sum("count"))["n"] or 0


def points_after(run_id: int, after: int, through: int | None = None) -> dict[str, list[list]]:
    """Every point with ``after < step <= through``, as {key: [[step, value], ...]} sorted by step."""
    blocks = SeriesBlock.objects.filter(run_id=run_id, last_step__gt=after)
    if through is not None:
        blocks = blocks.filter(first_step__lte=through)
    result: dict[str, list[list]] = {}
    for key, raw_steps, raw_values in blocks.order_by("key", "index").values_list("key", "steps", "values"):
        steps, values = unpack(raw_steps, raw_values)
        keep = steps > after
        if through is not None:
            keep &= steps <= through
        if keep.any():
            result.setdefault(key, []).extend(_pairs(steps[keep], values[keep]))
    return result


def downsample(run_id: int, key: str, start: int | None = None, end: int | None = None,
               points: int = DEFAULT_POINTS) -> dict:
    """The series ``key`` of a run between steps ``start`` and ``end``, at most about ``points`` points."""
    return downsample_many([run_id], key, start, end, points)[run_id]


def downsample_many(run_ids: list[int], key: str, start: int | None = None, end: int | None = None,
                    points: int = DEFAULT_POINTS) -> dict[int, dict]:
    """``downsample`` for several runs with two queries in all (the compare page's hundred runs)."""
    points = max(8, min(int(points), MAX_POINTS))
    blocks = SeriesBlock.objects.filter(run_id__in=run_ids, key=key)
    if start is not None:
        blocks = blocks.filter(last_step__gte=start)
    if end is not None:
        blocks = blocks.filter(first_step__lte=end)
    summaries: dict[int, list[dict]] = {run_id: [] for run_id in run_ids}
    for row in blocks.order_by("run_id", "index").values(*SUMMARY_FIELDS):
        summaries[row["run_id"]].append(row)
    # One more query reads the points of the runs whose range spans few blocks (the same blocks).
    needs_payload = [run_id for run_id, rows in summaries.items() if 0 < len(rows) <= PAYLOAD_BLOCK_LIMIT]
    payloads: dict[int, list[tuple[bytes, bytes]]] = {}
    if needs_payload:
        query = blocks.filter(run_id__in=needs_payload).order_by("run_id", "index").values_list("run_id", "steps", "values")
        for run_id, raw_steps, raw_values in _fetch_bytes(query):
            payloads.setdefault(run_id, []).append((raw_steps, raw_values))
    result = {}
    for run_id, rows in summaries.items():
        if run_id in payloads:
            result[run_id] = _from_points(key, payloads[run_id], start, end, points)
        else:
            result[run_id] = _from_summaries(key, rows, points)
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


def _from_points(key: str, payload: list[tuple[bytes, bytes]], start, end, points: int) -> dict:
    steps, values = unpack(b"".join(s for s, _ in payload), b"".join(v for _, v in payload))
    keep = np.ones(len(steps), dtype=bool)
    if start is not None:
        keep &= steps >= start
    if end is not None:
        keep &= steps <= end
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


def _from_summaries(key: str, rows: list[dict], points: int) -> dict:
    if not rows:
        return _series(key, np.array([], dtype="<i8"), np.array([]), 0, raw=True)
    buckets = max(1, (points - 1) // 2)
    per_bucket = math.ceil(len(rows) / buckets)
    chosen: dict[int, float] = {}
    for first in range(0, len(rows), per_bucket):
        group = [r for r in rows[first:first + per_bucket] if r["min_value"] is not None]
        if group:
            low = min(group, key=lambda r: r["min_value"])
            high = max(group, key=lambda r: r["max_value"])
            chosen[low["min_step"]] = low["min_value"]
            chosen[high["max_step"]] = high["max_value"]
    last = rows[-1]
    chosen[last["last_step"]] = math.nan if last["last_value"] is None else last["last_value"]
    ordered = sorted(chosen.items())
    steps = np.array([s for s, _ in ordered], dtype="<i8")
    values = np.array([v for _, v in ordered], dtype="<f8")
    return _series(key, steps, values, sum(r["count"] for r in rows), raw=False)


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
