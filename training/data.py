"""Datasets: load whatever a user hands over (rows, files, registered names, hub ids) as a ``datasets.Dataset``.

Every error starts with ``what`` (``"train_dataset"``, ``"val_dataset"``, ...) so the user knows
which argument is at fault.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Callable

import datasets

DatasetBuilder = Callable[[], dict[str, list[dict] | datasets.Dataset]]

_FILE_BUILDERS = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_BUILDERS: dict[str, DatasetBuilder] = {}
_BUILT: dict[str, dict[str, datasets.Dataset]] = {}


def register_dataset(name: str, builder: DatasetBuilder) -> None:
    """Make ``name`` (and ``name:split``) loadable. ``builder`` returns the splits; it runs on first use."""
    if name in _BUILDERS:
        raise ValueError(f"a dataset named {name!r} is already registered; choose another name.")
    if ":" in name:
        raise ValueError(f"dataset name {name!r} must not contain ':', which separates the split.")
    _BUILDERS[name] = builder


class RegisteredDataset(datasets.Dataset):
    """What ``DatasetRegistry`` returns: a ``datasets.Dataset`` that also has the methods of rLLM's
    ``Dataset`` that its scripts call, ``get_data()`` and ``repeat(n)``."""

    @classmethod
    def of(cls, dataset: datasets.Dataset) -> "RegisteredDataset":
        return cls(dataset.data, info=dataset.info, split=dataset.split, indices_table=dataset._indices,
                   fingerprint=dataset._fingerprint)

    def get_data(self) -> list[dict[str, Any]]:
        """The rows as a list of dicts."""
        return self.to_list()

    def repeat(self, n: int) -> "RegisteredDataset":
        """rLLM's ``repeat``: each row ``n`` times, the copies next to each other (``[a, a, b, b]``),
        as rLLM's evaluation scripts expect for pass@k. (``datasets.Dataset.repeat(num_times)``
        repeats the whole dataset instead, ``[a, b, a, b]``.)"""
        if n <= 0:
            raise ValueError(f"repeat: n must be positive, got {n}.")
        return RegisteredDataset.of(self.select([index for index in range(len(self)) for _ in range(n)]))


class DatasetRegistry:
    """rLLM's ``DatasetRegistry``: named datasets with splits, loadable by ``(name, split)``.

    Kept in memory (rLLM also writes them under ``~/.rllm``). A new name is also registered with
    ``register_dataset``, so ``"name:split"`` works wherever a dataset is accepted; names registered
    there (the built-in ``countdown``, ``frozenlake``, ...) load through this class too.
    """

    _splits: dict[str, dict[str, datasets.Dataset]] = {}

    @classmethod
    def register_dataset(cls, name: str, data: list[dict] | datasets.Dataset, split: str = "default") -> RegisteredDataset:
        """Add (or replace) ``split`` of dataset ``name``; returns it as a ``RegisteredDataset``."""
        dataset = RegisteredDataset.of(load_dataset(data, what=f"DatasetRegistry {name!r} split {split!r}"))
        if name not in cls._splits:
            if name not in _BUILDERS:
                register_dataset(name, lambda: cls._splits[name])
            cls._splits[name] = {}
        cls._splits[name][split] = dataset
        _BUILT.pop(name, None)  # a new split: rebuild the cached splits on next use
        return dataset

    @classmethod
    def load_dataset(cls, name: str, split: str = "default") -> RegisteredDataset | None:
        """The split, or None when it was never registered (as rLLM answers)."""
        if name in cls._splits:
            dataset = cls._splits[name].get(split)
        else:
            dataset = _build(name).get(split) if name in _BUILDERS else None
        return None if dataset is None else RegisteredDataset.of(dataset)

    @classmethod
    def dataset_exists(cls, name: str, split: str | None = None) -> bool:
        return name in cls.get_dataset_names() and (split is None or split in cls.get_dataset_splits(name))

    @classmethod
    def get_dataset_names(cls) -> list[str]:
        return sorted(set(cls._splits) | set(_BUILDERS))

    @classmethod
    def get_dataset_splits(cls, name: str) -> list[str]:
        if name in cls._splits:
            return sorted(cls._splits[name])
        return sorted(_build(name)) if name in _BUILDERS else []


def available_datasets() -> list[str]:
    """Names that ``load_dataset`` accepts without a path or hub id."""
    return sorted(_BUILDERS)


def load_dataset(source: Any, split: str = "train", what: str = "train_dataset") -> datasets.Dataset | None:
    """Load ``source`` as a non-empty ``datasets.Dataset`` (None stays None).

    ``source`` may be a Dataset, a DatasetDict (its ``split`` is taken), a list of dicts, a path to a
    .csv/.jsonl/.json/.parquet file, a registered name (``name`` or ``name:split``) or a Hugging Face
    hub id.
    """
    if source is None:
        return None
    if isinstance(source, datasets.DatasetDict):
        dataset = _pick_split(dict(source), split, what, repr_of="the DatasetDict")
    elif isinstance(source, datasets.Dataset):
        dataset = source
    elif isinstance(source, list):
        dataset = _from_rows(source, what)
    elif isinstance(source, (str, os.PathLike)):
        dataset = _from_string(str(source), split, what)
    else:
        raise ValueError(
            f"{what}: expected a datasets.Dataset, a list of dicts, a file path, a registered name or a hub id, "
            f"not {type(source).__name__}."
        )
    if len(dataset) == 0:
        raise ValueError(f"{what}: the dataset is empty ({_describe(source)}); give it at least one row.")
    return dataset


def _from_rows(rows: list, what: str) -> datasets.Dataset:
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{what}: row {i} is a {type(row).__name__}, not a dict; give one dict per task.")
    return datasets.Dataset.from_list(rows)


def _from_string(source: str, split: str, what: str) -> datasets.Dataset:
    suffix = Path(source).suffix.lower()
    if suffix in _FILE_BUILDERS:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"{what}: file {source} does not exist; check the path (relative to {Path.cwd()}).")
        # Our own reading finds what the builders would swallow (pandas shifts a CSV row with an
        # extra field into an index) or report without a reason (an empty file).
        problem = _file_problem(path, suffix)
        if problem:
            raise ValueError(f"{what}: cannot use {source}: {problem}.")
        try:
            return datasets.load_dataset(_FILE_BUILDERS[suffix], data_files=source, split="train")
        except Exception as exc:  # a malformed file can fail in many ways inside the builder
            raise ValueError(f"{what}: could not read {source}: {_root_message(exc)}") from exc
    name, _, named_split = source.partition(":")
    if name in _BUILDERS:
        return _pick_split(_build(name), named_split or split, what, repr_of=f"dataset {name!r}")
    try:
        return datasets.load_dataset(source, split=split)
    except Exception as exc:  # network, auth and missing-repo errors all land here
        registered = ", ".join(available_datasets()) or "none"
        raise ValueError(
            f"{what}: could not load {source!r} (split {split!r}) from the Hugging Face hub: {exc}. "
            f"Offline machines need a local path (.csv, .jsonl, .json or .parquet); "
            f"registered datasets: {registered}."
        ) from exc


def _file_problem(path: Path, suffix: str) -> str | None:
    """What makes a data file unusable, in words (None: nothing found; the builder decides)."""
    if path.stat().st_size == 0:
        return "the file is empty (0 bytes)"
    if suffix == ".csv":
        return _csv_problem(path)
    if suffix == ".jsonl":
        return _jsonl_problem(path)
    return None


def _csv_problem(path: Path) -> str | None:
    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.reader(handle, strict=True)
        try:
            header = next(reader, None)
            rows = 0
            for row in reader:
                if not row:
                    continue  # a blank line is skipped by every CSV reader
                rows += 1
                if len(row) != len(header):
                    return f"line {reader.line_num} has {len(row)} field(s) but the header has {len(header)} ({', '.join(header)})"
        except csv.Error as exc:
            return f"line {reader.line_num} is not valid CSV ({exc}; an unclosed quote?)"
    if not header or not any(header):
        return "it has no header line"
    if rows == 0:
        return f"it has a header ({', '.join(header)}) but no rows"
    return None


def _jsonl_problem(path: Path) -> str | None:
    rows = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                return f"line {number} is not valid JSON ({exc})"
            if not isinstance(value, dict):
                return f"line {number} is a JSON {type(value).__name__}, not an object (one {{...}} per line)"
            rows += 1
    return None if rows else "it has no rows (only blank lines)"


def _root_message(exc: BaseException) -> str:
    """The innermost non-empty message of an exception chain (the builders wrap the cause)."""
    message = f"{type(exc).__name__}: {exc}"
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if str(exc).strip():
            message = f"{type(exc).__name__}: {str(exc).strip()}"
        exc = exc.__cause__ or exc.__context__
    return message


def _build(name: str) -> dict[str, datasets.Dataset]:
    if name not in _BUILT:
        splits = _BUILDERS[name]()
        _BUILT[name] = {
            key: rows if isinstance(rows, datasets.Dataset) else datasets.Dataset.from_list(rows)
            for key, rows in splits.items()
        }
    return _BUILT[name]


def _pick_split(splits: dict[str, datasets.Dataset], split: str, what: str, repr_of: str) -> datasets.Dataset:
    if split not in splits:
        raise ValueError(f"{what}: {repr_of} has no split {split!r}; available splits: {', '.join(splits)}.")
    return splits[split]


def _describe(source: Any) -> str:
    return repr(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__


def require_columns(dataset: datasets.Dataset, columns: list[str], what: str, hint: str = "") -> None:
    """Raise ValueError naming the columns of ``columns`` that ``dataset`` lacks, and those it has."""
    missing = [column for column in columns if column not in dataset.column_names]
    if missing:
        message = (
            f"{what} is missing column(s) {', '.join(map(repr, missing))}; "
            f"it has: {', '.join(dataset.column_names)}."
        )
        raise ValueError(f"{message} {hint}" if hint else message)


def describe_source(source: Any) -> str:
    """How to name a dataset argument in a message: the path or name, else its kind and size."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, list):
        return "the list of rows"
    return f"the {type(source).__name__}"


def require_rows(dataset: datasets.Dataset, rows: int, what: str, source: Any, key: str) -> None:
    """Raise ValueError when ``dataset`` has fewer than ``rows`` rows (``key`` is the config key that asks for them)."""
    if len(dataset) < rows:
        raise ValueError(
            f"{what}: {describe_source(source)} has {len(dataset)} row(s), fewer than one batch ({key}={rows}), "
            f"so not one training step could run. Add rows or lower {key}."
        )


def dataset_to_tasks(dataset: datasets.Dataset) -> list[dict]:
    """The rows as plain dicts: the tasks that agents and reward functions receive."""
    return dataset.to_list()
