"""What a run page offers to download: its config as YAML, its checkpoints and final model as
.tar.gz archives, and (with a shared artifact store) the files its workers stored (its metrics as
CSV: ``webapp.dashboard.views.metrics_csv``, beside the metric store). Whoever may view the run may download them; files are only ever read from inside the run's own
directory under RUNS_DIR, or from its own prefix in the artifact store (streamed from there, or a
presigned link to the store where it signs them, given after the run's access check)."""

from __future__ import annotations

import io
import json
import queue
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.views.decorators.http import require_GET

from training.platform.artifacts import STORED_MARKER, iter_chunks
from training.config import TrainerConfig
from training.rollouts.models import ADAPTER_CONFIG, adapter_base, is_adapter
from training.utils import checkpoint_step
from webapp.runs import artifacts
from webapp.runs.access import get_run_for_user
from webapp.runs.models import Run
from webapp.runs.trainer_args import shown_spec

def total_steps(run: Run) -> int | None:
    """The run's step budget: its final config's, else its overrides', else the library's default."""
    final = run.final_config or {}
    value = (final.get("trainer") or {}).get("total_training_steps") if isinstance(final, dict) else None
    value = value or (run.config_overrides or {}).get("trainer.total_training_steps")
    if value is None and run.backend and run.backend.processor in ("trl", "verl"):
        value = TrainerConfig().total_training_steps
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def config_yaml(run: Run) -> str:
    """The final config (every key, as the trainer resolved it) once the run has started, else the overrides."""
    if run.final_config:
        body: Any = run.final_config
        head = f"# run {run.pk} ({run}): the final config the trainer resolved\n"
    else:
        body = run.config_overrides or {}
        head = f"# run {run.pk} ({run}): the overrides it was created with (the final config appears once it starts)\n"
    return head + yaml.safe_dump(body, sort_keys=True, default_flow_style=False, allow_unicode=True)


def spec_yaml(run: Run) -> str:
    """The run's spec as its viewers read it (``trainer_args.shown_spec``), empty for a run without one."""
    shown = shown_spec(run.spec)
    return yaml.safe_dump(shown, sort_keys=True, default_flow_style=False, allow_unicode=True) if shown else ""


def archives(run: Run) -> list[dict]:
    """The run's downloadable model directories: each checkpoint, then the final model."""
    if artifacts.shared():
        found = [{"label": f"checkpoint at step {step}", "name": f"checkpoint-{step}", "step": step}
                 for step, _ in artifacts.run_checkpoints(run)]
        if artifacts.final_model_key(run):
            found.append({"label": "final model", "name": "final_model", "step": None})
        return found
    found = [{"label": f"checkpoint at step {step}", "name": f"checkpoint-{step}", "step": step}
             for step, _ in published_checkpoints(run)]
    if _inside_run(run, Path(run.run_path or "") / "final_model"):
        found.append({"label": "final model", "name": "final_model", "step": None})
    return found


def model_folder(run: Run, name: str) -> Path | None:
    """The directory of the run's saved model ``name`` (``final_model`` or ``checkpoint-<step>``, as
    ``archives`` names them), when it lies inside the run's own directory; None otherwise. With a
    shared artifact store: a copy fetched from it into this machine's folder for the run."""
    if artifacts.shared():
        key = _stored_model_key(run, name)
        return artifacts.fetch_folder(run, key) if key else None
    if name == "final_model":
        return _inside_run(run, Path(run.run_path or "") / "final_model")
    if name.startswith("checkpoint-") and name.removeprefix("checkpoint-").isdigit():
        step = int(name.removeprefix("checkpoint-"))
        return next((folder for s, folder in published_checkpoints(run) if s == step), None)
    return None


def published_checkpoints(run: Run) -> list[tuple[int, Path]]:
    """(step, folder) of each checkpoint the run keeps in its own directory, by step: those its
    attempts published into its checkpoint folder (``<run>/checkpoints``, or its
    ``trainer.default_local_dir`` inside the run's directory; rotated ones are gone from there) and
    those recorded as rows (a run's last checkpoint)."""
    found: dict[int, Path] = {}
    final = run.final_config if isinstance(run.final_config, dict) else {}
    configured = (final.get("trainer") or {}).get("default_local_dir") if isinstance(final.get("trainer"), dict) else None
    folder = _inside_run(run, configured or Path(run.run_path or "") / "checkpoints") if run.run_path else None
    if folder is not None:
        for path in folder.iterdir():
            step = checkpoint_step(path.name)
            if step is not None and (inside := _inside_run(run, path)) is not None:
                found[step] = inside
    for checkpoint in run.checkpoints.all():
        if checkpoint.step not in found and (inside := _inside_run(run, checkpoint.path)) is not None:
            found[checkpoint.step] = inside
    return sorted(found.items())


def _run_dir(run: Run) -> Path | None:
    if not run.run_path:
        return None
    root = Path(run.run_path).resolve()
    return root if root.is_relative_to(Path(settings.RUNS_DIR).resolve()) else None


def _inside_run(run: Run, path: str | Path) -> Path | None:
    """``path`` resolved, when it is a directory inside the run's own directory (never elsewhere)."""
    root = _run_dir(run)
    if root is None or not str(path):
        return None
    resolved = Path(path).resolve()
    return resolved if resolved.is_dir() and resolved.is_relative_to(root) and resolved != root else None


@login_required
@require_GET
def config_download(request, pk: int) -> HttpResponse:
    run = get_run_for_user(request.user, pk, "view")
    response = HttpResponse(config_yaml(run), content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-config.yaml"'
    return response


@login_required
@require_GET
def model_archive(request, pk: int, name: str) -> StreamingHttpResponse:
    """``final_model`` or ``checkpoint-<step>`` as a .tar.gz (built in a temporary file, then sent)."""
    return archive_response(get_run_for_user(request.user, pk, "view"), name)


def archive_response(run: Run, name: str) -> StreamingHttpResponse:
    """The run's saved model ``name`` as a .tar.gz download (the caller has checked access)."""
    if artifacts.shared():
        return _stored_archive(run, name)
    folder = model_folder(run, name)
    if folder is None:
        raise Http404("This run has no such model to download.")
    archive = tempfile.TemporaryFile(dir=settings.VAR_DIR)
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        _add_model(tar, run, folder, f"run-{run.pk}-{name}")
    size = archive.tell()
    archive.seek(0)

    async def chunks():  # an async iterator, as for the CSV
        try:
            while chunk := await sync_to_async(archive.read)(1 << 20):
                yield chunk
        finally:
            archive.close()

    response = StreamingHttpResponse(chunks(), content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{name}.tar.gz"'
    response["Content-Length"] = str(size)
    return response


def _add_model(tar: tarfile.TarFile, run: Run, folder: Path, arcname: str) -> None:
    """``folder`` into ``tar`` as ``arcname``. A LoRA adapter whose base model lies in the run's own folder
    (a model built for the run) comes with that base as ``arcname/base_model``, its adapter_config.json
    naming ``arcname/base_model``: loadable from where the archive is unpacked
    (``AutoPeftModelForCausalLM.from_pretrained(arcname)``). A base elsewhere (a hub id, a registered
    model) is named as it was trained, and nothing more is added."""
    base = _inside_run(run, adapter_base(folder)) if is_adapter(folder) else None
    if base is None:
        tar.add(folder, arcname=arcname, filter=_regular_files_only)
        return
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = f"{arcname}/base_model"
    tar.add(folder, arcname=arcname, filter=lambda m: None if m.name == f"{arcname}/{ADAPTER_CONFIG}" else _regular_files_only(m))
    body = json.dumps(config, indent=2).encode()
    info = tarfile.TarInfo(f"{arcname}/{ADAPTER_CONFIG}")
    info.size = len(body)
    tar.addfile(info, io.BytesIO(body))
    tar.add(base, arcname=f"{arcname}/base_model", filter=_regular_files_only)


def _stored_model_key(run: Run, name: str) -> str | None:
    if name == "final_model":
        return artifacts.final_model_key(run)
    if name.startswith("checkpoint-") and name.removeprefix("checkpoint-").isdigit():
        step = int(name.removeprefix("checkpoint-"))
        return next((key for s, key in artifacts.run_checkpoints(run) if s == step), None)
    return None


def _stored_archive(run: Run, name: str) -> StreamingHttpResponse:
    """A model folder of the run in the artifact store as a .tar.gz, built while it streams (no copy
    on this server's disk)."""
    key = _stored_model_key(run, name)
    if key is None:
        raise Http404("This run has no such model to download.")
    store = artifacts.store()
    members = [(k, store.size(f"{key}/{k}")) for k in store.list(key) if k != STORED_MARKER]

    def write_archive(out: io.RawIOBase) -> None:
        with tarfile.open(fileobj=out, mode="w|gz", bufsize=1 << 20) as tar:
            for member, size in members:
                info = tarfile.TarInfo(f"run-{run.pk}-{name}/{member}")
                info.size = size
                with store.open(f"{key}/{member}") as handle:
                    tar.addfile(info, handle)

    response = StreamingHttpResponse(_async(_piped(write_archive)), content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{name}.tar.gz"'
    return response


def _piped(write: Callable[[io.RawIOBase], None], depth: int = 8) -> Iterator[bytes]:
    """The bytes ``write(file)`` writes, as they are written: a thread writes, at most ``depth``
    chunks wait, so a model of any size streams in bounded memory. A download abandoned midway
    stops the writer at its next write."""
    chunks: queue.Queue = queue.Queue(maxsize=depth)
    abandoned = threading.Event()
    finished = object()

    def put(item) -> None:
        while not abandoned.is_set():
            try:
                chunks.put(item, timeout=1)
                return
            except queue.Full:
                continue
        raise OSError("the download was abandoned")

    class Pipe(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            put(bytes(data))
            return len(data)

    def produce() -> None:
        try:
            write(Pipe())
            put(finished)
        except BaseException as exc:  # handed to the reader, which raises it
            if not abandoned.is_set():
                put(exc)

    threading.Thread(target=produce, name="download-archive", daemon=True).start()
    try:
        while (item := chunks.get()) is not finished:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        abandoned.set()


async def _async(chunks: Iterator[bytes]):
    """A blocking iterator served as an async one: the ASGI server streams it, a thread reads each chunk."""
    done = object()
    try:
        while (chunk := await sync_to_async(next)(chunks, done)) is not done:
            yield chunk
    finally:  # a client gone midway: the blocking iterator's own clean-up runs now
        close = getattr(chunks, "close", None)
        if close is not None:
            await sync_to_async(close)()


# The run files a worker stores beside its checkpoints, downloadable from the run page.
STORED_FILES = ("metrics.jsonl", "episodes.jsonl")


def stored_files(run: Run) -> list[str]:
    """The run's files in a shared artifact store: metrics and episodes as the library wrote them,
    and each attempt's process log (``logs/attempt-N.log``)."""
    prefix = artifacts.run_prefix(run) if artifacts.shared() else None
    if prefix is None:
        return []
    keys = artifacts.store().list(prefix)
    return [k for k in keys if k in STORED_FILES or (k.startswith("logs/") and k.count("/") == 1)]


@login_required
@require_GET
def stored_file(request, pk: int, name: str) -> HttpResponse:
    """One of ``stored_files(run)``: a redirect to a short-lived presigned link where the store signs
    them (the bytes never pass through this server), else streamed from the store."""
    run = get_run_for_user(request.user, pk, "view")
    if name not in stored_files(run):
        raise Http404("This run has no such file.")
    key = f"{artifacts.run_prefix(run)}/{name}"
    url = artifacts.store().presign(key, settings.ARTIFACTS_PRESIGN_SECONDS) if settings.ARTIFACTS_PRESIGN else None
    if url:
        return HttpResponseRedirect(url)
    response = StreamingHttpResponse(_async(iter_chunks(artifacts.store().open(key))), content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{name.replace("/", "-")}"'
    return response


def _regular_files_only(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """No symlinks or devices: a link inside a run folder must not carry a file from elsewhere into the archive."""
    return member if member.isfile() or member.isdir() else None
