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
from a background thread, when the library runs without the platform; the platform's sink stores
them in its artifact store instead and indexes them in its database.
"""

from __future__ import annotations

import io
import json
import logging
import math
import random
import threading
import weakref
from collections import deque
from pathlib import Path
from typing import IO, Any, Iterable

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
    background thread. At most ``max_pending`` steps wait: when writing falls behind training, the
    newest step is dropped (counted in ``dropped``, logged once) rather than holding up a step or
    growing without bound."""

    def __init__(self, run_path: str | Path, max_pending: int = 16) -> None:
        self.folder = Path(run_path) / "episodes"
        self.max_pending = max_pending
        self.dropped = 0
        self._queue: deque[tuple[int, list[dict[str, Any]]]] = deque()
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="episode-store", daemon=True)
        self._thread.start()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def store_episodes(self, step: int, records: list[dict[str, Any]]) -> None:
        with self._lock:
            if len(self._queue) >= self.max_pending:
                if not self.dropped:
                    logger.warning("episode store: writing Parquet falls behind training; the episodes of step %d "
                                   "and of later steps that find %d steps waiting are not kept", step, self.max_pending)
                self.dropped += len(records)
                return
            self._queue.append((step, records))
            self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=120)

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if not self._queue:
                    return
                step, records = self._queue[0]
            try:
                for split in SPLITS:
                    part = [r for r in records if r["split"] == split]
                    if part:
                        target = self.folder / split / step_file_name(step, part[0]["position"])
                        target.parent.mkdir(parents=True, exist_ok=True)
                        partial = target.with_name(target.name + ".partial")
                        partial.write_bytes(to_parquet(part))
                        partial.replace(target)
            except Exception:  # noqa: BLE001 (a full disk, a record that will not convert: training goes on)
                logger.exception("episode store: could not write the episodes of step %d", step)
            with self._lock:
                self._queue.popleft()


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
