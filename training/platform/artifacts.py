"""Run files on an artifact store: a local folder or any S3-compatible object store, through fsspec.

``ArtifactStore(url)`` is one root (``/srv/artifacts``, ``file:///srv/artifacts`` or
``s3://bucket/prefix``) with keys below it (``runs/12-<uid>/checkpoints/checkpoint-3/model.safetensors``).
S3 credentials come from the standard AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``), and ``AWS_ENDPOINT_URL`` points at a store other than AWS (MinIO, Ceph, R2).

``RunUploader`` copies what a training run writes in its local scratch folder to the store while it
trains: each checkpoint as it is saved, in a background thread with a bounded backlog, retried with
backoff while the store is unreachable (training goes on, the log says so once), and at the end the
final model and the run's files. A checkpoint directory is complete in the store once its
``.stored`` marker, written after its last file, is there; resuming downloads the newest complete one.

This module is part of the training library: it never imports Django.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator
from training.backends.processor import BEST_METRIC_FILE
from training.errors import ArtifactStoreError
from training.utils import checkpoint_step

logger = logging.getLogger("training")

# Written into a checkpoint directory in the store after its last file: the directory is whole.
STORED_MARKER = ".stored"
# The run's own small files, copied to the store beside its checkpoints (each time one is stored, and
# at the end); a resumed attempt elsewhere starts from them (trackers.json: the same W&B/MLflow runs).
RUN_FILES = ("config.yaml", "metrics.jsonl", "episodes.jsonl", "trackers.json")
# Beside the checkpoints (``checkpoints/<name>`` in the store): the metric values that rank the run's best
# checkpoints, stored after each pruning, so that an attempt on another machine keeps the same best.
CHECKPOINT_FILES = (BEST_METRIC_FILE,)
# verl writes this beside its global_step_N folders once step N is saved whole.
VERL_LATEST = "latest_checkpointed_iteration.txt"


class ArtifactStore:
    """Keys under one root of a filesystem fsspec knows (local, s3).

    Keys are relative, ``/``-separated, and never leave the root (``..`` and absolute keys are refused).
    """

    def __init__(self, url: str) -> None:
        import fsspec

        url = str(url).strip()
        if not url:
            raise ValueError("An artifact store needs a URL: a folder, file:///folder or s3://bucket/prefix.")
        self.url = url
        self.remote = "://" in url and not url.startswith("file://")
        options: dict[str, Any] = {}
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        if protocol in ("s3", "s3a"):
            # Few tries inside the client: RunUploader retries with its own backoff, and says so.
            options = {"skip_instance_cache": True, "use_listings_cache": False,
                       "config_kwargs": {"retries": {"max_attempts": 2}, "connect_timeout": 10, "read_timeout": 120}}
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                options["client_kwargs"] = {"endpoint_url": endpoint}
        elif protocol == "file":
            options = {"auto_mkdir": True}
        else:
            raise ValueError(f"Artifact store {url!r}: use a folder, file:///folder or s3://bucket/prefix.")
        self.fs, root = fsspec.core.url_to_fs(url, **options)
        if hasattr(self.fs, "retries"):
            self.fs.retries = 1
        self.root = root.rstrip("/")
        if not self.remote:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    # -- keys ----------------------------------------------------------------------------------
    def path(self, key: str) -> str:
        """The filesystem path of ``key``; refuses keys that would leave the root."""
        parts = [p for p in str(key).replace("\\", "/").split("/") if p not in ("", ".")]
        if not parts or ".." in parts or str(key).startswith("/"):
            raise ValueError(f"Artifact key {key!r} is not a relative path inside the store.")
        return f"{self.root}/{'/'.join(parts)}"

    def _key(self, path: str) -> str:
        path = path.split("://", 1)[-1] if self.remote else path
        root = self.root.split("://", 1)[-1]
        return path[len(root):].lstrip("/") if path.startswith(root) else path

    # -- objects -------------------------------------------------------------------------------
    def put_file(self, local: str | Path, key: str) -> None:
        path = self.path(key)
        try:
            self.fs.put_file(str(local), path)
        except Exception as exc:
            raise ArtifactStoreError(f"storing {key}: {exc.__class__.__name__}: {exc}") from exc

    def put_bytes(self, data: bytes, key: str) -> None:
        path = self.path(key)
        try:
            self.fs.pipe_file(path, data)
        except Exception as exc:
            raise ArtifactStoreError(f"storing {key}: {exc.__class__.__name__}: {exc}") from exc

    def put_dir(self, local: str | Path, key: str, marker: bool = True) -> int:
        """Every regular file under ``local`` to ``key/...`` (links and devices are skipped), then
        the ``.stored`` marker. Returns the number of files stored."""
        local = Path(local)
        count = 0
        for file in sorted(local.rglob("*")):
            if file.is_file() and not file.is_symlink():
                self.put_file(file, f"{key}/{file.relative_to(local).as_posix()}")
                count += 1
        if marker:
            self.put_bytes(b"", f"{key}/{STORED_MARKER}")
        return count

    def get_file(self, key: str, local: str | Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        try:
            self.fs.get_file(path, str(local))
        except Exception as exc:
            raise ArtifactStoreError(f"fetching {key}: {exc.__class__.__name__}: {exc}") from exc

    def get_dir(self, key: str, local: str | Path) -> int:
        """Every object under ``key/`` into ``local`` (the marker left out). Returns the number of files."""
        count = 0
        for name in self.list(key):
            if name == STORED_MARKER:
                continue
            self.get_file(f"{key}/{name}", Path(local) / name)
            count += 1
        return count

    def open(self, key: str) -> IO[bytes]:
        path = self.path(key)
        try:
            return self.fs.open(path, "rb")
        except Exception as exc:
            raise ArtifactStoreError(f"reading {key}: {exc.__class__.__name__}: {exc}") from exc

    def exists(self, key: str) -> bool:
        path = self.path(key)
        try:
            return bool(self.fs.exists(path))
        except Exception as exc:
            raise ArtifactStoreError(f"looking up {key}: {exc.__class__.__name__}: {exc}") from exc

    def size(self, key: str) -> int:
        path = self.path(key)
        try:
            return int(self.fs.size(path))
        except Exception as exc:
            raise ArtifactStoreError(f"looking up {key}: {exc.__class__.__name__}: {exc}") from exc

    def list(self, prefix: str = "") -> list[str]:
        """The keys of every object under ``prefix``, relative to it, sorted ([] when there are none)."""
        base = self.path(prefix) if prefix else self.root
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise ArtifactStoreError(f"listing {prefix or '/'}: {exc.__class__.__name__}: {exc}") from exc
        base_key = self._key(base)
        keys = []
        for path in found:
            key = self._key(path)
            relative = key[len(base_key):].lstrip("/") if base_key else key
            if relative:
                keys.append(relative)
        return sorted(keys)

    def children(self, prefix: str = "") -> list[str]:
        """The names directly under ``prefix`` (objects and folders alike), sorted."""
        return sorted({key.split("/", 1)[0] for key in self.list(prefix)})

    def delete(self, prefix: str) -> int:
        """Every object under ``prefix`` (or the object ``prefix`` itself). Returns how many were removed."""
        keys = self.list(prefix)
        path = self.path(prefix)
        try:
            if keys:
                self.fs.rm([self.path(f"{prefix}/{k}") for k in keys])
            elif self.exists(prefix) and not self.fs.isdir(path):
                self.fs.rm_file(path)
                return 1
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise ArtifactStoreError(f"deleting {prefix}: {exc.__class__.__name__}: {exc}") from exc
        if not self.remote:  # object stores have no folders; a local store keeps no empty ones
            _remove_empty_dirs(Path(self.path(prefix)))
        return len(keys)

    def presign(self, key: str, expires: int = 300) -> str | None:
        """A URL that fetches ``key`` without credentials for ``expires`` seconds, or None where the
        store has none (a local folder)."""
        if not self.remote:
            return None
        try:
            return self.fs.sign(self.path(key), expiration=expires)
        except NotImplementedError:
            return None

    # -- checkpoints ---------------------------------------------------------------------------
    def stored_checkpoints(self, prefix: str) -> list[tuple[int, str]]:
        """(step, name) of each complete checkpoint directory under ``prefix``, oldest first. Names
        end in their step: ``checkpoint-3`` (TRL), ``global_step_3`` (verl)."""
        found = []
        for key in self.list(prefix):
            name, _, rest = key.partition("/")
            if rest == STORED_MARKER and (step := checkpoint_step(name)) is not None:
                found.append((step, name))
        return sorted(found)

    def fetch_latest_checkpoint(self, prefix: str, local_dir: str | Path, max_step: int | None = None) -> Path | None:
        """Download the newest complete checkpoint under ``prefix`` (of a step up to ``max_step``, when
        given) into ``local_dir/<name>``, unless a complete copy is there already. Returns its local
        path, or None when the store has none."""
        stored = [(step, name) for step, name in self.stored_checkpoints(prefix) if max_step is None or step <= max_step]
        if not stored:
            return None
        step, name = stored[-1]
        target = Path(local_dir) / name
        if not (target / STORED_MARKER).exists():
            partial = target.with_name(f".{name}.partial")
            _rmtree(partial)
            count = self.get_dir(f"{prefix}/{name}", partial)
            (partial / STORED_MARKER).touch()
            _rmtree(target)
            partial.rename(target)
            logger.info("fetched checkpoint %s (step %d, %d files) from the artifact store", name, step, count)
        if name.startswith("global_step_"):  # verl resumes from the step its marker file names
            (Path(local_dir) / VERL_LATEST).write_text(str(step))
        return target


def prune_checkpoints(store: ArtifactStore, prefix: str, keep: int, kept: set[int] = frozenset(),
                      best: Callable[[list[int]], set[int]] | None = None) -> list[str]:
    """Remove all but the ``keep`` newest complete checkpoints under ``prefix``, those of the steps in
    ``kept`` and those ``best`` picks among the stored steps (the run's best by its metric, the rule of
    its local rotation: ``TrainerProcessor.best_checkpoint_steps``), the marker first, so a half-removed
    one is never taken for whole. Returns the names removed."""
    stored = store.stored_checkpoints(prefix)
    if best is not None and stored:  # asked even with nothing to remove: it records the values it ranks by
        kept = set(kept) | set(best([step for step, _ in stored]))
    removed = []
    for step, name in stored[:-keep] if keep > 0 else []:
        if step in kept:
            continue
        store.delete(f"{prefix}/{name}/{STORED_MARKER}")
        store.delete(f"{prefix}/{name}")
        removed.append(name)
    if removed:
        logger.info("artifact store: removed checkpoint(s) %s (the newest %d are kept, and the best and aliased ones)",
                    ", ".join(removed), keep)
    return removed


@dataclass
class _Upload:
    local: Path
    key: str
    directory: bool
    checkpoint: bool = False


class RunUploader:
    """Copies a run's scratch folder to ``store`` under ``prefix`` as it trains.

    ``checkpoint_saved`` queues a checkpoint directory and returns at once; one background thread
    stores the queue in order, retrying each upload with backoff (``retry_max_seconds`` at most
    between tries) until it is stored. At most ``max_pending`` checkpoints wait: when the store is
    slower than training, the oldest waiting one is dropped for the newer (resuming needs the newest).
    With ``keep_last``, only that many of the newest stored checkpoints are kept (and those of the
    steps ``kept`` names, asked at each pruning, and those ``best`` picks among the stored). Local copies of
    stored checkpoints older than the newest are removed from the scratch folder.
    ``finish`` stores the final model and the run files and waits until everything is stored.
    ``may_write`` (a platform attempt's fencing token) is asked before each upload: once it says
    no, nothing more is stored and what waits is dropped (``superseded``).
    """

    def __init__(self, store: ArtifactStore, prefix: str, scratch: str | Path, log_name: str = "",
                 max_pending: int = 8, retry_max_seconds: float = 30.0, keep_last: int | None = None,
                 may_write: Callable[[], bool] | None = None, kept: Callable[[], set[int]] | None = None,
                 best: Callable[[list[int]], set[int]] | None = None) -> None:
        self.store = store
        self.may_write = may_write
        self.kept = kept  # steps whose stored checkpoints are never pruned (a platform's aliases)
        # Among the stored steps, the best checkpoints by the run's metric, never pruned either (the
        # backend's ``best_checkpoint_steps``, which the worker sets once the trainer is built).
        self.best = best
        self.superseded = False
        self.keep_last = keep_last
        self.prefix = prefix.strip("/")
        self.scratch = Path(scratch)
        self.log_name = log_name
        self.max_pending = max(1, max_pending)
        self.retry_max_seconds = retry_max_seconds
        self.stored: set[str] = set()  # keys of checkpoint directories stored by this uploader
        self._queue: deque[_Upload] = deque()
        self._busy = False
        self._current = ""  # the key being stored now
        self._files_due = False
        self._closing = False
        self._outage_since: float | None = None
        self.outages = 0
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="artifact-upload", daemon=True)
        self._thread.start()

    # -- what the training side calls ----------------------------------------------------------
    def checkpoint_saved(self, path: str | Path) -> None:
        """A checkpoint directory was saved completely: store it (in the background)."""
        path = Path(path)
        key = self._key_for(path)
        with self._lock:
            if key in self.stored or key == self._current or any(u.key == key for u in self._queue):
                return
            waiting = [u for u in self._queue if u.checkpoint]
            if len(waiting) >= self.max_pending:
                self._queue.remove(waiting[0])
                logger.warning("artifact store: %d checkpoints wait to be stored; %s is skipped for the newer %s",
                               len(waiting), waiting[0].local.name, path.name)
            self._queue.append(_Upload(path, key, directory=True, checkpoint=True))
            self._files_due = True
            self._lock.notify_all()

    def sweep_checkpoints(self, folder: str | Path) -> None:
        """Queue every checkpoint directory under ``folder`` not stored yet (for backends that do not
        say when they save one; called at the end)."""
        folder = Path(folder)
        if folder.is_dir():
            for child in sorted(folder.iterdir(), key=lambda p: checkpoint_step(p.name) or -1):
                # A checkpoint fetched from the store carries its marker: it is there already.
                if child.is_dir() and checkpoint_step(child.name) is not None and not (child / STORED_MARKER).exists():
                    self.checkpoint_saved(child)

    def finish(self, final_model: str | Path | None, timeout: float) -> None:
        """Store ``final_model`` (a directory) and the run files, and wait until everything queued is
        stored. Raises ArtifactStoreError when that has not happened within ``timeout`` seconds."""
        with self._lock:
            if final_model is not None and Path(final_model).is_dir():
                final_model = Path(final_model)
                self._queue.append(_Upload(final_model, self._key_for(final_model), directory=True))
            self._files_due = True
            self._closing = True
            self._lock.notify_all()
            deadline = time.monotonic() + timeout
            while (self._queue or self._busy or self._files_due) and not self.superseded:
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting = ", ".join(u.local.name for u in self._queue) or "the run files"
                    raise ArtifactStoreError(
                        f"the artifact store did not take {waiting} within {timeout:.0f} s"
                        + (f" (unreachable since {time.monotonic() - self._outage_since:.0f} s)" if self._outage_since else ""))
                self._lock.wait(min(left, 1.0))

    # -- the background thread -----------------------------------------------------------------
    def _key_for(self, path: Path) -> str:
        try:
            relative = path.resolve().relative_to(self.scratch.resolve()).as_posix()
        except ValueError:
            raise ValueError(f"{path} is not inside the run's scratch folder {self.scratch}") from None
        return f"{self.prefix}/{relative}"

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._files_due:
                    self._lock.wait()
                upload = self._queue.popleft() if self._queue else None
                files = self._files_due and not self._queue
                self._busy = True
                self._current = upload.key if upload else ""
            try:
                if not self._allowed():
                    continue
                if upload is not None:
                    self._with_retries(lambda: self._store(upload), upload.key)
                elif files:
                    with self._lock:
                        self._files_due = False
                    self._with_retries(self._store_run_files, f"{self.prefix} (run files)")
            finally:
                with self._lock:
                    self._busy = False
                    self._current = ""
                    self._lock.notify_all()

    def _allowed(self) -> bool:
        """Ask ``may_write`` before an upload; on no, drop everything (this attempt no longer holds
        the run). A check that fails (its database away) is asked again: the upload waits."""
        delay = 1.0
        while self.may_write is not None and not self.superseded:
            try:
                if self.may_write():
                    return True
            except Exception as exc:  # noqa: BLE001
                logger.warning("artifact store: cannot ask whether this attempt still holds the run (%s); the upload waits", _short(exc))
                time.sleep(delay)
                delay = min(delay * 2, self.retry_max_seconds)
                continue
            logger.error("artifact store: this attempt no longer holds the run; nothing more of it is stored")
            self.superseded = True
        if self.superseded:
            with self._lock:
                self._queue.clear()
                self._files_due = False
        return not self.superseded

    def _store(self, upload: _Upload) -> None:
        if not upload.local.exists():  # removed locally before its turn (the backend's own rotation)
            logger.warning("artifact store: %s was removed before it could be stored", upload.local)
            return
        if upload.checkpoint:
            # The run files first: a machine lost right after this checkpoint is stored leaves
            # metrics.jsonl holding every step up to it, and the next attempt appends from there.
            self._store_run_files()
        if upload.directory:
            self.store.put_dir(upload.local, upload.key)
        else:
            self.store.put_file(upload.local, upload.key)
        with self._lock:
            self.stored.add(upload.key)
        if upload.checkpoint:
            self._drop_local_copies(upload.local)
            folder = upload.key.rsplit("/", 1)[0]
            if self.keep_last or self.best is not None:
                prune_checkpoints(self.store, folder, self.keep_last or 0,
                                  set(self.kept()) if self.kept is not None else frozenset(), best=self.best)
            for name in CHECKPOINT_FILES:  # written by ``best`` just now: what it ranked by, for a later attempt
                if (upload.local.parent / name).is_file():
                    self.store.put_file(upload.local.parent / name, f"{folder}/{name}")

    def _drop_local_copies(self, newest: Path) -> None:
        """The scratch folder keeps only the newest stored checkpoint: older ones are in the store
        (the backend's own rotation is off while a store is used, so none goes before it is stored)."""
        step = checkpoint_step(newest.name) or 0
        for sibling in newest.parent.iterdir():
            older = checkpoint_step(sibling.name)
            if older is not None and older < step and sibling.is_dir():
                if self._key_for(sibling) in self.stored or (sibling / STORED_MARKER).exists():
                    _rmtree(sibling)

    def _store_run_files(self) -> None:
        for name in RUN_FILES:
            if (self.scratch / name).is_file():
                self.store.put_file(self.scratch / name, f"{self.prefix}/{name}")
        if self.log_name and (self.scratch / "process.log").is_file():
            self.store.put_file(self.scratch / "process.log", f"{self.prefix}/logs/{self.log_name}")

    def _with_retries(self, action, what: str) -> None:
        delay = 1.0
        while True:
            try:
                action()
            except Exception as exc:  # any failure of the store: training goes on, the upload waits
                if self._outage_since is None:
                    self._outage_since = time.monotonic()
                    self.outages += 1
                    logger.warning("artifact store unreachable while storing %s (%s); training goes on and "
                                   "uploads are retried until it is back", what, _short(exc))
                time.sleep(delay)
                delay = min(delay * 2, self.retry_max_seconds)
                continue
            if self._outage_since is not None:
                logger.info("artifact store reachable again after %.0f s; uploads resumed",
                            time.monotonic() - self._outage_since)
                self._outage_since = None
            return


class CheckpointUploadSink:
    """A metric sink that hands every checkpoint a backend saves to a ``RunUploader``: those the
    backend reports (``log_checkpoint``: trl, swift), and verl's, which it names in its marker file
    (looked at with each logged step)."""

    def __init__(self, uploader: RunUploader, checkpoint_dir: str | Path | None = None) -> None:
        self.uploader = uploader
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else uploader.scratch / "checkpoints"

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        try:
            saved = int((self.checkpoint_dir / VERL_LATEST).read_text().strip())
        except (OSError, ValueError):
            return
        folder = self.checkpoint_dir / f"global_step_{saved}"
        if folder.is_dir() and not (folder / STORED_MARKER).exists():
            self.uploader.checkpoint_saved(folder)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def log_checkpoint(self, step: int, path: str | Path) -> None:
        self.uploader.checkpoint_saved(path)

    def close(self) -> None:
        pass


def fetch_run_files(store: ArtifactStore, prefix: str, scratch: str | Path) -> list[str]:
    """The run files (metrics, episodes, config) of an earlier attempt, into a scratch folder that
    lacks them, so this attempt appends to them, and the files beside its checkpoints
    (``CHECKPOINT_FILES``), always: the stored copy is the newest (each pruning stores it), a copy
    left here by an earlier attempt on this machine may be older. Returns the names fetched."""
    fetched = []
    stored = set(store.list(prefix))
    for name in RUN_FILES:
        target = Path(scratch) / name
        if name in stored and not target.exists():
            store.get_file(f"{prefix}/{name}", target)
            fetched.append(name)
    for name in CHECKPOINT_FILES:
        key = f"checkpoints/{name}"
        if key in stored:
            target = Path(scratch) / key
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{name}.partial")
            store.get_file(f"{prefix}/{key}", partial)
            os.replace(partial, target)
            fetched.append(key)
    return fetched


def iter_chunks(handle: IO[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(size):
            yield chunk


def _short(exc: BaseException) -> str:
    text = f"{exc.__class__.__name__}: {exc}"
    return text if len(text) < 300 else text[:297] + "..."


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _remove_empty_dirs(path: Path) -> None:
    if path.is_dir():
        for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if child.is_dir():
                try:
                    child.rmdir()
                except OSError:
                    pass
        try:
            path.rmdir()
        except OSError:
            pass
