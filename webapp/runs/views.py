"""Views check access, validate a form, save; the run's behaviour lives on the model."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.fleet.queues import QueueBoard
from webapp.runs import downloads
from webapp.runs.access import can, get_run_for_user
from webapp.runs.config_fields import config_fields
from webapp.runs.forms import RunEditForm, RunForm
from webapp.runs.models import Run
from webapp.runs.submission import QuotaExceeded


@login_required
def run_list(request):
    """``?q=`` searches name, agent, dataset, backend and model; ``?status=``, ``?tag=`` and ``?project=`` filter."""
    runs = Run.objects.visible_to(request.user).select_related("agent", "dataset", "backend", "owner", "project__team")
    query, status = request.GET.get("q", "").strip(), request.GET.get("status", "")
    tag, project = request.GET.get("tag", "").strip(), request.GET.get("project", "")
    if tag:
        runs = runs.with_tag(tag)
    if project.isdigit():
        runs = runs.filter(project_id=int(project))
    if query:
        match = Q(name__icontains=query) | Q(agent__name__icontains=query) | Q(dataset__name__icontains=query) \
            | Q(backend__name__icontains=query) | Q(model__icontains=query)
        if query.lstrip("#").isdigit():
            match |= Q(pk=int(query.lstrip("#")))
        runs = runs.filter(match)
    if status in Run.Status.values:
        runs = runs.filter(status=status)
    runs = list(runs[:500])
    if any(run.status == Run.Status.QUEUED for run in runs):  # each says what it waits for
        board = QueueBoard.load()
        for run in runs:
            run.waiting = board.run_waiting(run, request.user)
    return render(request, "runs/run_list.html", {
        "runs": runs, "q": query, "status": status, "statuses": Run.Status.values, "tag": tag,
    })


@login_required
def run_create(request):
    """``?clone=<id>`` starts from a copy of that run's choices and config."""
    if request.method == "POST":
        form = RunForm(request.POST, user=request.user)
        if form.is_valid():
            try:
                run = form.save(owner=request.user)
            except QuotaExceeded as exc:  # another submission took the last place since the form's check
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Run {run.pk} is queued on the '{run.backend.queue}' queue.")
                return redirect(run)
    else:
        clone = _int(request.GET.get("clone"))
        initial = RunForm.initial_from(get_run_for_user(request.user, clone, "run")) if clone else _chosen(request.GET)
        form = RunForm(initial=initial, user=request.user)
    return render(request, "runs/run_form.html", {
        "form": form, "config_fields": config_fields(), "agent_needs": _agent_needs(form),
        "common_defaults": form.common_defaults(), "problem_count": sum(len(errors) for errors in form.errors.values()),
    })


def _chosen(query) -> dict:
    """``?agent=&dataset=&project=&model=``: choices to start with (links from a project's data and agents);
    the form's querysets still decide what this user may pick."""
    initial = {name: int(query[name]) for name in ("agent", "dataset", "project") if query.get(name, "").isdigit()}
    if query.get("model"):
        initial["model"] = query["model"][:100]
    if initial.get("project"):
        initial["visibility"] = Run.Visibility.TEAM
    return initial


# What each kind of agent needs from the rest of the form.
NEEDS = {
    "agent+env": "Multi-turn: its environment scores each episode, so no reward function is needed. "
                 "The dataset's rows are the environment's tasks.",
    "workflow": "A workflow: it runs and scores its own episodes; no reward function is needed.",
    "chat": "A chat agent with tools: needs a reward function and a dataset with a prompt column "
            "(and the column the reward compares against, ground_truth by default).",
    "single-turn": "Single-turn: needs a reward function and a dataset with a prompt column "
                   "(and the column the reward compares against, ground_truth by default).",
}


def _agent_needs(form: RunForm) -> dict[str, dict]:
    """Per agent: what it needs and the datasets that go with it (of the same name), for the form's hints."""
    datasets = {d.name: d.pk for d in form.fields["dataset"].queryset}
    return {
        str(agent.pk): {"needs": NEEDS[agent.kind], "description": agent.description,
                        "reward": agent.kind in ("chat", "single-turn"), "dataset": datasets.get(agent.name)}
        for agent in form.fields["agent"].queryset
    }


@login_required
def run_list_live(request):
    """The run list's poll: status, steps and warnings of the rows it shows (``?ids=``), and the newest run id it may see."""
    ids = [int(i) for i in request.GET.get("ids", "").split(",") if i.isdigit()][:500]
    visible = Run.objects.visible_to(request.user)
    newest = visible.order_by("-pk").values_list("pk", flat=True).first()
    rows = list(visible.filter(pk__in=ids).select_related("backend"))
    board = QueueBoard.load() if any(r.status == Run.Status.QUEUED for r in rows) else None
    return JsonResponse({"newest": newest, "runs": {str(r.pk): {
        "status": r.status, "steps": r.steps, "warnings": r.warnings,
        "waiting": board.run_waiting(r, request.user) if board else "",
    } for r in rows}})


@login_required
def run_detail(request, pk: int):
    run = get_run_for_user(request.user, pk, "view")
    logs = run.log_tail(200)
    return render(request, "runs/run_detail.html", {
        "run": run,
        "logs": logs,
        "last_log_id": logs[-1].id if logs else 0,
        "metrics": sorted(run.latest_metrics().items()),
        "total_steps": downloads.total_steps(run),
        "waiting": QueueBoard.load().run_waiting(run, request.user) if run.status == Run.Status.QUEUED else "",
        "config_yaml": downloads.config_yaml(run),
        "archives": downloads.archives(run),
        "stored_files": downloads.stored_files(run),
        "may": {action: can(request.user, run, action) for action in ("edit", "run", "cancel", "delete")},
        "edit_form": RunEditForm(instance=run),
        "share_links": run.share_links.active(),
    })


@login_required
@require_POST
def run_edit(request, pk: int):
    """Tags, notes and visibility."""
    run = get_run_for_user(request.user, pk, "edit")
    form = RunEditForm(request.POST, instance=run)
    if form.is_valid():
        form.save()
        messages.success(request, "Saved.")
    else:
        messages.error(request, " ".join(e for errors in form.errors.values() for e in errors))
    return redirect(run)


@login_required
@require_POST
def run_delete(request, pk: int):
    run = get_run_for_user(request.user, pk, "delete")
    if not run.is_final:
        messages.error(request, "Cancel the run first; only ended runs can be deleted.")
        return redirect(run)
    run.delete()
    messages.success(request, f"Run {pk} deleted.")
    return redirect("runs:list")


@login_required
@require_POST
def run_cancel(request, pk: int):
    run = get_run_for_user(request.user, pk, "cancel")
    if run.request_cancel():
        messages.info(request, "Cancelled." if run.status == Run.Status.CANCELLED else "Stopping the run at its next step.")
    else:
        messages.warning(request, f"The run has already ended ({run.status}).")
    return redirect(run)


@login_required
def run_updates(request, pk: int):
    """What changed since the client's last poll: status, log lines after ``after_log`` (an id) and
    metric points after step ``after_step`` (``{key: [[step, value], ...]}``, up to 5,000 points).

    The live dashboard pushes the same over a websocket when a channel layer is shared; this
    endpoint keeps pages live in every mode (embedded mode has no shared channel layer).
    """
    from webapp.dashboard import series

    run = get_run_for_user(request.user, pk, "view")
    after_log = _int(request.GET.get("after_log"))
    after_step = max(-1, min(_int(request.GET.get("after_step"), default=-1), 2**62))
    logs = list(run.logs.filter(id__gt=after_log).order_by("id").values("id", "time", "level", "message")[:500])
    through = after_step + max(1, 5000 // max(1, len(run.latest_values or {})))
    points = series.points_after(run.pk, after_step, through=through)
    return JsonResponse({
        "status": run.status, "is_final": run.is_final, "steps": run.steps, "error": run.error,
        "logs": logs, "metrics": points, "through": min(through, max(after_step, run.steps)),
    })


@login_required
def run_waiting(request, pk: int):
    """What a queued run waits for (the run page asks every few seconds while it is queued)."""
    run = get_run_for_user(request.user, pk, "view")
    waiting = QueueBoard.load().run_waiting(run, request.user) if run.status == Run.Status.QUEUED else ""
    return JsonResponse({"status": run.status, "waiting": waiting})


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default
