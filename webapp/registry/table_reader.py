"""Reads an uploaded table (CSV, JSONL or Parquet) in a child process of its own, under CPU-time and
memory limits, and writes its rows as JSON lines to a file: the web process never holds them.

What an upload costs to read is not its size: a few kilobytes of Parquet unpack to hundreds of
megabytes, and a parsed row costs several times its bytes as Python objects. So the child reads the
file, checks every limit as it goes (rows, columns, characters per cell, bytes of text in all,
nesting), writes each row as one JSON line, and answers one JSON object on stdout: the columns, the
row count, the first rows (cells cut for display) and, per column, the first row where it is empty
(so a column mapping is checked without the rows); or ``{"error": "..."}`` naming the row, the
column and the limit. No Django here: the child imports the standard library, and pyarrow for
Parquet only.

    python -m webapp.registry.table_reader KIND SOURCE ROWS_OUT LIMITS_JSON
"""

from __future__ import annotations

import csv
import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Nesting deeper than this is refused: Python's JSON parser raises RecursionError past about a
# thousand levels, and every recursive step after it (dumping a row, a template) risks the same.
MAX_JSON_DEPTH = 32


class ReadError(ValueError):
    """What is wrong with the file, or which limit stopped reading it, in words a person can act on."""


@dataclass(frozen=True)
class ReadLimits:
    max_rows: int
    max_columns: int
    max_cell_chars: int
    max_text_bytes: int  # the rows as JSON lines, all together
    memory_mb: int
    cpu_seconds: int
    preview_rows: int = 10
    preview_chars: int = 200


def read(kind: str, source: Path, rows_out: Path, limits: ReadLimits) -> dict[str, Any]:
    """Run the child on the file at ``source``; its summary (the rows are in ``rows_out``), or
    ReadError saying what is wrong or which limit stopped it."""
    env = {"PATH": os.environ.get("PATH", ""), "ARROW_DEFAULT_MEMORY_POOL": "system", "PYTHONPATH": os.pathsep.join(sys.path)}
    wall = limits.cpu_seconds * 2 + 10
    try:
        done = subprocess.run(
            [sys.executable, "-m", "webapp.registry.table_reader", kind, str(source), str(rows_out),
             json.dumps(asdict(limits))],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=wall, env=env,
        )
    except subprocess.TimeoutExpired:
        raise ReadError(f"Reading the file took longer than {wall} s.") from None
    if done.returncode != 0 or not done.stdout:
        if done.returncode in (-9, -24) or b"CPU" in done.stderr:  # SIGKILL / SIGXCPU from the CPU limit
            raise ReadError(f"Reading the file took more than {limits.cpu_seconds} s of CPU time (the limit).")
        if b"MemoryError" in done.stderr or b"bad_alloc" in done.stderr or b"Out of memory" in done.stderr:
            raise ReadError(f"Reading the file needs more than {limits.memory_mb} MB of memory (the limit).")
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise ReadError(f"The file cannot be read ({tail[0][:300]}).")
    answer = json.loads(done.stdout)
    if "error" in answer:
        raise ReadError(answer["error"])
    return answer


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests more than ``limit`` containers deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def cell_text(value: Any) -> str:
    """A cell as a person reads it (and as the limits count it): text as is, other values as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


class _Refused(Exception):
    """The child's refusal of the file, answered as {"error": ...}."""


def _check_header(columns: list[str], max_columns: int, where: str) -> None:
    if len(columns) > max_columns:
        raise _Refused(f"{where}: {len(columns)} columns, more than the limit of {max_columns}.")
    seen: set[str] = set()
    for number, column in enumerate(columns, start=1):
        if not str(column).strip():
            raise _Refused(f"{where}: column {number} has no name; give every column a name.")
        if column in seen:
            raise _Refused(f"{where}: column {column!r} appears twice; column names must be unique.")
        seen.add(column)


def _too_many_rows(limit: int) -> _Refused:
    return _Refused(f"More than {limit:,} rows (the limit); split the file or ask an administrator to raise the limit.")


def _csv_rows(source: Path, limits: ReadLimits) -> Iterator[tuple[str, dict]]:
    with open(source, encoding="utf-8-sig", newline="") as text:
        reader = csv.reader(text, strict=True)
        try:
            header = next(reader, None)
            if not header:
                raise _Refused("The CSV file is empty; its first line must name the columns.")
            _check_header(header, limits.max_columns, "The header (line 1)")
            number = 0
            for fields in reader:
                if not fields:
                    continue
                number += 1
                if len(fields) != len(header):
                    raise _Refused(f"Row {number} (line {reader.line_num}): {len(fields)} field(s), but the header has "
                                   f"{len(header)} ({', '.join(header)}); quote values that contain commas.")
                yield f"Row {number} (line {reader.line_num})", dict(zip(header, fields))
        except csv.Error as exc:
            raise _Refused(f"Line {reader.line_num}: not valid CSV ({exc}; an unclosed quote?).") from None
        except UnicodeDecodeError as exc:
            raise _Refused(f"Around line {reader.line_num + 1}: not UTF-8 text (byte {exc.start} of a read block); "
                           "save the file as UTF-8.") from None


def _jsonl_rows(source: Path, limits: ReadLimits) -> Iterator[tuple[str, dict]]:
    number = 0
    with open(source, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
            except UnicodeDecodeError:
                raise _Refused(f"Line {line_number}: not UTF-8 text; save the file as UTF-8.") from None
            if not line.strip():
                continue
            number += 1
            where = f"Row {number} (line {line_number})"
            if number > limits.max_rows:
                raise _too_many_rows(limits.max_rows)
            try:
                value = json.loads(line)
            except RecursionError:
                raise _Refused(f"{where}: nests deeper than {MAX_JSON_DEPTH} levels (the limit); flatten the row.") from None
            except ValueError as exc:
                raise _Refused(f"{where}: not valid JSON ({exc}).") from None
            if not isinstance(value, dict):
                raise _Refused(f"{where}: a JSON {type(value).__name__}, not an object; "
                               "write one {\"column\": value, ...} per line.")
            yield where, value


def _parquet_rows(source: Path, limits: ReadLimits) -> Iterator[tuple[str, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(source)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _Refused(f"Not a readable Parquet file ({exc}).") from None
    if parquet.metadata.num_rows > limits.max_rows:
        raise _Refused(f"{parquet.metadata.num_rows:,} rows, more than the limit of {limits.max_rows:,}; split the file.")
    _check_header(list(parquet.schema_arrow.names), limits.max_columns, "The schema")
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=64):
            for row in batch.to_pylist():
                number += 1
                yield f"Row {number}", row
    except MemoryError:  # pyarrow's ArrowMemoryError too
        raise _Refused(f"Row {number + 1}: reading it needs more than {limits.memory_mb:,} MB of memory (the limit).") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _Refused(f"Row {number + 1}: cannot be read ({exc}).") from None


READERS = {"csv": _csv_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows}


def _write_rows(kind: str, source: Path, rows_out: Path, limits: ReadLimits) -> dict[str, Any]:
    columns: dict[str, None] = {}
    first_empty: dict[str, str] = {}  # column -> where the first row without a value in it is
    preview: list[dict] = []
    count = size = 0
    first_where = ""
    with open(rows_out, "w", encoding="utf-8") as out:
        for where, row in READERS[kind](source, limits):
            count += 1
            first_where = first_where or where
            if count > limits.max_rows:
                raise _too_many_rows(limits.max_rows)
            for column in row:
                if column not in columns:
                    columns[column] = None
                    if count > 1:  # the rows before lack it
                        first_empty.setdefault(column, first_where)
            if len(columns) > limits.max_columns:
                raise _Refused(f"{where}: the rows so far have {len(columns)} different keys, "
                               f"more than the limit of {limits.max_columns} columns.")
            if nesting_exceeds(row, MAX_JSON_DEPTH):
                raise _Refused(f"{where}: nests deeper than {MAX_JSON_DEPTH} levels (the limit); flatten the row.")
            for column in columns:
                text = cell_text(row.get(column))
                if len(text) > limits.max_cell_chars:
                    raise _Refused(f"{where}, column {column!r}: the value has more than {limits.max_cell_chars:,} "
                                   "characters (the limit).")
                if not text.strip():
                    first_empty.setdefault(column, where)
            line = json.dumps(row, ensure_ascii=False, default=str) + "\n"
            size += len(line.encode())
            if size > limits.max_text_bytes:
                raise _Refused(f"{where}: the rows so far unpack to more than {limits.max_text_bytes:,} bytes of text "
                               "(the limit); split the file.")
            out.write(line)
            if len(preview) < limits.preview_rows:
                preview.append(row)
    if not count:
        raise _Refused("The file has no rows.")
    if kind == "jsonl":
        _check_header(list(columns), limits.max_columns, "The keys")
    return {
        "columns": list(columns), "rows": count, "first_empty": first_empty,
        "preview": [[cell_text(row.get(column))[:limits.preview_chars] for column in columns] for row in preview],
    }


def _limit(memory_mb: int, cpu_seconds: int) -> None:
    with open("/proc/self/status") as status:  # what the interpreter (and pyarrow) already map, plus the budget
        mapped = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:")), 0)
    limit = mapped + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


def main(argv: list[str]) -> int:
    kind, source, rows_out, limits_json = argv
    limits = ReadLimits(**json.loads(limits_json))
    if kind == "parquet":
        import pyarrow.parquet  # noqa: F401  (imported before the memory limit is set)
    _limit(limits.memory_mb, limits.cpu_seconds)
    try:
        answer = _write_rows(kind, Path(source), Path(rows_out), limits)
    except _Refused as refused:
        answer = {"error": str(refused)}
    except RecursionError:  # a Parquet value nested past the parser's own depth
        answer = {"error": f"A row nests deeper than {MAX_JSON_DEPTH} levels (the limit); flatten the rows."}
    except MemoryError:
        answer = {"error": f"Reading the file needs more than {limits.memory_mb:,} MB of memory (the limit)."}
    sys.stdout.write(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
