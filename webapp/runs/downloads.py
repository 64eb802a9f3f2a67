"""What a run page offers to download: its config as YAML, its metrics as CSV, its checkpoints and
final model as .tar.gz archives. Whoever may view the run may download them; files are only ever
read from inside the run's own directory under RUNS_DIR."""

from __future__ import annotations

import csv
import io
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET

from webapp.runs.access import get_run_for_user
from webapp.runs.models import Run

# Rows of the metrics CSV fetched from the database at a time.
CSV_BATCH = 5000


def total_steps(run: Run) -> int | None:
    """The run's step budget: its final config's, else its overrides', else the library's default."""
    final = run.final_config or {}
    value = (final.get("trainer") or {}).get("total_training_steps") if isinstance(final, dict) else None
    value = value or (run.config_overrides or {}).get("trainer.total_training_steps")
    if value is None and run.backend and run.backend.processor in ("trl", "verl"):
        from training.config import TrainerConfig

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


def archives(run: Run) -> list[dict]:
    """The run's downloadable model directories: each checkpoint, then the final model."""
    found = [{"label": f"checkpoint at step {c.step}", "name": f"checkpoint-{c.step}", "step": c.step}
             for c in run.checkpoints.all() if _inside_run(run, c.path)]
    if _inside_run(run, Path(run.run_path or "") / "final_model"):
        found.append({"label": "final model", "name": "final_model", "step": None})
    return found


def model_folder(run: Run, name: str) -> Path | None:
    """The directory of the run's saved model ``name`` (``final_model`` or ``checkpoint-<step>``, as
    ``archives`` names them), when it lies inside the run's own directory; None otherwise."""
    if name == "final_model":
        return _inside_run(run, Path(run.run_path or "") / "final_model")
    if name.startswith("checkpoint-") and name.removeprefix("checkpoint-").isdigit():
        checkpoint = run.checkpoints.filter(step=int(name.removeprefix("checkpoint-"))).first()
        return _inside_run(run, checkpoint.path) if checkpoint else None
    return None


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
def metrics_csv(request, pk: int) -> StreamingHttpResponse:
    """One row per step, one column per metric key (empty where a step did not log that key)."""
    run = get_run_for_user(request.user, pk, "view")
    keys = list(run.metrics.order_by("key").values_list("key", flat=True).distinct())
    points = run.metrics.order_by("step", "key").values_list("step", "key", "value")

    def page(after: int) -> list[tuple]:
        """The points of the next steps after ``after`` (about CSV_BATCH points, whole steps only)."""
        rows = list(points.filter(step__gt=after)[:CSV_BATCH])
        if len(rows) == CSV_BATCH:  # the last step may be cut: take it whole
            last = rows[-1][0]
            rows = [r for r in rows if r[0] != last] + list(points.filter(step=last))
        return rows

    async def lines():  # an async iterator: the ASGI server streams it without a thread per response
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["step", *keys])
        after = -1
        while rows := await sync_to_async(page)(after):
            by_step: dict[int, dict[str, Any]] = {}
            for step, key, value in rows:
                by_step.setdefault(step, {})[key] = "" if value is None else repr(value)
            for step, row in by_step.items():
                writer.writerow([step, *(row.get(k, "") for k in keys)])
            after = rows[-1][0]
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
    return response


@login_required
@require_GET
def model_archive(request, pk: int, name: str) -> StreamingHttpResponse:
    """``final_model`` or ``checkpoint-<step>`` as a .tar.gz (built in a temporary file, then sent)."""
    run = get_run_for_user(request.user, pk, "view")
    folder = model_folder(run, name)
    if folder is None:
        raise Http404("This run has no such model to download.")
    archive = tempfile.TemporaryFile(dir=settings.VAR_DIR)
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(folder, arcname=f"run-{run.pk}-{name}", filter=_regular_files_only)
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


def _regular_files_only(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """No symlinks or devices: a link inside a run folder must not carry a file from elsewhere into the archive."""
    return member if member.isfile() or member.isdir() else None
