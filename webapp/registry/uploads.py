"""Datasets people upload from the browser: CSV, JSONL or Parquet in, checked rows out.

An upload is untrusted input. Nothing in it is executed or imported; it is read with the standard
``csv`` and ``json`` modules within the limits in settings (bytes, rows, columns, characters per
cell), so one file can cost only so much memory and time; Parquet, whose compressed pages can
unpack to far more than the file's bytes, is read by pyarrow in a child process under CPU-time and
memory limits (``parquet_reader``). Every refusal
names the row (and the file's line) and the column at fault.

Files are written through Django's storage API under names the platform makes up
(``datasets/<random>/train.jsonl``); the name the browser sent is only shown, never used as a path.
"""

from __future__ import annotations

import csv
import io
import json
import random
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePosixPath
from typing import IO, Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.utils import timezone

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
PREVIEW_ROWS = 10
# A Parquet file's rows may unpack to more than its bytes: allow this many times the upload limit.
PARQUET_EXPANSION = 5


class UploadError(ValueError):
    """What is wrong with an uploaded file, in words a person can act on."""


@dataclass
class Limits:
    max_bytes: int
    max_rows: int
    max_columns: int
    max_cell_chars: int

    @classmethod
    def from_settings(cls) -> "Limits":
        return cls(settings.DATASET_UPLOAD_MAX_BYTES, settings.DATASET_UPLOAD_MAX_ROWS,
                   settings.DATASET_UPLOAD_MAX_COLUMNS, settings.DATASET_UPLOAD_MAX_CELL_CHARS)


@dataclass
class Table:
    """A parsed upload: its columns in file order, and its rows (``where[i]`` says where row i came from)."""

    columns: list[str]
    rows: list[dict[str, Any]]
    where: list[str]

    def preview(self, count: int = PREVIEW_ROWS) -> list[list[str]]:
        return [[_cell_text(row.get(column)) for column in self.columns] for row in self.rows[:count]]


class LimitedUploadHandler(FileUploadHandler):
    """Stops reading a request's file once it passes ``DATASET_UPLOAD_MAX_BYTES`` (so an oversized
    upload is never stored, in memory or on disk); the form then says the file is too large."""

    def __init__(self, request=None) -> None:
        super().__init__(request)
        self.received = 0
        self.too_large = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > settings.DATASET_UPLOAD_MAX_BYTES:
            self.too_large = True
            raise StopUpload(connection_reset=False)
        return raw_data

    def file_complete(self, file_size: int):
        return None  # the next handler (memory or temporary file) keeps the bytes


def format_of(filename: str) -> str:
    suffix = PurePosixPath(filename or "").suffix.lower()
    if suffix not in FORMATS:
        raise UploadError(f"{filename!r}: upload a .csv, .jsonl or .parquet file (not {suffix or 'a file without an extension'}).")
    return FORMATS[suffix]


def parse(handle: IO[bytes], kind: str, limits: Limits) -> Table:
    """Read a whole upload (``kind``: csv, jsonl or parquet) within ``limits``; UploadError otherwise."""
    reader = {"csv": _parse_csv, "jsonl": _parse_jsonl, "parquet": _parse_parquet}[kind]
    table = reader(handle, limits)
    if not table.rows:
        raise UploadError("The file has no rows.")
    for row, where in zip(table.rows, table.where):
        for column, value in row.items():
            if len(_cell_text(value)) > limits.max_cell_chars:
                raise UploadError(f"{where}, column {column!r}: the value has more than {limits.max_cell_chars:,} characters.")
    return table


def _check_header(columns: list[str], limits: Limits, where: str) -> None:
    if len(columns) > limits.max_columns:
        raise UploadError(f"{where}: {len(columns)} columns, more than the limit of {limits.max_columns}.")
    seen: set[str] = set()
    for number, column in enumerate(columns, start=1):
        if not str(column).strip():
            raise UploadError(f"{where}: column {number} has no name; give every column a name.")
        if column in seen:
            raise UploadError(f"{where}: column {column!r} appears twice; column names must be unique.")
        seen.add(column)


def _parse_csv(handle: IO[bytes], limits: Limits) -> Table:
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")
    try:
        return _read_csv(text, limits)
    finally:
        text.detach()  # the upload stays open for the caller (a wrapper closes what it wraps)


def _read_csv(text: IO[str], limits: Limits) -> Table:
    reader = csv.reader(text, strict=True)
    rows, where = [], []
    try:
        header = next(reader, None)
        if not header:
            raise UploadError("The CSV file is empty; its first line must name the columns.")
        _check_header(header, limits, "The header (line 1)")
        for fields in reader:
            if not fields:
                continue
            number = len(rows) + 1
            if number > limits.max_rows:
                raise UploadError(f"More than {limits.max_rows:,} rows; split the file or ask an administrator to raise the limit.")
            if len(fields) != len(header):
                raise UploadError(f"Row {number} (line {reader.line_num}): {len(fields)} field(s), but the header has "
                                  f"{len(header)} ({', '.join(header)}); quote values that contain commas.")
            rows.append(dict(zip(header, fields)))
            where.append(f"Row {number} (line {reader.line_num})")
    except csv.Error as exc:
        raise UploadError(f"Line {reader.line_num}: not valid CSV ({exc}; an unclosed quote?).") from None
    except UnicodeDecodeError as exc:
        raise UploadError(f"Around line {reader.line_num + 1}: not UTF-8 text (byte {exc.start} of a read block); save the file as UTF-8.") from None
    return Table(header, rows, where)


def _parse_jsonl(handle: IO[bytes], limits: Limits) -> Table:
    columns: dict[str, None] = {}
    rows, where = [], []
    for line_number, raw in enumerate(handle, start=1):
        try:
            line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
        except UnicodeDecodeError:
            raise UploadError(f"Line {line_number}: not UTF-8 text; save the file as UTF-8.") from None
        if not line.strip():
            continue
        number = len(rows) + 1
        if number > limits.max_rows:
            raise UploadError(f"More than {limits.max_rows:,} rows; split the file or ask an administrator to raise the limit.")
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise UploadError(f"Row {number} (line {line_number}): not valid JSON ({exc}).") from None
        if not isinstance(value, dict):
            raise UploadError(f"Row {number} (line {line_number}): a JSON {type(value).__name__}, not an object; "
                              "write one {\"column\": value, ...} per line.")
        columns.update(dict.fromkeys(value))
        if len(columns) > limits.max_columns:
            raise UploadError(f"Row {number} (line {line_number}): the rows so far have {len(columns)} different keys, "
                              f"more than the limit of {limits.max_columns} columns.")
        rows.append(value)
        where.append(f"Row {number} (line {line_number})")
    _check_header(list(columns), limits, "The keys")
    return Table(list(columns), rows, where)


def _parse_parquet(handle: IO[bytes], limits: Limits) -> Table:
    from webapp.registry import parquet_reader

    data = handle.read(limits.max_bytes + 1)
    if len(data) > limits.max_bytes:
        raise UploadError(f"The file is larger than the limit of {limits.max_bytes:,} bytes.")
    try:
        answer = parquet_reader.read(data, limits.max_rows, limits.max_bytes * PARQUET_EXPANSION,
                                     settings.DATASET_PARSE_MEMORY_MB, settings.DATASET_PARSE_CPU_SECONDS)
    except parquet_reader.ReadError as exc:
        raise UploadError(f"The Parquet file cannot be used: {exc}.") from None
    columns = answer["columns"]
    _check_header(columns, limits, "The schema")
    return Table(columns, answer["rows"], [f"Row {number}" for number in range(1, len(answer["rows"]) + 1)])


def check_mapping(table: Table, mapping: dict[str, str]) -> None:
    """Every mapped column exists and has a value in every row; UploadError naming the row otherwise."""
    for role, column in mapping.items():
        if column not in table.columns:
            raise UploadError(f"{role}: the file has no column {column!r}; it has {', '.join(table.columns)}.")
        for row, where in zip(table.rows, table.where):
            if _cell_text(row.get(column)).strip() == "":
                raise UploadError(f"{where}, column {column!r}: empty, but it is the {role} column, which every row needs.")


def split(rows: list[dict], test_fraction: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rows shuffled with ``seed``, then ``test_fraction`` of them (at least one, when above 0) held out."""
    if test_fraction <= 0:
        return list(rows), []
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = max(1, round(len(rows) * test_fraction))
    if held >= len(rows):
        raise UploadError(f"A test share of {test_fraction:.0%} leaves no training rows out of {len(rows)}; lower it or add rows.")
    test = sorted(order[:held])
    train = sorted(order[held:])
    return [rows[i] for i in train], [rows[i] for i in test]


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows).encode()


PENDING_FOLDER = "datasets/pending"
PENDING_MAX_AGE = timedelta(days=1)


def save_pending(upload, kind: str) -> str:
    """Keep an upload until its columns are mapped; returns the storage name (made up here).
    Uploads whose columns were never mapped are deleted after a day."""
    prune_pending()
    return default_storage.save(f"{PENDING_FOLDER}/{uuid.uuid4().hex}.{kind}", upload)


def prune_pending(max_age: timedelta = PENDING_MAX_AGE) -> int:
    """Delete uploads left waiting for their columns longer than ``max_age``; how many."""
    try:
        _, names = default_storage.listdir(PENDING_FOLDER)
    except (FileNotFoundError, NotImplementedError):
        return 0
    cutoff = timezone.now() - max_age
    old = [name for name in names if default_storage.get_modified_time(f"{PENDING_FOLDER}/{name}") < cutoff]
    for name in old:
        default_storage.delete(f"{PENDING_FOLDER}/{name}")
    return len(old)


def open_stored(name: str) -> IO[bytes]:
    return default_storage.open(name, "rb")


def delete_stored(name: str) -> None:
    if name and default_storage.exists(name):
        default_storage.delete(name)


def save_split(dataset, train: list[dict], test: list[dict]) -> None:
    """Write the train (and test) rows as JSONL files of ``dataset``, under a folder made up here."""
    folder = uuid.uuid4().hex
    dataset.file.save(f"{folder}/train.jsonl", ContentFile(jsonl_bytes(train)), save=False)
    if test:
        dataset.test_file.save(f"{folder}/test.jsonl", ContentFile(jsonl_bytes(test)), save=False)


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
