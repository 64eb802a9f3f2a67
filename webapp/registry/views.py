"""A project's own registry entries: its datasets (uploaded from the browser) and chat agents.

Members who may start runs in a project (owners, admins, members) add entries to it; everyone in
the team sees them; nobody else learns they exist (404). Uploaded files are read only here and by
the workers, never served as they are.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import ProtectedError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_POST

from webapp.registry import uploads
from webapp.registry.forms import ChatAgentForm, ColumnMappingForm, DatasetUploadForm
from webapp.registry.models import Agent, Dataset
from webapp.runs.access import can_in_project
from webapp.teams.models import Project

PENDING = "pending_uploads"


def _project(user, pk: int, action: str = "view") -> Project:
    project = get_object_or_404(Project.objects.select_related("team"), pk=pk)
    if not can_in_project(user, project, "view"):
        raise Http404("No such project.")
    if not can_in_project(user, project, action):
        raise Http404("Viewers cannot add to a project's registry.")
    return project


@login_required
def project_registry(request, pk: int):
    project = _project(request.user, pk)
    return render(request, "registry/project_registry.html", {
        "project": project, "may_add": can_in_project(request.user, project, "run"),
        "datasets": Dataset.objects.filter(project=project), "agents": Agent.objects.filter(project=project),
    })


@csrf_exempt  # the upload handler must be in place before the body is read; CSRF is checked below
@login_required
def dataset_upload(request, pk: int):
    """Step 1: the file, checked whole; kept aside (under a name made up here) until step 2 maps its columns."""
    handler = uploads.LimitedUploadHandler(request)
    request.upload_handlers.insert(0, handler)
    return _dataset_upload(request, pk, handler)


@csrf_protect
def _dataset_upload(request, pk: int, handler: uploads.LimitedUploadHandler):
    project = _project(request.user, pk, "run")
    if request.method == "POST":
        form = DatasetUploadForm(request.POST, request.FILES, too_large=handler.too_large)
        if form.is_valid():
            token = secrets.token_urlsafe(12)
            upload = form.cleaned_data["file"]
            upload.seek(0)
            stored = uploads.save_pending(upload, form.kind)
            pending = request.session.get(PENDING, {})
            pending[token] = {
                "stored": stored, "kind": form.kind, "filename": upload.name[:200], "project": project.pk,
                "name": form.cleaned_data["name"], "description": form.cleaned_data["description"],
            }
            request.session[PENDING] = pending
            return redirect("registry:dataset_map", pk=project.pk, token=token)
    else:
        form = DatasetUploadForm()
    return render(request, "registry/dataset_upload.html", {"project": project, "form": form})


@login_required
def dataset_map(request, pk: int, token: str):
    """Step 2: a preview of the first rows, the column mapping and the test share; then the dataset."""
    project = _project(request.user, pk, "run")
    pending = request.session.get(PENDING, {}).get(token)
    if pending is None or pending["project"] != project.pk:
        raise Http404("This upload is not waiting for its columns (it was finished, or belongs to another session).")
    if not uploads.default_storage.exists(pending["stored"]):  # left for more than a day, and pruned
        _forget(request, token)
        messages.error(request, "That upload waited too long for its columns and was deleted; upload the file again.")
        return redirect("registry:dataset_upload", pk=project.pk)
    with uploads.open_stored(pending["stored"]) as handle:
        table = uploads.parse(handle, pending["kind"], uploads.Limits.from_settings())
    form = ColumnMappingForm(request.POST or None, table=table)
    if request.method == "POST" and form.is_valid():
        if Dataset.objects.filter(name=pending["name"]).exists():
            form.add_error(None, f"The name {pending['name']!r} was taken meanwhile; upload again with another name.")
        else:
            dataset = Dataset(
                name=pending["name"], description=pending["description"] or f"Uploaded from {pending['filename']}.",
                project=project, source=Dataset.Source.UPLOAD, train_split="train",
                val_split="test" if form.test else "", column_mapping=form.mapping(),
            )
            uploads.save_split(dataset, form.train, form.test)
            dataset.full_clean()
            dataset.save()
            _forget(request, token)
            messages.success(request, f"Dataset {dataset.name}: {len(form.train)} training rows"
                                      f"{f', {len(form.test)} test rows' if form.test else ''}. Start a run with it below.")
            return redirect(reverse("runs:create") + "?" + urlencode({"dataset": dataset.pk, "project": project.pk}))
    return render(request, "registry/dataset_map.html", {
        "project": project, "form": form, "pending": pending, "columns": table.columns,
        "preview": table.preview(), "rows": len(table.rows),
    })


def _forget(request, token: str) -> None:
    pending = request.session.get(PENDING, {})
    entry = pending.pop(token, None)
    request.session[PENDING] = pending
    if entry:
        uploads.delete_stored(entry["stored"])


@login_required
def dataset_detail(request, pk: int):
    """An uploaded dataset's first rows, for the members of its project (404 for everyone else)."""
    dataset = get_object_or_404(Dataset.objects.visible_to(request.user), pk=pk)
    preview, columns = [], []
    if dataset.source == Dataset.Source.UPLOAD and dataset.file:
        with dataset.file.open("rb") as handle:
            table = uploads.parse(handle, "jsonl", uploads.Limits.from_settings())
        preview, columns = table.preview(), table.columns
    return render(request, "registry/dataset_detail.html", {"dataset": dataset, "preview": preview, "columns": columns})


@login_required
def agent_create(request, pk: int):
    """A chat agent written without code, in the project."""
    project = _project(request.user, pk, "run")
    form = ChatAgentForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        agent = form.save_for(project)
        messages.success(request, f"Chat agent {agent.name} saved. Start a run with it below.")
        query = urlencode({"agent": agent.pk, "project": project.pk, "model": agent.llm_config["llm_model_name"]})
        return redirect(reverse("runs:create") + "?" + query)
    return render(request, "registry/agent_form.html", {"project": project, "form": form})


ENTRY_KINDS = {"datasets": Dataset, "agents": Agent}


@login_required
@require_POST
def entry_delete(request, kind: str, pk: int):
    """A project's dataset or agent, deleted by someone who may add to the project; kept while runs use it."""
    model = ENTRY_KINDS.get(kind)
    if model is None:
        raise Http404("No such entry.")
    entry = get_object_or_404(model.objects.filter(project__isnull=False).select_related("project"), pk=pk)
    project = _project(request.user, entry.project_id, "run")
    try:
        entry.delete()
    except ProtectedError:
        count = entry.runs.count()
        messages.error(request, f"{entry.name} stays: {count} run{'s' if count != 1 else ''} used it (delete those runs first).")
    else:
        messages.info(request, f"{entry.name} deleted.")
    return redirect("registry:project", pk=project.pk)
