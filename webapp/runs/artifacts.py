"""Where the platform keeps run files and uploads: the artifact store named by ``ARTIFACTS_URL``.

Without it (one machine) each run's files stay in the folder it trained in, under ``RUNS_DIR``, and
that folder is the run's place in a local store rooted at ``RUNS_DIR``. With it (a fleet) workers
train in a scratch folder under their own ``RUNS_DIR`` and copy the run's files to
``<ARTIFACTS_URL>/runs/<id>-<uid>/`` (``training.platform.artifacts.RunUploader``), uploads go to
``<ARTIFACTS_URL>/uploads/`` (``ArtifactStorage``, Django's default storage then), and every
machine reads them from there.

Objects are only ever written under the prefix of a run row that exists, or under ``uploads/``
before the row that names them is saved; a crash between the two, or between a run's deletion and
the removal of its objects, leaves objects no row names, which ``manage.py artifacts orphans``
finds (and removes with ``--delete``).
"""

from __future__ import annotations

import logging
import re
import shutil
import time
import uuid
from datetime import datetime, timedelta, timezone as dt_timezone
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Iterable

from django.conf import settings
from django.core.files.base import File
from django.core.files.storage import Storage
from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils.deconstruct import deconstructible

from training.backends.processor import BEST_METRIC_FILE, best_steps, greater_is_better, parse_best_metric
from training.platform.artifacts import STORED_MARKER, ArtifactStore, RunUploader, checkpoint_step, fetch_run_files, prune_checkpoints

from training.errors import ArtifactStoreError
from webapp.policy.keys import RUN_MODEL
from webapp.runs.models import Run, last_step_of

logger = logging.getLogger("training")

RUNS_PREFIX = "runs"
UPLOADS_PREFIX = "uploads"
# A run folder's name: <id>-<uid as 32 hex digits>.
RUN_FOLDER = re.compile(r"^(\d+)-([0-9a-f]{32})$")

_stores: dict[str, ArtifactStore] = {}


def shared() -> bool:
    """True when run files are copied to a store every machine reads (ARTIFACTS_URL is set)."""
    return bool(settings.ARTIFACTS_URL)


def store() -> ArtifactStore:
    """The store run files are kept in: ARTIFACTS_URL's, else a local one over RUNS_DIR."""
    url = settings.ARTIFACTS_URL or str(Path(settings.RUNS_DIR).resolve())
    if url not in _stores:
        _stores[url] = ArtifactStore(url)
    return _stores[url]


def runs_root() -> str:
    """The key under which run folders lie ('' for the local store, whose root is RUNS_DIR)."""
    return RUNS_PREFIX if shared() else ""


def scratch_folder(run) -> Path:
    """Where this machine trains ``run``: its own folder under RUNS_DIR (a run's recorded folder was
    another worker's scratch when the store is shared)."""
    if shared():
        return Path(settings.RUNS_DIR) / f"{run.pk}-{run.uid.hex}"
    return run.folder()


def run_prefix(run) -> str | None:
    """The key of ``run``'s folder in the store, or None when its files are nowhere the store reaches
    (a local run recorded with a folder outside RUNS_DIR)."""
    if shared():
        return f"{RUNS_PREFIX}/{run.pk}-{run.uid.hex}"
    if not run.run_path:
        return None
    folder = Path(run.run_path).resolve()
    root = Path(settings.RUNS_DIR).resolve()
    if not folder.is_relative_to(root) or folder == root:
        return None
    return folder.relative_to(root).as_posix()


def run_checkpoints(run) -> list[tuple[int, str]]:
    """(step, key) of every checkpoint of ``run`` in the store, oldest first. In a shared store only
    complete ones (marked stored); locally, every checkpoint folder."""
    prefix = run_prefix(run)
    if prefix is None:
        return []
    if shared():
        return [(step, f"{prefix}/checkpoints/{name}") for step, name in store().stored_checkpoints(f"{prefix}/checkpoints")]
    folder = Path(store().path(prefix)) / "checkpoints"
    found = [(checkpoint_step(p.name), f"{prefix}/checkpoints/{p.name}") for p in folder.iterdir()
             if p.is_dir() and not p.is_symlink() and checkpoint_step(p.name) is not None] if folder.is_dir() else []
    return sorted(found)


def final_model_key(run) -> str | None:
    """The key of ``run``'s final model folder when the store has it (whole), else None."""
    prefix = run_prefix(run)
    if prefix is None:
        return None
    key = f"{prefix}/final_model"
    if shared():
        return key if store().exists(f"{key}/{STORED_MARKER}") else None
    folder = Path(store().path(key))
    return key if folder.is_dir() and not folder.is_symlink() else None


# -- retention --------------------------------------------------------------------------------

def keep_checkpoints(run) -> int | None:
    """How many checkpoints ``run`` keeps: its project's ``keep_checkpoints``, else the setting (None: all)."""
    project = getattr(run, "project", None)
    value = getattr(project, "keep_checkpoints", None) if project is not None else None
    return value or settings.ARTIFACTS_KEEP_CHECKPOINTS or None


def apply_retention(run) -> list[str]:
    """Remove the checkpoints of ``run`` past the newest ``keep_checkpoints(run)`` from the store, except
    its best ones (``best_checkpoints``) and those a project alias names, as its own rotation keeps
    them: at most ``keep_checkpoints(run)`` + ``trainer.keep_best_checkpoints`` are kept, and the aliased
    ones besides. The final model is never one of them. Returns the keys removed."""
    keep = keep_checkpoints(run)
    if not keep:
        return []
    prefix = run_prefix(run)
    if prefix is None:
        return []
    aliased = set(run.aliases.values_list("step", flat=True))  # the checkpoints app's aliases, read through the relation
    if shared():
        return [f"{prefix}/checkpoints/{name}" for name in prune_checkpoints(
            store(), f"{prefix}/checkpoints", keep, aliased, best=lambda steps: best_checkpoints(run, steps))]
    removed = []
    found = run_checkpoints(run)
    kept = aliased | (best_checkpoints(run, [step for step, _ in found]) if len(found) > keep else set())
    for step, key in found[:-keep]:
        if step not in kept:
            store().delete(key)
            removed.append(key)
    return removed


def best_checkpoints(run, steps: Iterable[int]) -> set[int]:
    """Which of ``steps`` are ``run``'s best checkpoints by its ``trainer.metric_for_best_model`` (as it
    trained: its final config), by the rule of its rotation (``training.backends.processor.best_steps``),
    ranked by the values its training recorded beside its checkpoints (``BEST_METRIC_FILE``). Empty
    without the metric, or without values (a local run trained with ``trainer.max_checkpoints`` 0
    records none: nothing was rotated)."""
    trainer = (run.final_config or {}).get("trainer") if isinstance(run.final_config, dict) else None
    metric = trainer.get("metric_for_best_model") if isinstance(trainer, dict) else None
    if not metric:
        return set()
    wanted = set(steps)
    values = {step: value for step, value in parse_best_metric(read_json(run, f"checkpoints/{BEST_METRIC_FILE}"), metric).items()
              if step in wanted}
    ranking = SimpleNamespace(metric_for_best_model=metric, greater_is_better=trainer.get("greater_is_better"))
    return set(best_steps(values, int(trainer.get("keep_best_checkpoints") or 1), greater_is_better(ranking)))


# -- deletion and orphans ---------------------------------------------------------------------

def delete_run_objects(run) -> int:
    """Remove every object of ``run`` from the store. Returns how many."""
    prefix = run_prefix(run)
    return store().delete(prefix) if prefix else 0


@receiver(post_delete, sender="runs.Run")
def _run_deleted(sender, instance, **kwargs) -> None:
    # After the commit: a rolled-back delete keeps its files. A crash in between leaves an orphan
    # the orphans command finds.
    prefix = run_prefix(instance)
    if prefix:
        transaction.on_commit(lambda: store().delete(prefix))


def orphans(older_than: timedelta = timedelta(hours=1)) -> list[str]:
    """Keys of run folders whose run row is gone and of uploads no row names, last written more than
    ``older_than`` ago (younger ones may belong to a row being written right now)."""
    found = []
    known = {f"{pk}-{uid.hex}" for pk, uid in Run.objects.values_list("pk", "uid")}
    recorded = {Path(p).name for p in Run.objects.exclude(run_path="").values_list("run_path", flat=True)}
    root = runs_root()
    for name in store().children(root):
        key = f"{root}/{name}" if root else name
        if RUN_FOLDER.match(name) and name not in known and name not in recorded and _older(key, older_than):
            found.append(key)
    if shared():
        named = set(_stored_file_names())
        for key in store().list(UPLOADS_PREFIX):
            if key not in named and _older(f"{UPLOADS_PREFIX}/{key}", older_than):
                found.append(f"{UPLOADS_PREFIX}/{key}")
    return found


def _stored_file_names() -> Iterable[str]:
    """The storage names of every file a model's FileField holds (uploads the platform knows)."""
    from django.apps import apps
    from django.db.models import FileField

    for model in apps.get_models():
        for field in model._meta.get_fields():
            if isinstance(field, FileField):
                yield from (n for n in model.objects.exclude(**{field.name: ""}).values_list(field.name, flat=True) if n)


def _older(key: str, age: timedelta) -> bool:
    if age <= timedelta(0):
        return True
    fs = store().fs
    newest = None
    for sub in store().list(key) or [""]:
        path = store().path(f"{key}/{sub}" if sub else key)
        try:
            modified = fs.modified(path)
        except (OSError, NotImplementedError):
            continue
        if modified.tzinfo is None:
            modified = modified.replace(tzinfo=dt_timezone.utc)
        newest = modified if newest is None or modified > newest else newest
    return newest is None or newest < datetime.now(dt_timezone.utc) - age


# -- uploads ----------------------------------------------------------------------------------

def store_upload(project_id: int | None, filename: str, content: IO[bytes]) -> str:
    """Store an uploaded file under its project (``datasets/<project>/<random>-<name>``) in the
    default storage (the artifact store when ARTIFACTS_URL is set). Returns its storage name, for
    a FileField."""
    from django.core.files.storage import default_storage

    safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(filename).name)[-100:] or "upload"
    return default_storage.save(f"datasets/{project_id or 'none'}/{uuid.uuid4().hex[:12]}-{safe}", File(content))


@deconstructible
class ArtifactStorage(Storage):
    """Django's file storage on the artifact store, under ``uploads/`` (the default storage when
    ARTIFACTS_URL is set): a dataset uploaded on the web host is readable by every worker."""

    def _key(self, name: str) -> str:
        return f"{UPLOADS_PREFIX}/{name}"

    def _open(self, name: str, mode: str = "rb") -> File:
        if "w" in mode or "a" in mode:
            raise ValueError("Artifact store files are written whole through save().")
        return File(store().open(self._key(name)), name=name)

    def _save(self, name: str, content: File) -> str:
        content.seek(0) if hasattr(content, "seek") else None
        with store().fs.open(store().path(self._key(name)), "wb") as target:
            for chunk in content.chunks():
                target.write(chunk)
        return name

    def exists(self, name: str) -> bool:
        return store().exists(self._key(name))

    def delete(self, name: str) -> None:
        store().delete(self._key(name))

    def size(self, name: str) -> int:
        return store().size(self._key(name))

    def url(self, name: str) -> str:
        return store().presign(self._key(name), settings.ARTIFACTS_PRESIGN_SECONDS) or ""

    def listdir(self, path: str):
        prefix = self._key(path.strip("/")) if path.strip("/") else UPLOADS_PREFIX
        keys = store().list(prefix)
        folders = sorted({k.split("/", 1)[0] for k in keys if "/" in k})
        return folders, sorted(k for k in keys if "/" not in k)


# -- a training attempt's files ---------------------------------------------------------------

def start_uploads(run, scratch: Path, may_write=None, kept=None) -> RunUploader | None:
    """Before an attempt trains in ``scratch``: with a shared store, fetch what earlier attempts
    stored (the run files, the newest whole checkpoint, which the backend then resumes from) and
    return the uploader that copies this attempt's files as they are written. None without one.
    ``may_write``: the attempt's fencing token, asked before each upload."""
    if not shared():
        return None
    prefix = run_prefix(run)
    scratch.mkdir(parents=True, exist_ok=True)
    fetched = _retrying(lambda: fetch_run_files(store(), prefix, scratch), "fetch the run's files")
    max_step = None if _has_spooled_reports(scratch) else _last_recorded_step(run)
    checkpoint = _retrying(
        lambda: store().fetch_latest_checkpoint(f"{prefix}/checkpoints", scratch / "checkpoints", max_step=max_step),
        "fetch the run's latest checkpoint")
    if fetched or checkpoint:
        logger.info("Run %s: fetched %s from the artifact store", run.pk,
                    ", ".join([*fetched, *([f"checkpoints/{checkpoint.name}"] if checkpoint else [])]))
    return RunUploader(store(), prefix, scratch, log_name=f"attempt-{run.attempts}.log",
                       max_pending=settings.ARTIFACTS_MAX_PENDING, retry_max_seconds=settings.ARTIFACTS_RETRY_MAX_SECONDS,
                       keep_last=keep_checkpoints(run), may_write=may_write, kept=kept)


def _has_spooled_reports(scratch: Path) -> bool:
    """Whether an earlier attempt on this machine left reports in the run's spool (they are stored
    before this attempt trains, so its newest checkpoint loses no step)."""
    spool = scratch / "spool"
    return spool.is_dir() and any(spool.glob("*.jsonl"))


def _last_recorded_step(run) -> int:
    """The last step the database holds reports of. An attempt lost with another machine may have
    saved (and stored) a checkpoint after it, with that step's reports still in the lost machine's
    spool: resuming from there would lose them, so an attempt elsewhere resumes from no later step."""
    return max(last_step_of(run.pk), 0)


def finish_uploads(uploader: RunUploader | None, run, scratch: Path, final_model: str | Path | None,
                   timeout: float) -> None:
    """After an attempt: store the checkpoints a backend did not announce, the final model (when it
    is a folder in ``scratch``) and the run files, waiting up to ``timeout`` seconds. Raises
    ArtifactStoreError when the store did not take them. Without a shared store: the project's
    retention, applied to the run's own folder."""
    if uploader is None:
        try:  # housekeeping: never the reason a trained run fails (the database may be down right now)
            apply_retention(run)
        except Exception as exc:
            logger.warning("Run %s: old checkpoints were not removed (%s); manage.py artifacts retention does it later.",
                           run.pk, exc)
        return
    uploader.sweep_checkpoints(scratch / "checkpoints")
    final = Path(final_model) if final_model else None
    if final is not None and not (final.is_dir() and final.resolve().is_relative_to(scratch.resolve())):
        final = None  # a remote backend's model id, not files here
    uploader.finish(final, timeout)


def _retrying(action, what: str, tries: int = 5):
    delay = 1.0
    for attempt in range(tries):
        try:
            return action()
        except ArtifactStoreError as exc:
            if attempt == tries - 1:
                raise ArtifactStoreError(f"could not {what} from the artifact store: {exc}") from exc
            logger.warning("Cannot %s yet (%s); retrying in %.0f s.", what, exc, delay)
            time.sleep(delay)
            delay *= 2


def fetch_folder(run, key: str) -> Path | None:
    """A folder of ``run`` in the shared store (its final model, a checkpoint), copied once into this
    machine's folder for the run, where a process here loads it. None when the store lacks it."""
    prefix = run_prefix(run)
    if prefix is None or not key.startswith(prefix + "/"):
        return None
    target = scratch_folder(run) / key.removeprefix(prefix + "/")
    if not (target / STORED_MARKER).exists():
        partial = target.with_name(f".{target.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        if not store().get_dir(key, partial):
            return None
        (partial / STORED_MARKER).touch()
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def fetch_trained_model(model_choice: str) -> Path | None:
    """For a run that starts from another run's model (``run:<id>``) or from one of its checkpoints
    (``run:<id>@<step>``, a fork) with a shared store: that run's final model or checkpoint, fetched
    into this machine's folder for it (where ``model_config`` points). None for any other model."""
    match = RUN_MODEL.match((model_choice or "").strip())
    if not shared() or not match:
        return None
    source = Run.objects.filter(pk=int(match.group(1))).first()
    if match.group(2) is not None:
        what = f"run {match.group(1)}'s checkpoint of step {match.group(2)}"
        key = dict(run_checkpoints(source)).get(int(match.group(2))) if source is not None else None
    else:
        what = f"run {match.group(1)}'s final model"
        key = final_model_key(source) if source is not None else None
    if key is None:
        raise ArtifactStoreError(f"{what} is not in the artifact store")
    return _retrying(lambda: fetch_folder(source, key), f"fetch {what}")


def read_json(run, name: str) -> dict:
    """A small JSON file of ``run`` in the store ({} when it is not there or unreadable)."""
    import json

    prefix = run_prefix(run)
    if prefix is None:
        return {}
    try:
        with store().open(f"{prefix}/{name}") as handle:
            value = json.loads(handle.read())
    except (ArtifactStoreError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
