"""The checkpoint pages: a project's evaluation table (sortable; its address, sort included, is
what a team shares), and a project's aliases used: download the checkpoint an alias names, or chat
with it in the run's playground. Access as in the API (``webapp.checkpoints.logic``)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from webapp.checkpoints import logic
from webapp.runs.downloads import archive_response


@login_required
@require_GET
def evaluation_table(request, pk: int):
    project = logic.project_for_user(request.user, pk)
    sort = request.GET.get("sort", "run")
    sort = sort if sort in logic.SORTS else "run"
    descending = request.GET.get("descending") == "true"
    return render(request, "checkpoints/evaluations.html", {
        "project": project, "rows": logic.evaluation_table(request.user, project, sort, descending),
        "evaluations": logic.visible_evaluations(request.user, project), "aliases": logic.aliases_of(request.user, project),
        "sort": sort, "descending": descending,
        "columns": [("run", "Run"), ("step", "Checkpoint"), ("dataset", "Dataset"), ("source", "Data source"),
                    ("reward", "Reward"), ("pass1", "pass@1"), ("passk", "pass@k")],
    })


@login_required
@require_GET
def alias_download(request, pk: int, name: str):
    """The checkpoint the alias names, as the run page's download of it (a .tar.gz)."""
    project = logic.project_for_user(request.user, pk)
    alias = logic.resolve_alias(request.user, project, name)
    return archive_response(alias.run, f"checkpoint-{alias.step}")


@login_required
@require_GET
def alias_playground(request, pk: int, name: str):
    """The run's playground with the checkpoint the alias names chosen."""
    project = logic.project_for_user(request.user, pk)
    alias = logic.resolve_alias(request.user, project, name)
    return HttpResponseRedirect(f"{reverse('playground:page', args=[alias.run_id])}?model=checkpoint-{alias.step}")


