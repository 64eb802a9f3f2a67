"""The episode store's records: every episode a run trains on (and validates with), whole.

A backend builds one record per episode (``episode_record``), keeps the share the config asks for
(``keep_for_store``: ``trainer.log_episodes``, ``trainer.log_episodes_fraction``,
``trainer.log_episodes_per_step``) and hands each step's records to the sinks' ``store_episodes``.
Records are flat dicts of the ``COLUMNS`` below, so one step is one Parquet table: the few fields
one filters on (step, group, reward, termination, data source) as columns, the bulky bodies (turns,
token ids, mask, log-probabilities) beside them. ``token_ids``, ``mask`` and ``logprobs`` are
aligned over the response (everything after the first prompt): ``mask`` is 1 where the model
produced the token and it was trained on, 0 where the environment did; ``prompt_ids`` is the first
prompt. ``logprobs`` is empty where the generator recorded none (TRL's own single-turn generation).
``retokenization_drift`` says whether rendering the finished conversation again through the
tokenizer's chat template gives back other ids than those generated (``drift_position``: the first
differing position over ``prompt_ids`` + ``token_ids``; None where it was not checked: the rollout
engine checks each episode it runs, ``training.rendering.retokenization_drift``).
``token_texts`` is each response token decoded alone (``token_pieces``, filled in by the backend
that holds the tokenizer, for the records it keeps), so a reader needs no tokenizer; empty where
none was decoded.

``ParquetEpisodeSink`` writes them into the run folder (``<run path>/episodes/<split>/step-*.parquet``)
from a process of its own, when the library runs without the platform; the platform's sink stores
them in its artifact store instead and indexes them in its database.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import random
import signal
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Iterable

import orjson

from training.types import Episode

logger = logging.getLogger("training")

TRAIN, VALIDATION = "train", "val"
SPLITS = (TRAIN, VALIDATION)
# Rows per Parquet row group: reading one episode back decodes one group, not the whole step. At
# least ROW_GROUP_SIZE, more while a group holds under ROW_GROUP_BYTES (in memory): a group's every
# column costs pages of its own, and a step of short episodes in groups of 8 took 3 times the CPU to
# write of one group (32 episodes of 16 tokens); 8 episodes of 1,000 tokens are past it already.
ROW_GROUP_SIZE = 8
ROW_GROUP_BYTES = 64 * 1024
# Characters of a conversation kept for text search (the platform's ``q`` filter).
SEARCH_TEXT_CHARS = 2000
# Characters of an error's traceback kept in a record.
TRACEBACK_CHARS = 20_000


def _schema():
    import pyarrow as pa  # a dependency of datasets; imported where Parquet is written or read

    return pa.schema([
        ("split", pa.string()), ("step", pa.int64()), ("attempt", pa.int64()), ("position", pa.int32()),
        ("group", pa.string()), ("group_position", pa.int32()), ("data_source", pa.string()), ("row_index", pa.int64()),
        ("prompt", pa.string()), ("turns", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())), ("token_ids", pa.list_(pa.int32())),
        ("token_texts", pa.list_(pa.string())), ("mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("advantage", pa.float64()), ("reward", pa.float64()), ("reward_components", pa.string()), ("is_correct", pa.bool_()),
        ("termination_reason", pa.string()), ("prompt_length", pa.int32()), ("response_length", pa.int32()),
        ("num_turns", pa.int32()), ("generation_seconds", pa.float64()), ("env_seconds", pa.float64()),
        ("episode_seconds", pa.float64()), ("error", pa.string()), ("traceback", pa.string()),
        ("retokenization_drift", pa.bool_()), ("drift_position", pa.int64()),
    ])


COLUMNS = ("split", "step", "attempt", "position", "group", "group_position", "data_source", "row_index", "prompt",
           "turns", "prompt_ids", "token_ids", "token_texts", "mask", "logprobs", "advantage", "reward", "reward_components",
           "is_correct", "termination_reason", "prompt_length", "response_length", "num_turns", "generation_seconds",
           "env_seconds", "episode_seconds", "error", "traceback", "retokenization_drift", "drift_position")
# Stored as JSON text in Parquet, handed back as Python values by ``read_records``.
JSON_COLUMNS = ("prompt", "turns", "reward_components")
# The bulky columns: written without a dictionary (a step's token ids and texts hardly repeat) and
# without min/max statistics (a row group's longest texts, twice over, for no reader): a step of 256
# episodes of 1,000 tokens is written in half the CPU (88 -> 47 ms) and 40 % fewer bytes (3.0 -> 1.8 MB).
BODY_COLUMNS = ("prompt", "turns", "prompt_ids", "token_ids", "token_texts", "mask", "logprobs", "reward_components",
                "traceback")
_INDEX_COLUMNS = [name for name in COLUMNS if name not in BODY_COLUMNS]


def episode_record(episode: Episode, *, split: str, step: int, position: int, group: str, group_position: int,
                   row_index: int | None = None, advantage: float | None = None,
                   reward_components: dict[str, Any] | None = None) -> dict[str, Any]:
    """One episode as a store record. ``group`` names its prompt's group (verl's ``uid``),
    ``position`` its place among the step's episodes; ``reward_components`` defaults to what the
    reward function returned (``RewardOutput.metadata``, kept by the rollout engine) with ``score``."""
    task = episode.task if isinstance(episode.task, dict) else {}
    turns, prompt, generation, env = [], None, 0.0, 0.0
    for trajectory in episode.trajectories:
        seen = 0
        for turn in trajectory.steps:
            messages = [_plain(m) for m in turn.chat_completions]
            if prompt is None:
                prompt = messages
            info = turn.info if isinstance(turn.info, dict) else {}
            generation += float(info.get("generation_seconds") or 0.0)
            env += float(info.get("env_seconds") or 0.0)
            turns.append({
                "trajectory": trajectory.name, "messages": messages[seen:], "response": turn.model_response,
                "reward": _finite(turn.reward), "done": bool(turn.done),
                "generation_seconds": info.get("generation_seconds"), "env_seconds": info.get("env_seconds"),
            })
            seen = len(messages)
    if prompt is None:
        prompt = task.get("prompt", task.get("question", ""))
    reward = _finite(episode.reward)
    components = reward_components if reward_components is not None else episode.info.get("reward_components")
    components = {"score": reward, **({} if components is None else dict(components))}
    traceback = str(episode.info.get("traceback") or "")[-TRACEBACK_CHARS:]
    mask = [int(m) for m in episode.response_mask]
    retokenization = episode.info.get("retokenization") if isinstance(episode.info.get("retokenization"), dict) else {}
    return {
        "split": split, "step": int(step), "attempt": None, "position": int(position), "group": str(group),
        "group_position": int(group_position), "data_source": str(task.get("data_source") or ""),
        "row_index": row_index, "prompt": _plain(prompt), "turns": turns,
        "prompt_ids": [int(t) for t in episode.prompt_ids], "token_ids": [int(t) for t in episode.response_ids],
        "token_texts": [], "mask": mask, "logprobs": [float(x) for x in episode.response_logprobs],
        "advantage": _finite(advantage), "reward": reward, "reward_components": _plain(components),
        "is_correct": bool(episode.is_correct),
        "termination_reason": episode.termination_reason.value if episode.termination_reason else "",
        "prompt_length": len(episode.prompt_ids), "response_length": sum(mask), "num_turns": episode.num_turns,
        "generation_seconds": generation, "env_seconds": env,
        "episode_seconds": _finite(episode.metrics.get("episode_time")),
        "error": str(episode.error or ""), "traceback": traceback,
        "retokenization_drift": bool(retokenization["drift"]) if "drift" in retokenization else None,
        "drift_position": retokenization.get("position") if retokenization.get("drift") else None,
    }


def keep_for_store(records: list[dict[str, Any]], fraction: float, per_step: int, seed: int) -> list[dict[str, Any]]:
    """The records of one step the config keeps: a seeded sample of ``fraction`` of them, then at
    most ``per_step`` (0: no limit), in their original order."""
    count = len(records)
    keep = count if fraction >= 1 else max(1, math.ceil(count * fraction)) if count else 0
    if per_step:
        keep = min(keep, per_step)
    if keep >= count:
        return records
    chosen = sorted(random.Random(seed).sample(range(count), keep))
    return [records[i] for i in chosen]


def token_pieces(tokenizer: Any, token_ids: list[int]) -> list[str]:
    """Each token of ``token_ids`` decoded alone: what a reader shows for a token. A token that is
    part of a multi-byte character decodes to the replacement character. A token decodes alone the
    same way every time, so each tokenizer's pieces are kept (at most its vocabulary): a run decodes
    a token once, in one batched call with the others it meets first, not at every step (decoding
    every token of every step was two thirds of the training thread's cost of the episode store)."""
    try:
        known = _pieces.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be a weak key: decoded each time
        known = {}
    missing = sorted({t for t in token_ids if t not in known})
    if missing:
        known.update(zip(missing, (str(piece) for piece in tokenizer.batch_decode([[t] for t in missing]))))
    return [known[t] for t in token_ids]


_pieces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {token id: its piece}


def search_text(record: dict[str, Any]) -> str:
    """The conversation's text (prompt, then each turn's new messages and reply), as the
    platform's ``q`` filter searches it: the first ``SEARCH_TEXT_CHARS`` characters."""
    parts = [_text_of(record.get("prompt"))]
    for turn in record.get("turns") or []:
        parts.extend(_text_of(m) for m in turn.get("messages") or [])
        parts.append(str(turn.get("response") or ""))
    return "\n".join(p for p in parts if p)[:SEARCH_TEXT_CHARS]


def to_parquet(records: list[dict[str, Any]]) -> bytes:
    """Records as one Parquet file (readable by ``pandas.read_parquet``)."""
    import pyarrow.parquet as pq  # a dependency of datasets; imported where Parquet is written

    table = to_table(records)
    rows_per_group = max(ROW_GROUP_SIZE, ROW_GROUP_BYTES * table.num_rows // max(table.nbytes, 1))
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=rows_per_group, compression="zstd",
                   use_dictionary=_INDEX_COLUMNS, write_statistics=_INDEX_COLUMNS)
    return buffer.getvalue()


def to_table(records: list[dict[str, Any]]):
    import pyarrow as pa  # a dependency of datasets; imported where Parquet is written

    columns = {name: [r.get(name) for r in records] for name in COLUMNS}
    for name in JSON_COLUMNS:
        columns[name] = [json.dumps(value, default=str) for value in columns[name]]
    return pa.table(columns, schema=_schema())


def read_records(handle: IO[bytes], rows: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Records of a Parquet file written by ``to_parquet``: all, or those at the row numbers ``rows``
    (only their row groups are decoded), in the order asked."""
    import pyarrow.parquet as pq  # a dependency of datasets; imported where Parquet is read

    parquet = pq.ParquetFile(handle)
    if rows is None:
        table = parquet.read()
        return [_from_row(row) for row in table.to_pylist()]
    wanted = list(rows)
    found: dict[int, dict[str, Any]] = {}
    sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
    starts = [sum(sizes[:g]) for g in range(len(sizes))]
    by_group: dict[int, set[int]] = {}
    for row in wanted:
        group = _group_of(row, starts, sizes)
        if group is not None:
            by_group.setdefault(group, set()).add(row)
    for group, numbers in sorted(by_group.items()):
        table = parquet.read_row_group(group)
        # Only the rows asked become Python objects (a row group's other rows' tokens cost as much).
        for number in numbers:
            found[number] = table.slice(number - starts[group], 1).to_pylist()[0]
    return [_from_row(found[r]) for r in wanted if r in found]


def _group_of(row: int, starts: list[int], sizes: list[int]) -> int | None:
    for group, (start, size) in enumerate(zip(starts, sizes)):
        if start <= row < start + size:
            return group
    return None


def _from_row(row: dict[str, Any]) -> dict[str, Any]:
    for name in JSON_COLUMNS:
        row[name] = json.loads(row[name]) if row.get(name) else None
    return row


def step_file_name(step: int, first_position: int, attempt: int | None = None) -> str:
    """``step-00000012[-a2]-p000000.parquet``: one step's records from ``first_position`` on. Names
    sort by step; a batch written again (a retried write, a resumed attempt replaying the step)
    gets the same name."""
    tag = f"-a{attempt}" if attempt is not None else ""
    return f"step-{int(step):08d}{tag}-p{int(first_position):06d}.parquet"


class ParquetEpisodeSink:
    """Writes each step's stored episodes to ``<run path>/episodes/<split>/`` as Parquet, from a
    process of its own, so that making Parquet never holds the training process's GIL (in a thread of
    the training process it slowed training by 5-14 %, bench/results/episodes.json).

    The training thread hands a step over as one file in ``episodes/.pending/`` (its records as JSON,
    orjson: a few ms a step) and goes on. The writer is forked from the training process when the
    sink is made (it imports nothing: fork copies what is loaded); it turns each pending file into
    ``step-*.parquet`` and deletes it. ``close()`` waits for it to write every step handed over. A
    pending file is never lost: one the writer could not write (the writer killed, the training
    process killed first) is written by ``close()``, or by the next sink made on the run folder (a
    resumed run). At most ``max_pending`` steps wait: when writing falls behind training, the newest
    step is dropped (counted in ``dropped``, logged once) rather than growing without bound. Where
    the platform has no ``fork`` the writer is a thread of the training process."""

    def __init__(self, run_path: str | Path, max_pending: int = 16) -> None:
        self.folder = Path(run_path) / "episodes"
        self.pending = self.folder / PENDING
        self.pending.mkdir(parents=True, exist_ok=True)
        (self.pending / CLOSED).unlink(missing_ok=True)
        self.max_pending = max_pending
        self.dropped = 0
        self._handed = 0
        self._closed = False
        self._pid: int | None = None
        self._thread: threading.Thread | None = None
        if hasattr(os, "fork"):
            self._pid = _fork_writer(self.folder)
        else:
            self._thread = threading.Thread(target=write_pending, args=(self.folder, True), name="episode-store",
                                            daemon=True)
            self._thread.start()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def store_episodes(self, step: int, records: list[dict[str, Any]]) -> None:
        if not records or self._closed:
            return
        if len(_pending_files(self.pending)) >= self.max_pending:
            if not self.dropped:
                logger.warning("episode store: writing Parquet falls behind training; the episodes of step %d "
                               "and of later steps that find %d steps waiting are not kept", step, self.max_pending)
            self.dropped += len(records)
            return
        self._handed += 1
        target = self.pending / f"step-{int(step):08d}-{time.time_ns():020d}-{self._handed:06d}.json"
        partial = target.with_name(target.name + ".partial")
        try:
            partial.write_bytes(_encode_records(records))
            partial.replace(target)
        except OSError:  # a full disk: the step is not kept, training goes on
            partial.unlink(missing_ok=True)
            logger.exception("episode store: could not hand over the episodes of step %d", step)
            self.dropped += len(records)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        (self.pending / CLOSED).touch()
        if self._pid is not None:
            deadline = time.monotonic() + 120
            while os.waitpid(self._pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    logger.error("episode store: the Parquet writer did not finish in 120 s; stopped, its steps written here")
                    os.kill(self._pid, signal.SIGKILL)
                    os.waitpid(self._pid, 0)
                    break
                time.sleep(POLL_SECONDS)
        elif self._thread is not None:
            self._thread.join(timeout=120)
        write_pending(self.folder, until_closed=False)  # what the writer left (killed): written here
        (self.pending / CLOSED).unlink(missing_ok=True)
        try:
            self.pending.rmdir()  # a reader of the run folder finds only the steps
        except OSError:  # a step that could not be written is left there for the next sink on the folder
            pass


# The folder under ``<run path>/episodes/`` of the steps handed over and not yet written, and the
# marker the training process leaves there when its sink is closed.
PENDING, CLOSED = ".pending", "closed"
POLL_SECONDS = 0.02


def _fork_writer(folder: Path) -> int:
    """A process forked from this one that writes ``folder``'s pending steps until the sink is
    closed or this process is gone (``write_pending``), then exits without running any of this
    process's exit handlers."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    status = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops training; the writer still writes what it was handed
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # never the training process's own handler
        write_pending(folder, until_closed=True, parent=parent)
    except BaseException:  # noqa: BLE001 (the writer must end here, never run on as a copy of the training process)
        logger.exception("episode store: the Parquet writer failed")
        status = 1
    finally:
        os._exit(status)


def write_pending(folder: Path, until_closed: bool, parent: int | None = None) -> None:
    """Each step waiting in ``folder/.pending`` written as ``<split>/step-*.parquet`` and deleted,
    oldest first. ``until_closed``: go on waiting for more until the sink is closed (its marker) or
    ``parent`` is gone, then write what is left."""
    pending = folder / PENDING
    while True:
        closing = (pending / CLOSED).exists() or (parent is not None and os.getppid() != parent)
        waiting = _pending_files(pending)
        for path in waiting:
            _write_step(folder, path)
        if not until_closed or (closing and not waiting):
            return
        if not waiting:
            time.sleep(POLL_SECONDS)


def _pending_files(pending: Path) -> list[Path]:
    try:
        return sorted(path for path in pending.iterdir() if path.suffix == ".json")
    except FileNotFoundError:
        return []


def _write_step(folder: Path, path: Path) -> None:
    try:
        records = _decode_records(path.read_bytes())
        step = records[0]["step"] if records else 0
        for split in SPLITS:
            part = [r for r in records if r["split"] == split]
            if part:
                target = folder / split / step_file_name(step, part[0]["position"])
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".partial")
                partial.write_bytes(to_parquet(part))
                partial.replace(target)
    except FileNotFoundError:  # written and deleted by another writer of the folder (close() after a slow writer)
        return
    except Exception:  # noqa: BLE001 (a full disk, a record that will not convert: training goes on)
        logger.exception("episode store: could not write the episodes in %s", path.name)
    path.unlink(missing_ok=True)


def _encode_records(records: list[dict[str, Any]]) -> bytes:
    """A step's records as JSON, marked with the encoder: orjson, or json where orjson refuses (an
    integer past 64 bits), which json reads back as it was."""
    try:
        return b"o" + orjson.dumps(records, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return b"j" + json.dumps(records, separators=(",", ":")).encode()


def _decode_records(data: bytes) -> list[dict[str, Any]]:
    return orjson.loads(data[1:]) if data[:1] == b"o" else json.loads(data[1:])


def read_run_folder(run_path: str | Path, split: str = "train") -> list[dict[str, Any]]:
    """The episodes ``ParquetEpisodeSink`` kept in ``<run path>/episodes/<split>/``, step by step (a
    run trained with the library alone; the platform's runs are read through its API)."""
    records: list[dict[str, Any]] = []
    for path in sorted((Path(run_path) / "episodes" / split).glob("step-*.parquet")):
        with open(path, "rb") as handle:
            records.extend(read_records(handle))
    return records


def _plain(value: Any) -> Any:
    """JSON-able: dicts, lists and scalars as they are, anything else as its text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text_of(value: Any) -> str:
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else json.dumps(content, default=str) if content else ""
    if isinstance(value, list):
        return "\n".join(_text_of(v) for v in value)
    return "" if value is None else str(value)
