"""The run pages: the list of runs, a run's page (with what it waits for in the queue, its live charts
and log), starting, editing, cancelling, deleting and sharing a run. Views check access, validate a
form, save; the run's behaviour lives on the model. They stand above the metric store and the queue
board (``webapp.fleet.queues``) that they show."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import Http404, JsonResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.dashboard import ledger, series
from webapp.dashboard.models import StoredEpisode
from webapp.dashboard.views import login_or_share_link_required
from webapp.fleet.queues import QueueBoard
from webapp.runs import downloads, forks, table
from webapp.runs.access import can, get_run_for_user
from webapp.runs.config_fields import config_fields
from webapp.runs.forms import RunEditForm, RunForm
from webapp.runs.models import MAX_STEP, Run, RunTableView
from webapp.runs.submission import QuotaExceeded
from webapp.teams.models import ShareLink


# Rows of the runs table a page shows (a run grouped under two tags is two rows).
PAGE_SIZE = 100
# Steps of the ledger the run page shows (the newest first); the API gives a window of up to 500.
LEDGER_PAGE_STEPS = 20
# The forks of a run its page lists (newest steps last); the API lists them all.
MAX_FORKS_LISTED = 50


@login_required
def run_list(request):
    """``?q=`` searches name, agent, dataset, backend and model; ``?status=``, ``?tag=`` and ``?project=``
    filter; ``?sort=`` and ``?group=`` (``webapp.runs.table``) sort and group, and are remembered, with
    the columns the person added (``run_table_columns``), on their ``RunTableView``."""
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
    view = _table_view(request)
    columns = table.parse_columns(view.columns)
    sort, group = table.parse_sort(view.sort or table.DEFAULT_SORT), view.group
    runs = runs.order_by(*sort.order_by())
    rows, page = _grouped_rows(request, runs, group, columns) if group else _rows(request, runs, columns)
    listed = [row["run"] for row in rows if "run" in row]
    if any(run.status == Run.Status.QUEUED for run in listed):  # each says what it waits for
        board = QueueBoard.load()
        for run in listed:
            run.waiting = board.run_waiting(run, request.user)
    metric_keys, config_keys = table.available_keys(runs, listed)
    kept = request.GET.copy()  # what a heading's or a page's link keeps of the query
    for name in ("page", "sort"):
        kept.pop(name, None)
    return render(request, "runs/run_list.html", {
        "runs": page, "rows": rows, "page": page, "q": query, "status": status, "statuses": Run.Status.values, "tag": tag,
        "columns": columns, "headings": _headings(request.user, sort, columns, kept.urlencode()), "sort": sort, "group": group, "groups": table.BUILTIN_GROUPS, "metric_keys": metric_keys, "config_keys": config_keys,
        "aggregates": table.AGGREGATES, "kept_query": kept.urlencode(), "list_query": request.GET.urlencode(),
    })


# The table's own columns: heading, and the column id a click on it sorts by (None: not sortable).
BUILTIN_HEADINGS = (("Run", "name"), ("Status", "status"), ("Agent", "agent"), ("Dataset", "dataset"),
                    ("Backend", "backend"), ("Owner", None), ("Created", "created"), ("Steps", "steps"))


def _headings(user, sort: table.Sort, columns: list[table.Column], kept_query: str) -> list[dict]:
    """Each heading's text, the link that sorts by it and how the table is sorted by it now."""
    prefix = f"?{kept_query}&sort=" if kept_query else "?sort="
    headings = []
    for text, name in BUILTIN_HEADINGS:
        if name is None and not user.is_superuser:
            continue
        first = table.BUILTIN_SORTS[name][1] if name else ""
        headings.append({"text": text, "id": name, "first": first})
    headings += [{"text": c.label, "id": c.id, "first": c.first_direction, "added": True} for c in columns]
    for heading in headings:
        if heading["id"]:
            heading["href"] = prefix + quote(table.header_sort(sort, heading["id"], heading["first"]))
            if sort.column_id == heading["id"]:
                heading["aria_sort"] = "descending" if sort.descending else "ascending"
    return headings


def _table_view(request) -> RunTableView:
    """The person's saved table, with ``?sort=`` and ``?group=`` taken in (and saved) when given and
    valid; an invalid one is named in an error and the saved one kept."""
    view = RunTableView.objects.filter(user=request.user).first() or RunTableView(user=request.user)
    changed = False
    for name, parse in (("sort", table.parse_sort), ("group", table.parse_group)):
        if name in request.GET and request.GET[name] != getattr(view, name):
            try:
                parse(request.GET[name])
            except table.BadColumn as exc:
                messages.error(request, str(exc))
            else:
                setattr(view, name, request.GET[name])
                changed = True
    if changed:
        view.save()
    return view


def _rows(request, runs, columns: list[table.Column]) -> tuple[list[dict], object]:
    page = Paginator(runs, PAGE_SIZE).get_page(request.GET.get("page"))
    return [_row(run, columns) for run in page], page


def _row(run: Run, columns: list[table.Column]) -> dict:
    config = table.run_config(run) if any(c.kind == "config" for c in columns) else {}
    return {"run": run, "cells": [table.shown(c.value_of(run, config)) for c in columns]}


def _grouped_rows(request, runs, group: str, columns: list[table.Column]) -> tuple[list[dict], object]:
    """The page's rows under a header per group (its label, how many runs it holds in all, and the
    mean of each metric column over them); a group that goes on from the last page says so."""
    metrics = {f"column_{i}": c.expression() for i, c in enumerate(columns) if c.kind == "metric"}
    values = {pk: rest for pk, *rest in runs.annotate(**metrics).values_list("pk", *metrics)}
    groups = table.grouped(table.group_values(runs, group), group)
    entries = [(label, pk) for label, pks in groups for pk in pks]
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    by_pk = runs.in_bulk([pk for _, pk in page])
    members = dict(groups)
    # The group the previous page ended in, which this page's first rows may go on with.
    previous = entries[page.start_index() - 2][0] if page.number > 1 else None
    rows = []
    for index, (label, pk) in enumerate(page):
        if index == 0 or label != page[index - 1][0]:
            pks = members[label]
            means = iter([table.mean([values[member][i] for member in pks]) for i in range(len(metrics))])
            rows.append({"header": label, "count": len(pks), "continued": index == 0 and label == previous,
                         "means": [_shown_mean(next(means)) if c.kind == "metric" else "" for c in columns]})
        rows.append(_row(by_pk[pk], columns))
    return rows, page


def _shown_mean(value: float | None) -> str:
    return "" if value is None else f"mean {table.shown(value)}"


@login_required
@require_POST
def run_table_columns(request):
    """Add a column to the person's runs table (``add``: ``metric`` with ``metric`` and ``aggregate``,
    or ``config`` with ``config``) or take one away (``remove``: its id). Only keys of runs the
    person may see are taken. Back to the list as it was (``query``)."""
    view = RunTableView.objects.filter(user=request.user).first() or RunTableView(user=request.user)
    back = reverse("runs:list") + "?" + QueryDict(request.POST.get("query", "")).urlencode()
    if request.POST.get("remove"):
        view.columns = [c for c in view.columns if c != request.POST["remove"]]
        view.save()
        return redirect(back)
    kind = request.POST.get("add", "")
    key = request.POST.get(kind, "").strip() if kind in ("metric", "config") else ""
    try:
        column = table.parse_column(f"metric:{key}:{request.POST.get('aggregate', 'latest')}" if kind == "metric" else f"config:{key}")
    except table.BadColumn as exc:
        messages.error(request, str(exc) if key else "Choose a metric or a config key to add as a column.")
        return redirect(back)
    if not table.has_key(Run.objects.visible_to(request.user), column):
        messages.error(request, f"No run you can see has the {kind} key {key!r}.")
    elif column.id in view.columns:
        messages.info(request, f"The column {column.label} is shown already.")
    elif len(view.columns) >= table.MAX_COLUMNS:
        messages.error(request, f"The table shows at most {table.MAX_COLUMNS} added columns: remove one first.")
    else:
        view.columns = [*view.columns, column.id]
        view.save()
    return redirect(back)


@login_required
def run_create(request):
    """``?clone=<id>`` starts from a copy of that run's choices and config; ``?fork=<id>&step=<n>``
    from that too, its model the weights of the run's checkpoint of step n (``webapp.runs.forks``)."""
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
        clone, fork, step = (_bounded(request.GET.get(name)) for name in ("clone", "fork", "step"))
        if fork is not None:  # whoever may see a run may fork it, into a project where they may start runs
            parent = get_run_for_user(request.user, fork, "view")
            problem = forks.step_problem(parent, step) if step is not None else "Choose the checkpoint's step to fork from."
            if problem:
                messages.error(request, problem)
                return redirect(parent)
            initial = RunForm.initial_for_fork(parent, step)
        elif clone:
            initial = RunForm.initial_from(get_run_for_user(request.user, clone, "run"))
        else:
            initial = _chosen(request.GET)
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
    run_ledger = ledger.ledger(run)
    return render(request, "runs/run_detail.html", {
        "ledger": run_ledger,
        "ledger_steps": run_ledger["steps"][-LEDGER_PAGE_STEPS:][::-1],
        "run": run,
        "logs": logs,
        "last_log_id": logs[-1].id if logs else 0,
        "metrics": sorted(run.latest_metrics().items()),
        "total_steps": downloads.total_steps(run),
        "waiting": QueueBoard.load().run_waiting(run, request.user) if run.status == Run.Status.QUEUED else "",
        "config_yaml": downloads.config_yaml(run),
        "spec_yaml": downloads.spec_yaml(run),
        "archives": downloads.archives(run),
        "stored_files": downloads.stored_files(run),
        "may": {action: can(request.user, run, action) for action in ("edit", "run", "cancel", "delete")},
        "checkpoint_steps": forks.checkpoint_steps(run) if run.kind == Run.Kind.PLATFORM else [],
        "fork_note": forks.optimizer_note(run),
        "parent_visible": run.parent_id is not None and Run.objects.visible_to(request.user).filter(pk=run.parent_id).exists(),
        "children": Run.objects.visible_to(request.user).filter(parent=run).order_by("parent_step", "pk")[:MAX_FORKS_LISTED],
        "edit_form": RunEditForm(instance=run),
        "share_links": run.share_links.active(),
    })


@login_or_share_link_required
def episode_detail(request, pk: int, episode_id: int):
    """One stored episode read token by token (``dashboard/token_view.js`` draws it from the API).
    Access exactly as the run page's; a share link's token (``?share=``) opens it without a login."""
    token = request.GET.get("share") or None
    run = get_run_for_user(request.user, pk, "view", share_token=token)
    episode = get_object_or_404(StoredEpisode.objects.only("pk", "run_id", "split", "step", "position"), run=run, pk=episode_id)
    share_query = "?" + urlencode({"share": token}) if token else ""
    return render(request, "runs/episode_detail.html", {
        "run": run, "episode": episode, "share_query": share_query,
        "run_url": reverse("runs:shared_run", args=[token]) if token else run.get_absolute_url(),
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


def _bounded(value: str | None) -> int | None:
    """A run id or step from a query: None when it is none, or past ``MAX_STEP`` (no run id or step
    is that large, and a number past the database's integers is never asked about)."""
    number = _int(value, -1) if value and len(value) <= 12 else -1
    return number if 0 <= number <= MAX_STEP else None


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default


# -- share links ---------------------------------------------------------------------------------

def shared_run(request, token: str):
    """The read-only page a share link opens, with the run's live dashboard (its charts, episodes
    and websocket ask with the same token); 404 once the link is revoked."""
    link = ShareLink.objects.active().filter(token=token).values("run_id").first()
    if link is None:
        raise Http404("This link does not exist or was revoked.")
    run = get_run_for_user(request.user, link["run_id"], "view", share_token=token)
    run_ledger = ledger.ledger(run, with_config=False)  # as the API gives it to a link's reader
    return render(request, "runs/shared_run.html", {
        "run": run, "metrics": sorted(run.latest_metrics().items()), "share_query": "?" + urlencode({"share": token}),
        "ledger": run_ledger, "ledger_steps": run_ledger["steps"][-LEDGER_PAGE_STEPS:][::-1],
    })


@login_required
@require_POST
def create_share(request, pk: int):
    run = get_run_for_user(request.user, pk, "edit")
    ShareLink.objects.create(run=run, created_by=request.user)
    messages.success(request, "Share link created; anyone with it can view this run until you revoke it.")
    return redirect(run)


@login_required
@require_POST
def revoke_share(request, pk: int):
    link = get_object_or_404(ShareLink, pk=pk)
    run = get_run_for_user(request.user, link.run_id, "edit")
    link.revoke()
    messages.info(request, "Share link revoked.")
    return redirect(run)
