"""Datasets people upload from the browser: CSV, JSONL or Parquet in, checked rows out.

An upload is untrusted input, and what reading it costs is not its size (a few kilobytes of Parquet
unpack to hundreds of megabytes; a parsed row costs several times its bytes as Python objects). So
the web process never parses one: a child process (``table_reader``) reads it under CPU-time and
memory limits and within the limits in settings (bytes, rows, columns, characters per cell, bytes of
text in all, nesting), writes its rows as JSON lines, and answers a summary: the columns, the row
count, the first rows and where each column is first empty. That summary is kept on a
``PendingUpload`` row; the mapping page shows it and checks a mapping against it, and the rows file
is only ever streamed, line by line, into the dataset's train and test files. Every refusal names
the row (and the file's line), the column and the limit at fault. Nothing in a file is executed.

Files are written through Django's storage API under names the platform makes up
(``datasets/<random>/train.jsonl``); the name the browser sent is only shown, never used as a path.
"""

from __future__ import annotations

import json
import random
import tempfile
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import IO

from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.db import transaction
from django.utils import timezone

from webapp.registry import table_reader
from webapp.registry.models import Dataset, PendingUpload
from webapp.registry.table_reader import cell_text

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
PREVIEW_ROWS = 10
# Rows may unpack to more than the file's bytes (Parquet is compressed): allow this many times the upload limit.
TEXT_EXPANSION = 5
# Uploads one person may leave waiting for their columns at once (each is a file of up to TEXT_EXPANSION x the upload limit).
PENDING_PER_PERSON = 5
PENDING_FOLDER = "datasets/pending"
PENDING_MAX_AGE = timedelta(days=1)
# The dataset page shows the first rows that fit in this many bytes.
PREVIEW_BYTES = 1 << 20
_READ_CHUNK = 1 << 20


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

    def for_reader(self) -> table_reader.ReadLimits:
        return table_reader.ReadLimits(
            max_rows=self.max_rows, max_columns=self.max_columns, max_cell_chars=self.max_cell_chars,
            max_text_bytes=self.max_bytes * TEXT_EXPANSION, memory_mb=settings.DATASET_PARSE_MEMORY_MB,
            cpu_seconds=settings.DATASET_PARSE_CPU_SECONDS, preview_rows=PREVIEW_ROWS,
        )


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


def pending_count(owner) -> int:
    """Uploads of ``owner`` waiting for their columns (those older than a day are pruned first)."""
    prune_pending()
    return PendingUpload.objects.filter(owner=owner).count()


def receive(upload: File, kind: str, *, owner, project, name: str, description: str) -> PendingUpload:
    """Read ``upload`` (``kind``: csv, jsonl or parquet) in the child reader and keep its rows until
    their columns are mapped; UploadError saying what is wrong otherwise (then nothing is kept)."""
    with tempfile.TemporaryDirectory(prefix="upload-") as folder:
        source, rows = Path(folder) / "upload", Path(folder) / "rows.jsonl"
        with open(source, "wb") as copy:
            for chunk in upload.chunks():
                copy.write(chunk)
        try:
            summary = table_reader.read(kind, source, rows, Limits.from_settings().for_reader())
        except table_reader.ReadError as exc:
            raise UploadError(str(exc)) from None
        pending = PendingUpload(
            owner=owner, project=project, name=name, description=description, filename=(upload.name or "")[:200],
            row_count=summary["rows"], columns=summary["columns"], preview=summary["preview"],
            first_empty=summary["first_empty"],
        )
        with open(rows, "rb") as handle:
            pending.rows.save(f"{uuid.uuid4().hex}.jsonl", File(handle), save=False)
        pending.save()
    return pending


def check_mapping(pending: PendingUpload, mapping: dict[str, str]) -> None:
    """Every mapped column exists and has a value in every row; UploadError naming the row otherwise."""
    for role, column in mapping.items():
        if column not in pending.columns:
            raise UploadError(f"{role}: the file has no column {column!r}; it has {', '.join(pending.columns)}.")
        if column in pending.first_empty:
            raise UploadError(f"{pending.first_empty[column]}, column {column!r}: empty, but it is the {role} column, "
                              "which every row needs.")


def test_rows(count: int, test_fraction: float, seed: int = 0) -> set[int]:
    """Which of ``count`` rows to hold out: shuffled with ``seed`` (the same every time), then
    ``test_fraction`` of them (at least one, when above 0)."""
    if test_fraction <= 0:
        return set()
    order = list(range(count))
    random.Random(seed).shuffle(order)
    held = max(1, round(count * test_fraction))
    if held >= count:
        raise UploadError(f"A test share of {test_fraction:.0%} leaves no training rows out of {count}; lower it or add rows.")
    return set(order[:held])


def create_dataset(pending: PendingUpload, mapping: dict[str, str], test: set[int]) -> Dataset:
    """The dataset of ``pending``: its rows streamed into train and test JSON-lines files (under a
    folder made up here), the pending upload deleted."""
    dataset = Dataset(
        name=pending.name, description=pending.description or f"Uploaded from {pending.filename}.",
        project=pending.project, source=Dataset.Source.UPLOAD, train_split="train",
        val_split="test" if test else "", column_mapping=mapping,
    )
    folder = uuid.uuid4().hex
    with pending.rows.open("rb") as rows, tempfile.TemporaryFile() as train, tempfile.TemporaryFile() as held:
        index = 0
        for part in iter(lambda: rows.readline(_READ_CHUNK), b""):  # a long row comes in parts; none is held whole
            (held if index in test else train).write(part)
            if part.endswith(b"\n"):
                index += 1
        train.seek(0)
        held.seek(0)
        dataset.file.save(f"{folder}/train.jsonl", File(train), save=False)
        if test:
            dataset.test_file.save(f"{folder}/test.jsonl", File(held), save=False)
    dataset.full_clean()
    with transaction.atomic():
        dataset.save()
        pending.delete()
    return dataset


def preview(stored: IO[bytes]) -> tuple[list[str], list[list[str]]]:
    """The columns and first rows of a JSON-lines file, as many of the first ``PREVIEW_ROWS`` as fit
    in ``PREVIEW_BYTES`` (a page never reads a whole dataset)."""
    rows, budget = [], PREVIEW_BYTES
    while len(rows) < PREVIEW_ROWS:
        line = stored.readline(budget + 1)
        if not line.strip() or len(line) > budget:
            break
        budget -= len(line)
        rows.append(json.loads(line))
    columns = list(dict.fromkeys(column for row in rows for column in row))
    return columns, [[cell_text(row.get(column)) for column in columns] for row in rows]


def prune_pending(max_age: timedelta = PENDING_MAX_AGE) -> int:
    """Delete uploads left waiting for their columns longer than ``max_age`` (and any file of the
    pending folder that old, should its row be gone); how many."""
    cutoff = timezone.now() - max_age
    old = PendingUpload.objects.filter(created_at__lt=cutoff)
    count = len(old)
    for pending in old:
        pending.delete()
    try:
        _, names = default_storage.listdir(PENDING_FOLDER)
    except (FileNotFoundError, NotImplementedError):
        return count
    for name in names:
        if default_storage.get_modified_time(f"{PENDING_FOLDER}/{name}") < cutoff:
            default_storage.delete(f"{PENDING_FOLDER}/{name}")
    return count
