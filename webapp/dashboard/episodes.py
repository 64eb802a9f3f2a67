"""The episode store on the platform: every episode a run trained (and validated) on.

The training process's ``DashboardSink`` hands each step's records (``training.tracking.episodes``)
to its episode writer, whose thread stores them in two moves: the step's bodies go to the run's
artifact store as one Parquet file per split (``put_step_bodies``:
``<run folder>/episodes/<split>/step-<step>-a<attempt>-p<first position>.parquet``, the same
layout the library writes in a run folder of its own), outside any transaction, so a slow store
never holds the run's row (the heartbeats that wait for it); then, inside the transaction that
holds the run's row for its attempt, one ``StoredEpisode`` row per episode indexes them
(``index_step_bodies``). A file no row names is never read. A step written again (a retried batch,
a resumed attempt replaying it) replaces its rows.

Reads: ``filtered`` (the API's filters, on indexed columns), ``reward_histogram`` (one step's rewards
in bins), ``bodies`` (records read back from
Parquet, each file opened once), and ``jsonl_stream`` / ``parquet_stream`` (a whole filtered set,
a file at a time, in bounded memory, for at most ``max_seconds``: an export cut there ends with a
note, ``cut_note``, saying so and from which episode id the rest follows, ``after_id``).
"""

from __future__ import annotations

import functools
import io
import json
import math
import time
from typing import Any, Iterable, Iterator

from django.db import connection
from django.db.models import Q, Value
from django.db.models.functions import StrIndex, Upper

from training.errors import ArtifactStoreError
from training.tracking.episodes import read_records, search_text, step_file_name, to_parquet, to_table
from webapp.dashboard.models import StoredEpisode
from webapp.runs import artifacts
from webapp.runs.models import Run

# Rows read from the database at a time while a whole filtered set is streamed.
EXPORT_CHUNK = 500
# The fields of a listed episode (the API's pages).
LIST_FIELDS = ("id", "split", "step", "position", "group", "group_position", "data_source", "row_index", "reward",
               "advantage", "is_correct", "termination_reason", "num_turns", "prompt_length", "response_length", "error",
               "retokenization_drift", "drift_position")
# A record's fields the index keeps too; the rest (bodies) only the Parquet file.
_INDEXED = ("split", "step", "position", "group", "group_position", "data_source", "row_index", "reward", "advantage",
            "is_correct", "termination_reason", "num_turns", "prompt_length", "response_length", "retokenization_drift",
            "drift_position")


def episodes_prefix(run: Run) -> str:
    """Where ``run``'s episode files lie in the store: its folder's ``episodes/``."""
    prefix = artifacts.run_prefix(run) or f"{artifacts.RUNS_PREFIX}/{run.pk}-{run.uid.hex}"
    return f"{prefix}/episodes"


def store_step(run_id: int, attempt: int | None, step: int, records: list[dict[str, Any]]) -> int:
    """Store one step's records: a Parquet file per split in the artifact store, then their index
    rows. Returns how many episodes were stored. (The episode writer makes the two moves apart, the
    second under the run's row lock for its attempt.)"""
    return index_step_bodies(run_id, attempt, step, put_step_bodies(run_id, attempt, step, records))


def put_step_bodies(run_id: int, attempt: int | None, step: int,
                    records: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Write one step's records to the artifact store, a Parquet file per split named by the step,
    the attempt and the first position. Returns [(the file's key, its records)] for ``index_step_bodies``."""
    run = Run.objects.only("pk", "uid", "run_path").get(pk=run_id)
    prefix = episodes_prefix(run)
    files = []
    for split in (StoredEpisode.Split.TRAIN, StoredEpisode.Split.VALIDATION):
        part = sorted((dict(r, attempt=attempt) for r in records if r.get("split") == split), key=lambda r: r["position"])
        if not part:
            continue
        key = f"{prefix}/{split}/{step_file_name(step, part[0]['position'], attempt)}"
        artifacts.store().put_bytes(to_parquet(part), key)
        files.append((key, part))
    return files


def index_step_bodies(run_id: int, attempt: int | None, step: int, files: list[tuple[str, list[dict[str, Any]]]]) -> int:
    """The index rows of the files ``put_step_bodies`` wrote (in the writer's transaction, the run's
    row locked for ``attempt``), upserted: a step written again replaces its rows. Returns how many
    episodes they index."""
    stored = 0
    for key, part in files:
        rows = [_index_row(run_id, step, attempt, record, key, number) for number, record in enumerate(part)]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(_upsert_sql(), [[row[name] for row in rows] for name in _INDEX_ROW_COLUMNS])
        else:  # SQLite (the platform on a laptop): Django's upsert, a model instance a row
            StoredEpisode.objects.bulk_create([StoredEpisode(**row) for row in rows], update_conflicts=True,
                                              unique_fields=_UNIQUE, update_fields=_UPDATED)
        stored += len(rows)
    return stored


# An index row's fields; those naming it (a step's episode is stored once), and those a step
# written again replaces.
_INDEX_ROW_COLUMNS = ("run_id", *_INDEXED, "attempt", "error", "text", "body_key", "body_row")
_UNIQUE = ("run", "step", "split", "position")
_UPDATED = [name for name in _INDEX_ROW_COLUMNS if name not in ("run_id", "split", "step", "position")]


@functools.cache
def _upsert_sql() -> str:
    """Django's ``bulk_create(update_conflicts=True)`` as it runs on PostgreSQL (an array a column,
    UNNEST), with the values as ``_index_row`` made them: Django's own preparing of them (a model
    instance a row, a call a field and row) took half the supervisor's CPU for a step's index."""
    def column(name: str) -> str:
        return connection.ops.quote_name(StoredEpisode._meta.get_field(name).column)

    # Array types without their length (varchar[], not varchar(64)[]): a cast must not truncate.
    arrays = ", ".join(f"%s::{StoredEpisode._meta.get_field(name).db_type(connection).split('(')[0]}[]"
                       for name in _INDEX_ROW_COLUMNS)
    return (f"insert into {connection.ops.quote_name(StoredEpisode._meta.db_table)} "
            f"({', '.join(column(name) for name in _INDEX_ROW_COLUMNS)}) select * from unnest({arrays}) "
            f"on conflict ({', '.join(column(name) for name in _UNIQUE)}) "
            f"do update set {', '.join(f'{column(name)} = excluded.{column(name)}' for name in _UPDATED)}")


def _index_row(run_id: int, step: int, attempt: int | None, record: dict[str, Any], key: str, number: int) -> dict[str, Any]:
    """A record's index row: each field's value as the database takes it (what Django's fields would
    make of it)."""
    return {
        "run_id": run_id, "split": str(record["split"]), "step": int(step), "position": int(record["position"]),
        "attempt": attempt, "group": str(record.get("group") or "")[:64],
        "group_position": int(record.get("group_position") or 0), "data_source": str(record.get("data_source") or "")[:200],
        "row_index": _integer(record.get("row_index")), "reward": _finite(record.get("reward")),
        "advantage": _finite(record.get("advantage")), "is_correct": bool(record.get("is_correct")),
        "termination_reason": str(record.get("termination_reason") or "")[:40], "num_turns": int(record.get("num_turns") or 0),
        "prompt_length": int(record.get("prompt_length") or 0), "response_length": int(record.get("response_length") or 0),
        "error": str(record.get("error") or "")[:500],
        "retokenization_drift": None if record.get("retokenization_drift") is None else bool(record["retokenization_drift"]),
        "drift_position": _integer(record.get("drift_position")),
        "text": search_text(record).replace("\x00", ""), "body_key": key, "body_row": number,
    }


def filtered(run: Run, filters: dict[str, Any]):
    """``run``'s episodes that pass the API's filters (already validated), in order."""
    rows = StoredEpisode.objects.filter(run=run)
    if filters.get("split"):
        rows = rows.filter(split=filters["split"])
    if filters.get("step_min") is not None:
        rows = rows.filter(step__gte=filters["step_min"])
    if filters.get("step_max") is not None:
        rows = rows.filter(step__lte=filters["step_max"])
    if filters.get("reward_min") is not None:
        rows = rows.filter(reward__gte=filters["reward_min"])
    if filters.get("reward_max") is not None:
        rows = rows.filter(reward__lte=filters["reward_max"])
    for name in ("termination", "data_source", "group"):
        if filters.get(name):
            rows = rows.filter(**{"termination_reason" if name == "termination" else name: filters[name]})
    if filters.get("row_index") is not None:
        rows = rows.filter(row_index=filters["row_index"])
    if filters.get("drift") is not None:
        rows = rows.filter(retokenization_drift=filters["drift"])
    if filters.get("q"):
        rows = _with_text(rows, run, filters)
    if filters.get("after_id") is not None:  # an export cut at its time limit goes on here
        rows = rows.filter(id__gt=filters["after_id"])
    if filters.get("cursor"):  # a page's next: the episodes after the last one listed, in the listing's order
        step, split, position = filters["cursor"]
        rows = rows.filter(Q(step__gt=step) | Q(split__gt=split) | Q(split=split, position__gt=position), step__gte=step)
    return rows.order_by("step", "split", "position")


def cursor_of(row: dict[str, Any]) -> str:
    """The ``cursor`` that lists the episodes after ``row`` (a listed one): its step, split and
    position, the listing's order. Each page starts where the last ended (the unique index's range),
    however deep, where an offset would walk past every episode before it."""
    return f"{row['step']}:{row['split']}:{row['position']}"


# A step range of at most this many episodes is searched for ``q`` row by row (a substring test
# each: about 1 ms per 1,000 short texts); a wider one, or none, through the trigram index. The
# planner cannot weigh the two (its guess of a pattern's selectivity is blind): given both, it ANDed
# the trigram index with a range of 10,000 episodes, 45 ms where the range's own scan took 11
# (bench/episodes.py). The range is counted, not estimated (at most this many entries of the unique
# index, about 1.5 ms): the planner's estimate multiplies the run's share of the table by the range's
# share over every run, 2.5 times too many where other runs' steps overlap.
TEXT_SCAN_MAX_EPISODES = 20_000


def _with_text(rows, run: Run, filters: dict[str, Any]):
    """``rows`` whose text holds ``q`` (case-insensitive)."""
    query = filters["q"]
    if filters.get("step_min") is None and filters.get("step_max") is None:
        return rows.filter(text__icontains=query)
    in_range = StoredEpisode.objects.filter(run=run).order_by().values("step")
    if filters.get("step_min") is not None:
        in_range = in_range.filter(step__gte=filters["step_min"])
    if filters.get("step_max") is not None:
        in_range = in_range.filter(step__lte=filters["step_max"])
    if in_range[:TEXT_SCAN_MAX_EPISODES + 1].count() > TEXT_SCAN_MAX_EPISODES:
        return rows.filter(text__icontains=query)
    # STRPOS is what icontains's LIKE tests, in a form no index answers: the range's scan is the plan.
    return rows.alias(found_at=StrIndex(Upper("text"), Upper(Value(query)))).filter(found_at__gt=0)


# One round trip: the split's first and last steps, the step's totals and its bins (each bin's count,
# least and greatest reward), all read from the unique (run, step, split, position) index.
_HISTOGRAM_SQL = """
    with span as (
        select (select min(step) from dashboard_storedepisode where run_id = %(run)s and split = %(split)s) as first,
               (select max(step) from dashboard_storedepisode where run_id = %(run)s and split = %(split)s) as last),
    chosen as (select coalesce(%(step)s, span.last) as step from span),
    rows as (select reward from dashboard_storedepisode, chosen
             where run_id = %(run)s and split = %(split)s and dashboard_storedepisode.step = chosen.step),
    totals as (select count(*) as count, count(reward) as scored, min(reward) as low, max(reward) as high from rows)
    select span.first, span.last, chosen.step, totals.count, totals.scored, totals.low, totals.high,
           least(width_bucket(rows.reward, totals.low, totals.high, %(bins)s), %(bins)s), count(rows.reward),
           min(rows.reward), max(rows.reward)
    from span cross join chosen cross join totals
         left join rows on rows.reward is not null and totals.high > totals.low
    group by 1, 2, 3, 4, 5, 6, 7, 8
"""


def reward_histogram(run: Run, split: str, step: int | None, bins: int) -> dict[str, Any]:
    """The rewards of one step's ``split`` episodes (default: the last step stored) in ``bins`` equal
    bins from their least to their greatest, counted by the database in one query. Each bin also says
    the least and greatest reward in it: the listing's ``reward_min`` and ``reward_max`` set to those
    open exactly its episodes, where the bin's edges, shared with its neighbours, might open one of
    theirs too. Every reward equal: one bin."""
    with connection.cursor() as cursor:
        cursor.execute(_HISTOGRAM_SQL, {"run": run.pk, "split": split, "step": step, "bins": bins})
        found = cursor.fetchall()
    first, last, step, count, scored, low, high = found[0][:7]
    result = {"split": split, "step": step, "first_step": first, "last_step": last,
              "count": count, "no_reward": count - scored, "bins": []}
    if low is None:
        return result
    if high <= low:
        result["bins"] = [{"low": low, "high": high, "count": scored, "reward_min": low, "reward_max": high}]
        return result
    # width_bucket puts the greatest reward past the last bin: the query counts it in the last one.
    counted = {row[7]: row[8:] for row in found}
    width = (high - low) / bins
    for number in range(1, bins + 1):
        tally, least, greatest = counted.get(number, (0, None, None))
        result["bins"].append({"low": low + (number - 1) * width, "high": high if number == bins else low + number * width,
                               "count": tally, "reward_min": least, "reward_max": greatest})
    return result


def listed(row: StoredEpisode) -> dict[str, Any]:
    return {name: getattr(row, name) for name in LIST_FIELDS}


def bodies(rows: Iterable[StoredEpisode]) -> Iterator[tuple[StoredEpisode, dict[str, Any]]]:
    """Each row with its record read back from its Parquet file (each file opened once), in the
    rows' order. A row whose file is gone (its run's folder deleted by hand, a store emptied) or
    whose record is missing gets ``{"body_missing": True}``; a store that cannot be read raises
    ArtifactStoreError (the API answers 503 naming it)."""
    rows = list(rows)
    by_key: dict[str, list[int]] = {}
    for row in rows:
        by_key.setdefault(row.body_key, []).append(row.body_row)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    store = artifacts.store()
    for key, numbers in by_key.items():
        try:
            handle = store.open(key)
        except ArtifactStoreError:
            if store.exists(key):  # there but unreadable, or the store is away: say so
                raise
            continue
        with handle:
            for number, record in zip(numbers, read_records(handle, numbers)):
                found[(key, number)] = record
    for row in rows:
        yield row, found.get((row.body_key, row.body_row), MISSING_BODY)


MISSING_BODY = {"body_missing": True}


def detail(row: StoredEpisode) -> dict[str, Any]:
    """One episode whole: its index fields and its body."""
    _, record = next(bodies([row]))
    return {**listed(row), **_body(record), "attempt": row.attempt}


def _body(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": record.get("prompt"), "turns": record.get("turns") or [],
        "prompt_ids": record.get("prompt_ids") or [], "token_ids": record.get("token_ids") or [],
        "token_texts": record.get("token_texts") or [],
        "mask": record.get("mask") or [], "logprobs": record.get("logprobs") or [],
        "reward_components": record.get("reward_components") or {},
        "generation_seconds": record.get("generation_seconds"), "env_seconds": record.get("env_seconds"),
        "episode_seconds": record.get("episode_seconds"), "traceback": record.get("traceback") or "",
        "body_missing": bool(record.get("body_missing")),
    }


# The key of the note an export cut at its time limit ends with: the last line of a JSON lines
# export, an entry of a Parquet export's key-value metadata.
CUT_KEY = "export_cut"


def cut_note(seconds: float, written: int, last_id: int | None) -> dict[str, Any]:
    """What an export cut at its time limit says: how much it holds, and how to fetch the rest."""
    rest = f"after_id={last_id}" if last_id is not None else "the same query"
    return {"cut": True, "seconds": round(seconds, 1), "episodes": written, "last_id": last_id, "message": (
        f"This export was cut after {seconds:.0f} s (the server's limit) with {written} episode(s), up to episode id "
        f"{last_id}: the rest follows with {rest} (or narrow the filters, e.g. step_min/step_max).")}


def _chunks(rows, deadline: float | None = None) -> Iterator[list[StoredEpisode]]:
    """The filtered rows a chunk at a time, by primary key order within the set's order (keyset, not
    offsets); none more once ``deadline`` (``time.monotonic()``) is past."""
    last = None
    while deadline is None or time.monotonic() < deadline:
        chunk = list(rows.filter(id__gt=last)[:EXPORT_CHUNK] if last is not None else rows[:EXPORT_CHUNK])
        if not chunk:
            return
        yield chunk
        if len(chunk) < EXPORT_CHUNK:
            return
        last = chunk[-1].id


def jsonl_stream(rows, max_seconds: float | None = None) -> Iterator[bytes]:
    """The whole filtered set as JSON lines, one episode (index fields and body) a line; cut after
    ``max_seconds``, with a last line ``{"export_cut": cut_note(...)}``."""
    started = time.monotonic()
    deadline = None if max_seconds is None else started + max_seconds
    written, last_id = 0, None
    for chunk in _chunks(rows.order_by("id"), deadline):
        yield b"".join(
            (json.dumps({**listed(row), "attempt": row.attempt, **_body(record)}, default=str) + "\n").encode()
            for row, record in bodies(chunk)
        )
        written, last_id = written + len(chunk), chunk[-1].id
    if deadline is not None and time.monotonic() >= deadline and rows.filter(id__gt=last_id or 0).exists():
        yield (json.dumps({CUT_KEY: cut_note(time.monotonic() - started, written, last_id)}) + "\n").encode()


def parquet_stream(rows, max_seconds: float | None = None) -> Iterator[bytes]:
    """The whole filtered set as one Parquet file (the library's columns plus ``id``), written a
    chunk at a time as row groups; cut after ``max_seconds``, the file's key-value metadata then
    holding ``export_cut`` (``cut_note`` as JSON)."""
    import pyarrow as pa  # a dependency of datasets; imported where Parquet is written
    import pyarrow.parquet as pq

    started = time.monotonic()
    deadline = None if max_seconds is None else started + max_seconds
    written, last_id = 0, None
    sink = _Drain()
    writer = None
    for chunk in _chunks(rows.order_by("id"), deadline):
        written, last_id = written + len(chunk), chunk[-1].id
        records = [{**record, **{name: getattr(row, name) for name in _INDEXED}, "attempt": row.attempt}
                   for row, record in bodies(chunk)]
        table = to_table(records)
        table = table.append_column("id", pa.array([row.id for row in chunk], pa.int64()))
        if writer is None:
            writer = pq.ParquetWriter(sink, table.schema, compression="zstd")
        writer.write_table(table)
        yield sink.take()
    if writer is None:  # nothing matched: an empty file with the columns
        table = to_table([]).append_column("id", pa.array([], pa.int64()))
        writer = pq.ParquetWriter(sink, table.schema)
        writer.write_table(table)
    if deadline is not None and time.monotonic() >= deadline and rows.filter(id__gt=last_id or 0).exists():
        writer.add_key_value_metadata({CUT_KEY: json.dumps(cut_note(time.monotonic() - started, written, last_id))})
    writer.close()
    yield sink.take()


class _Drain(io.RawIOBase):
    """A write-only file whose bytes are taken as they come (a streamed response's next chunk)."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        self._chunks.append(data)
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def take(self) -> bytes:
        data, self._chunks = b"".join(self._chunks), []
        return data


def _integer(value: Any) -> int | None:
    return None if value is None else int(value)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
