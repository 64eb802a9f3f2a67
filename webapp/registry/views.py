"""A project's own registry entries: its datasets (uploaded from the browser) and chat agents.

Members who may start runs in a project (owners, admins, members) add entries to it; everyone in
the team sees them; nobody else learns they exist (404). Uploaded files are read only here and by
the workers, never served as they are.
"""

from __future__ import annotations

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
from webapp.registry.models import Agent, Dataset, PendingUpload
from webapp.teams.access import can_in_project
from webapp.teams.models import Project


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
    """Step 1: the file, read whole (by the child reader) and kept aside, rows and all, until step 2 maps its columns."""
    handler = uploads.LimitedUploadHandler(request)
    request.upload_handlers.insert(0, handler)
    return _dataset_upload(request, pk, handler)


@csrf_protect
def _dataset_upload(request, pk: int, handler: uploads.LimitedUploadHandler):
    project = _project(request.user, pk, "run")
    form = DatasetUploadForm(request.POST or None, request.FILES or None, project=project, owner=request.user,
                             too_large=handler.too_large)
    if request.method == "POST" and form.is_valid():
        pending = form.receive()
        if pending is not None:
            return redirect("registry:dataset_map", pk=project.pk, token=pending.token)
    return render(request, "registry/dataset_upload.html", {
        "project": project, "form": form, "pending_limit": uploads.PENDING_PER_PERSON,
        "waiting": PendingUpload.objects.filter(owner=request.user).select_related("project__team"),
    })


def _pending(request, pk: int, token: str) -> PendingUpload:
    """The upload of ``token``, for the person who made it (404 for everyone else)."""
    pending = PendingUpload.objects.filter(token=token, owner=request.user, project_id=pk).select_related("project").first()
    if pending is None:
        raise Http404("This upload is not waiting for its columns (it was finished, discarded, deleted after a day, "
                      "or is someone else's).")
    return pending


@login_required
def dataset_map(request, pk: int, token: str):
    """Step 2: the first rows (kept from step 1: nothing is read again), the column mapping and the test share; then the dataset."""
    _project(request.user, pk, "run")
    pending = _pending(request, pk, token)
    form = ColumnMappingForm(request.POST or None, pending=pending)
    if request.method == "POST" and form.is_valid():
        dataset = uploads.create_dataset(pending, form.mapping(), form.test)
        test_count = len(form.test)
        messages.success(request, f"Dataset {dataset.name}: {pending.row_count - test_count} training rows"
                                  f"{f', {test_count} test rows' if test_count else ''}. Start a run with it below.")
        return redirect(reverse("runs:create") + "?" + urlencode({"dataset": dataset.pk, "project": pending.project_id}))
    return render(request, "registry/dataset_map.html", {"project": pending.project, "form": form, "pending": pending})


@login_required
@require_POST
def dataset_discard(request, pk: int, token: str):
    """An upload waiting for its columns, deleted with its rows by the person who made it (even
    one whose project they may no longer add to: it counts against their limit until then)."""
    pending = _pending(request, pk, token)
    pending.delete()
    messages.info(request, f"Upload {pending.name} ({pending.filename}) discarded.")
    return redirect("registry:dataset_upload", pk=pk)


@login_required
def dataset_detail(request, pk: int):
    """An uploaded dataset's first rows, for the members of its project (404 for everyone else)."""
    dataset = get_object_or_404(Dataset.objects.visible_to(request.user), pk=pk)
    preview, columns = [], []
    if dataset.source == Dataset.Source.UPLOAD and dataset.file:
        with dataset.file.open("rb") as handle:
            columns, preview = uploads.preview(handle)
    return render(request, "registry/dataset_detail.html", {"dataset": dataset, "preview": preview, "columns": columns})


@login_required
def agent_create(request, pk: int):
    """A chat agent written without code, in the project."""
    project = _project(request.user, pk, "run")
    form = ChatAgentForm(request.POST or None, user=request.user, project=project)
    if request.method == "POST" and form.is_valid():
        agent = form.save_for_project()
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
