"""What the checkpoint pages and API do, as plain functions: list a run's stored checkpoints with
their metrics, set and resolve a project's aliases, submit an evaluation and read the evaluation
table. Access is checked here, through the runs' and projects' own access functions, so every view asks the same."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.http import Http404

from webapp.celery_app import app
from webapp.checkpoints.models import CheckpointAlias, Evaluation, EvaluationScore
from webapp.dashboard.series import arrays_after
from webapp.playground.forms import playground_queue
from webapp.registry.models import Dataset
from webapp.runs import artifacts
from webapp.runs.access import can
from webapp.runs.downloads import published_checkpoints
from webapp.runs.models import Run
from webapp.teams.access import can_in_project
from webapp.teams.models import Project

logger = logging.getLogger(__name__)

# The Celery task that runs an evaluation (``workers.tasks``), sent by name.
EVALUATE_CHECKPOINT = "workers.evaluate_checkpoint"
MAX_LISTED_CHECKPOINTS = 200
MAX_METRICS_PER_CHECKPOINT = 200
MAX_ALIASES_PER_PROJECT = 200
MAX_PENDING_EVALUATIONS = 20  # queued or running, per project
MAX_EPISODES_PER_TASK = 16
MAX_TABLE_ROWS = 1000
# The evaluation table's columns a person may sort by, and what each sorts on.
SORTS = {
    "run": ("evaluation__run_id", "evaluation__step", "data_source"),
    "step": ("evaluation__step", "evaluation__run_id", "data_source"),
    "source": ("data_source", "evaluation__run_id", "evaluation__step"),
    "dataset": ("evaluation__dataset__name", "data_source", "evaluation__run_id"),
    "reward": ("reward", "evaluation__run_id", "evaluation__step"),
    "pass1": ("pass_at_1", "evaluation__run_id", "evaluation__step"),
    "passk": ("pass_at_k", "evaluation__run_id", "evaluation__step"),
    "created": ("evaluation__created_at", "data_source"),
}


class Refused(Exception):
    """Input that is not acceptable, in words for the person (nothing was changed or queued)."""


def project_for_user(user, pk: int, action: str = "view") -> Project:
    """Project ``pk`` if ``user`` may ``action`` in it; 404 otherwise (a stranger cannot tell it exists)."""
    project = Project.objects.select_related("team").filter(pk=pk).first()
    if project is None or not can_in_project(user, project, "view"):
        raise Http404("No such project.")
    if not can_in_project(user, project, action):
        raise Refused("Only the project's owners, admins and members may do this; viewers may look.")
    return project


# -- a run's stored checkpoints --------------------------------------------------------------

def stored_steps(run: Run) -> list[int]:
    """The steps of the checkpoints ``run`` keeps (its published folders, rotated ones gone; with a
    shared artifact store, those stored there)."""
    found = artifacts.run_checkpoints(run) if artifacts.shared() else published_checkpoints(run)
    return sorted(step for step, _ in found)[-MAX_LISTED_CHECKPOINTS:]


def metrics_at(run: Run, step: int) -> dict[str, float | None]:
    """The run's metric points logged at ``step``, from the metric store."""
    points = arrays_after(run.pk, step - 1, step)
    found = {}
    for key, (_, values) in list(points.items())[:MAX_METRICS_PER_CHECKPOINT]:
        value = float(values[-1])
        found[key] = value if math.isfinite(value) else None
    return found


def checkpoint_listing(run: Run) -> list[dict]:
    """Each stored checkpoint of ``run``: its step, the metrics at that step and its aliases."""
    aliases: dict[int, list[str]] = {}
    for name, step in CheckpointAlias.objects.filter(run=run).order_by("name").values_list("name", "step"):
        aliases.setdefault(step, []).append(name)
    return [{"step": step, "name": f"checkpoint-{step}", "metrics": metrics_at(run, step), "aliases": aliases.get(step, [])}
            for step in stored_steps(run)]


# -- aliases ---------------------------------------------------------------------------------

def _checkpoint_of(user, project: Project, run_id: int, step: int, action: str = "view") -> Run:
    """The run ``run_id`` of ``project`` that ``user`` may ``action``, holding a stored checkpoint at ``step``."""
    run = Run.objects.select_related("backend", "project").filter(pk=run_id).first()
    if run is None or run.project_id != project.pk or not can(user, run, action):
        raise Refused(f"Project {project} has no run {run_id} that you may see.")
    if step not in stored_steps(run):
        stored = ", ".join(map(str, stored_steps(run))) or "none"
        raise Refused(f"Run {run_id} keeps no checkpoint at step {step} (its stored checkpoints' steps: {stored}).")
    return run


def set_alias(user, project: Project, name: str, run_id: int, step: int) -> CheckpointAlias:
    """Point ``name`` at (run, step) in ``project``: created, or moved from the checkpoint it named."""
    run = _checkpoint_of(user, project, run_id, step)
    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()  # one writer of the project's aliases at a time
        existing = CheckpointAlias.objects.filter(project=project, name=name).first()
        if existing is None and CheckpointAlias.objects.filter(project=project).count() >= MAX_ALIASES_PER_PROJECT:
            raise Refused(f"Project {project} has {MAX_ALIASES_PER_PROJECT} aliases, the most it may have; delete one first.")
        alias, _ = CheckpointAlias.objects.update_or_create(
            project=project, name=name, defaults={"run": run, "step": step, "set_by": user})
    return alias


def resolve_alias_row(user, project: Project, name: str) -> CheckpointAlias:
    """The alias ``name`` of ``project``, when its run is one ``user`` may see (404 otherwise)."""
    alias = CheckpointAlias.objects.select_related("run", "run__backend").filter(project=project, name=name[:64]).first()
    if alias is None or not can(user, alias.run, "view"):
        raise Http404(f"Project {project} has no alias {name[:64]!r}.")
    return alias


def resolve_alias(user, project: Project, name: str) -> CheckpointAlias:
    """``resolve_alias_row``, when the run still keeps the checkpoint the alias names."""
    alias = resolve_alias_row(user, project, name)
    if alias.step not in stored_steps(alias.run):
        raise Http404(f"Alias {name!r} names run {alias.run_id} at step {alias.step}, a checkpoint the run no longer "
                      "keeps (rotated out or deleted); point the alias at a stored checkpoint.")
    return alias


def aliases_of(user, project: Project) -> list[CheckpointAlias]:
    return [a for a in CheckpointAlias.objects.filter(project=project).select_related("run", "set_by").order_by("name")
            if can(user, a.run, "view")]


# -- evaluations -----------------------------------------------------------------------------

@dataclass(frozen=True)
class EvaluationRequest:
    run_id: int
    step: int
    dataset_id: int
    episodes_per_task: int = 1
    max_tasks: int | None = None


def submit_evaluation(user, project: Project, asked: EvaluationRequest) -> Evaluation:
    """Check the request (the checkpoint is stored, the dataset is one of the project's, the bounds),
    record it and send it to a worker of the run's queue. Refused: nothing is recorded or queued."""
    run = _checkpoint_of(user, project, asked.run_id, asked.step)
    if run.kind != Run.Kind.PLATFORM or run.agent_id is None:
        raise Refused(f"Run {run.pk} was trained outside the platform: it has no agent to evaluate here.")
    dataset = Dataset.objects.usable_in(project).filter(pk=asked.dataset_id).first()
    if dataset is None:
        raise Refused(f"Project {project} has no dataset {asked.dataset_id} (its own and the shared ones may be used).")
    if not 1 <= asked.episodes_per_task <= MAX_EPISODES_PER_TASK:
        raise Refused(f"episodes_per_task is 1 to {MAX_EPISODES_PER_TASK}.")
    limit = settings.EVALUATION_MAX_TASKS
    max_tasks = asked.max_tasks if asked.max_tasks is not None else limit
    if not 1 <= max_tasks <= limit:
        raise Refused(f"max_tasks is 1 to {limit}.")
    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()  # the bound holds against parallel requests
        pending = Evaluation.objects.filter(project=project).exclude(status__in=Evaluation.FINAL).count()
        if pending >= MAX_PENDING_EVALUATIONS:
            raise Refused(f"Project {project} has {pending} evaluations waiting or running, the most it may have; "
                          "wait for some to finish.")
        evaluation = Evaluation.objects.create(
            project=project, run=run, step=asked.step, dataset=dataset, split=dataset.val_split or dataset.train_split,
            episodes_per_task=asked.episodes_per_task, max_tasks=max_tasks, created_by=user, queue=playground_queue(run),
            sent_at=timezone.now(),
        )
    try:
        app.send_task(EVALUATE_CHECKPOINT, args=[evaluation.pk], queue=evaluation.queue)
    except Exception as exc:  # the broker is away: the row says so rather than waiting for ever
        logger.warning("Sending evaluation %s to queue %s failed: %s", evaluation.pk, evaluation.queue, exc)
        evaluation.finish(Evaluation.Status.FAILED, f"It could not be sent to a worker (the queue is away: {exc}); ask again.")
        evaluation.refresh_from_db()
    return evaluation


def visible_evaluations(user, project: Project):
    """The project's evaluations of runs ``user`` may see, newest first."""
    evaluations = Evaluation.objects.filter(project=project).select_related("run", "dataset").order_by("-created_at", "-pk")
    return [e for e in evaluations[:MAX_TABLE_ROWS] if can(user, e.run, "view")]


def evaluation_table(user, project: Project, sort: str = "run", descending: bool = False) -> list[dict]:
    """The rows of the evaluation table, one per (run, checkpoint, data source) of each finished
    evaluation ``user`` may see, sorted by ``sort`` (a ``SORTS`` name)."""
    if sort not in SORTS:
        raise Refused(f"sort is one of {', '.join(SORTS)}.")
    seen = {e.pk for e in visible_evaluations(user, project)}
    order = [("-" if descending else "") + field for field in SORTS[sort]] + ["pk"]
    scores = EvaluationScore.objects.filter(evaluation_id__in=seen).select_related("evaluation__run", "evaluation__dataset")
    rows = []
    for score in scores.order_by(*order)[:MAX_TABLE_ROWS]:
        evaluation = score.evaluation
        rows.append({
            "evaluation": evaluation.pk, "run": evaluation.run_id, "run_name": evaluation.run.name, "step": evaluation.step,
            "checkpoint": f"checkpoint-{evaluation.step}", "dataset": evaluation.dataset.name, "split": evaluation.split,
            "data_source": score.data_source, "tasks": score.tasks, "reward": score.reward, "pass_at_1": score.pass_at_1,
            "k": evaluation.episodes_per_task, "pass_at_k": score.pass_at_k,
        })
    return rows
