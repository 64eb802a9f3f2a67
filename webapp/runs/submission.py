"""Where every platform run is created: ``submit`` queues a run within its owner's and its
project's quota of queued and running runs, so that one person (or their sweeps) cannot take
every worker.

The quota is counted and the run created in one transaction that first locks the owner's row and
the project's, so two submissions at once cannot both take the last place. Platform admins
(superusers) are never refused; their runs count in their project's total like anyone's.
External runs (trained elsewhere, reported over the API) use no worker and are not counted.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from webapp.runs.models import Run
from webapp.teams.models import Project


class QuotaExceeded(Exception):
    """A run was refused because its owner or its project has as many runs queued or running as allowed."""


def _active(**where: Any) -> int:
    return Run.objects.filter(kind=Run.Kind.PLATFORM, status__in=(Run.Status.QUEUED, Run.Status.RUNNING), **where).count()


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def quota_problem(owner, project: Project | None) -> str | None:
    """Why ``owner`` may not queue another run in ``project`` now (None: they may)."""
    if owner.is_superuser:
        return None
    mine = _active(owner=owner)
    if mine >= settings.RUN_QUOTA_PER_PERSON:
        return (f"You have {_runs(mine)} queued or running, the most one person may have "
                f"({settings.RUN_QUOTA_PER_PERSON}); wait for one to end or cancel one.")
    if project is not None:
        theirs = _active(project=project)
        if theirs >= settings.RUN_QUOTA_PER_PROJECT:
            return (f"Project {project.name} has {_runs(theirs)} queued or running, the most one project may have "
                    f"({settings.RUN_QUOTA_PER_PROJECT}); wait for one to end, or cancel one.")
    return None


def submit(*, owner, project: Project | None = None, **fields: Any) -> Run:
    """Create a platform run for ``owner`` (``fields``: the other ``Run`` fields), queued and sent
    for a worker. Raises ``QuotaExceeded`` (nothing created) when the quota is full."""
    with transaction.atomic():
        # Row locks, always the person's before the project's: a second submission by the same
        # person or in the same project waits here until this one has counted and committed.
        get_user_model().objects.select_for_update().get(pk=owner.pk)
        if project is not None:
            Project.objects.select_for_update().get(pk=project.pk)
        problem = quota_problem(owner, project)
        if problem is not None:
            raise QuotaExceeded(problem)
        run = Run.objects.create(owner=owner, project=project, kind=Run.Kind.PLATFORM, status=Run.Status.QUEUED, **fields)
    run.enqueue()
    return run
