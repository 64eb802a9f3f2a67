"""Datasets: load whatever a user hands over (rows, files, registered names, hub ids) as a ``datasets.Dataset``.

Every error starts with ``what`` (``"train_dataset"``, ``"val_dataset"``, ...) so the user knows
which argument is at fault.
"""

from __future__ import annotations

import csv
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import datasets
import pyarrow.parquet

DatasetBuilder = Callable[[], dict[str, list[dict] | datasets.Dataset]]

_FILE_BUILDERS = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_BUILDERS: dict[str, DatasetBuilder] = {}
_BUILT: dict[str, dict[str, datasets.Dataset]] = {}
_SHADOWED_SAID: set[tuple[str, str]] = set()  # (name, split) whose stored copy this process has warned about
_log = logging.getLogger("training.data")  # a child of the library's logger (training/log.py), which handlers read


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


def registry_home() -> Path:
    """Where ``DatasetRegistry`` keeps datasets between processes: ``$AGENT_TRAINER_DATASETS``, else
    ``agent-trainer/datasets`` under ``$XDG_DATA_HOME`` (``~/.local/share``). rLLM keeps its own under
    ``~/.rllm/datasets``; the layout is the same: ``<name>/<split>.parquet`` and ``registry.json``."""
    explicit = os.environ.get("AGENT_TRAINER_DATASETS", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME", "").strip() or Path.home() / ".local" / "share"
    return Path(data_home) / "agent-trainer" / "datasets"


def _plain_name(value: str, what: str) -> str:
    """A dataset or split name is one folder or file name on disk: no separators, no leading dot."""
    if not value or value.startswith(".") or "/" in value or "\\" in value or ":" in value or "\0" in value:
        raise ValueError(f"DatasetRegistry: {what} {value!r} must be a plain name (no '/', ':' or leading '.').")
    return value


class _Stored:
    """The datasets ``DatasetRegistry`` wrote to disk: ``registry.json`` lists ``{name: {split: file}}``,
    each split a Parquet file. Every write replaces a whole file (written beside it, then renamed) under
    a lock, so a reader in another process sees the old registry or the new one, never half of one."""

    @staticmethod
    def _index_path() -> Path:
        return registry_home() / "registry.json"

    @classmethod
    def index(cls) -> dict[str, dict[str, str]]:
        path = cls._index_path()
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text(encoding="utf-8")).get("datasets", {})
        except (OSError, ValueError) as exc:
            raise ValueError(f"DatasetRegistry: cannot read {path}: {exc}; fix or delete it.") from exc

    @classmethod
    def _update(cls, change: Callable[[dict[str, dict[str, str]]], None]) -> None:
        home = registry_home()
        home.mkdir(parents=True, exist_ok=True)
        with open(home / ".registry.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            index = cls.index()
            change(index)
            _replace(cls._index_path(), json.dumps({"version": 1, "datasets": index}, indent=1).encode())

    @classmethod
    def save(cls, name: str, split: str, dataset: datasets.Dataset) -> None:
        relative = f"{name}/{split}.parquet"
        target = registry_home() / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{split}.parquet.{os.getpid()}")
        pyarrow.parquet.write_table(dataset.with_format("arrow")[:], str(partial))  # the rows, indices applied
        os.replace(partial, target)
        cls._update(lambda index: index.setdefault(name, {}).__setitem__(split, relative))

    @classmethod
    def load(cls, name: str) -> dict[str, datasets.Dataset]:
        splits = cls.index().get(name, {})
        loaded = {}
        for split, relative in splits.items():
            path = registry_home() / relative
            try:
                loaded[split] = datasets.Dataset(pyarrow.parquet.read_table(path))
            except OSError as exc:
                raise ValueError(f"DatasetRegistry: dataset {name!r} split {split!r}: cannot read {path}: {exc}.") from exc
        return loaded

    @classmethod
    def remove(cls, name: str, split: str | None) -> bool:
        removed = []

        def change(index: dict[str, dict[str, str]]) -> None:
            splits = index.get(name, {})
            for each in [split] if split is not None else list(splits):
                if each in splits:
                    removed.append(registry_home() / splits.pop(each))
            if name in index and not splits:
                del index[name]

        cls._update(change)
        for path in removed:
            path.unlink(missing_ok=True)
        return bool(removed)


def _replace(path: Path, content: bytes) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(content)
    os.replace(partial, path)


class DatasetRegistry:
    """rLLM's ``DatasetRegistry``: named datasets with splits, loadable by ``(name, split)``.

    As rLLM's, it keeps what it is given on disk (``registry_home()``), so a dataset prepared by one
    script trains in another process ("prepare the data once, train later"). A name is also loadable
    as ``"name:split"`` wherever a dataset is accepted. Names built into the library or its examples
    (``countdown``, ``frozenlake``, ...) load through this class too; a split registered under such a
    name replaces the built-in one.
    """

    _splits: dict[str, dict[str, datasets.Dataset]] = {}

    @classmethod
    def register_dataset(cls, name: str, data: list[dict] | datasets.Dataset, split: str = "default") -> RegisteredDataset:
        """Add (or replace) ``split`` of dataset ``name``, on disk and in this process; returns it."""
        _plain_name(name, "dataset name")
        _plain_name(split, "split")
        dataset = RegisteredDataset.of(load_dataset(data, what=f"DatasetRegistry {name!r} split {split!r}"))
        _Stored.save(name, split, dataset)
        cls._splits.setdefault(name, {})[split] = dataset
        _BUILT.pop(name, None)  # a new split: rebuild the cached splits on next use
        return dataset

    @classmethod
    def splits(cls, name: str) -> dict[str, datasets.Dataset]:
        """Every split of ``name``: the built-in ones, then those on disk, then this process's own."""
        found = dict(_build(name)) if name in _BUILDERS else {}
        stored = _Stored.load(name)
        own = cls._splits.get(name, {})
        for split in sorted((found.keys() & stored.keys()) - own.keys()):
            # Registered on disk by some earlier script, perhaps long ago: say so, or its rows pass for the built-in ones.
            if (name, split) in _SHADOWED_SAID:
                continue
            _SHADOWED_SAID.add((name, split))
            _log.warning("dataset %r split %r: the rows registered in %s replace the built-in split; "
                         "DatasetRegistry.remove_dataset_split(%r, %r) brings the built-in one back.",
                         name, split, registry_home() / name, name, split)
        found.update(stored)
        found.update(own)
        return found

    @classmethod
    def load_dataset(cls, name: str, split: str = "default") -> RegisteredDataset | None:
        """The split, or None when it was never registered (as rLLM answers)."""
        dataset = cls._splits.get(name, {}).get(split)
        if dataset is None:
            dataset = cls.splits(name).get(split)
        return None if dataset is None else RegisteredDataset.of(dataset)

    @classmethod
    def dataset_exists(cls, name: str, split: str | None = None) -> bool:
        return name in cls.get_dataset_names() and (split is None or split in cls.get_dataset_splits(name))

    @classmethod
    def get_dataset_names(cls) -> list[str]:
        return sorted(set(cls._splits) | set(_Stored.index()) | set(_BUILDERS))

    @classmethod
    def get_dataset_splits(cls, name: str) -> list[str]:
        return sorted(set(cls._splits.get(name, {})) | set(_Stored.index().get(name, {})) |
                      (set(_build(name)) if name in _BUILDERS else set()))

    @classmethod
    def remove_dataset_split(cls, name: str, split: str) -> bool:
        """Forget one split (its file too); False when there was none. Built-in splits stay."""
        in_memory = cls._splits.get(name, {}).pop(split, None) is not None
        return _Stored.remove(name, split) or in_memory

    @classmethod
    def remove_dataset(cls, name: str) -> bool:
        """Forget every registered split of ``name``; False when there was none. Built-in splits stay."""
        in_memory = cls._splits.pop(name, None) is not None
        return _Stored.remove(name, None) or in_memory


def available_datasets() -> list[str]:
    """Names that ``load_dataset`` accepts without a path or hub id."""
    return DatasetRegistry.get_dataset_names()


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


def load_data_files(files: Any, what: str) -> datasets.Dataset:
    """verl's ``data.train_files`` / ``data.val_files``: one data file or a list of them (.parquet,
    .jsonl, .json or .csv), their rows in order. Files only: a registered name or a hub id is an
    argument's business (``train_dataset``), not a config key's. Errors start with ``what``."""
    paths = [files] if isinstance(files, (str, os.PathLike)) else files
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise ValueError(f"{what}: must be the path of a data file or a list of them, got {files!r}.")
    for path in map(str, paths):
        if Path(path).suffix.lower() not in _FILE_BUILDERS:
            raise ValueError(
                f"{what}: {path} is not a data file (.parquet, .jsonl, .json or .csv), which is what verl reads "
                "there; a registered dataset or a hub id goes in train_dataset= instead."
            )
    parts = [load_dataset(str(path), what=what) for path in paths]
    try:
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except ValueError as exc:  # columns that differ between the files
        raise ValueError(f"{what}: the files {', '.join(map(str, paths))} cannot be read as one dataset: {exc}") from exc


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
    if name in available_datasets():
        return _pick_split(DatasetRegistry.splits(name), named_split or split, what, repr_of=f"dataset {name!r}")
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
