"""The one place that decides who may do what with a run (with a project: ``webapp.teams.access``).

Every page, API endpoint and websocket asks ``can`` (or ``get_run_for_user``, which 404s).

- Platform admins (superusers) may do everything; anonymous users nothing, except viewing a run
  through an active share link.
- A run's owner may do everything with it; running it again (clone, sweep, playground) in a
  project also needs the right to start runs there, which an owner who left the team has lost.
- A run without a project, or with ``private`` visibility, is its owner's alone.
- A ``team``-visible run in a project: the team's owners and admins may do everything, members may
  view it and run it again (clone), viewers may view it.
- In a project, owners, admins and members may start runs; viewers may only look.
- Registry entries (agents, datasets, rewards) a person may see, they may use in the runs they may
  start: a viewer of project X who is a member of Y trains on X's dataset in Y (or in a personal
  run), as a W&B artifact one may read can be used by one's own runs; they still start nothing in X.
  Except an agent of another project that takes secrets (``{"$secret": ...}`` in its arguments):
  it would hand that project's secrets to a run outside it, so only runs in its own project use it.
"""

from __future__ import annotations

from typing import Iterable

from django.http import Http404

from django.db.models import Q

from webapp.runs.models import Run
from webapp.teams.access import PROJECT_ACTIONS_BY_ROLE, projects_for
from webapp.teams.models import Membership, Project, ShareLink, role_in

ACTIONS = ("view", "edit", "run", "cancel", "delete")

_ALL = frozenset(ACTIONS)
# What each team role may do with a team-visible run that someone else owns.
RUN_ACTIONS_BY_ROLE = {
    Membership.Role.OWNER: _ALL,
    Membership.Role.ADMIN: _ALL,
    Membership.Role.MEMBER: frozenset({"view", "run"}),
    Membership.Role.VIEWER: frozenset({"view"}),
}


def can(user, run: Run, action: str, share_token: str | None = None) -> bool:
    """Whether ``user`` (possibly anonymous, or holding ``share_token``) may ``action`` ``run``."""
    if action not in ACTIONS:
        raise ValueError(f"Unknown action {action!r}; known: {', '.join(ACTIONS)}.")
    if share_token and action == "view" and ShareLink.objects.active().filter(run_id=run.pk, token=share_token).exists():
        return True
    if user is None or not user.is_authenticated:
        return False
    mine = run.owner_id == user.pk
    if user.is_superuser or (mine and (action != "run" or run.project_id is None)):
        return True
    if run.project_id is None or (run.visibility != Run.Visibility.TEAM and not mine):
        return False
    role = role_in(user, Project.objects.filter(pk=run.project_id).values_list("team_id", flat=True).first())
    if mine:  # running puts new work on the project's workers: an owner who left its team, or a viewer there now, may not
        return role is not None and "run" in PROJECT_ACTIONS_BY_ROLE[role]
    return role is not None and action in RUN_ACTIONS_BY_ROLE[role]


# What ``can`` reads of a run.
ACCESS_FIELDS = ("owner", "project", "visibility")


def get_run_for_user(user, pk: int, action: str = "view", share_token: str | None = None,
                     only: Iterable[str] | None = None) -> Run:
    """The run ``pk`` if ``user`` may ``action`` it; 404 otherwise (a stranger cannot tell it exists).
    With its registry entries, owner and project, or with ``only`` those of its fields (and what the
    check reads): a caller that needs no more is spared the joins (planning the seven-table query
    took longer than a histogram of one step; a field left out is still read when asked, by a query
    of its own)."""
    runs = (Run.objects.only(*ACCESS_FIELDS, *only) if only is not None
            else Run.objects.select_related("agent", "dataset", "reward", "backend", "owner", "project__team"))
    try:
        run = runs.get(pk=pk)
    except Run.DoesNotExist:
        raise Http404("No such run.") from None
    if not can(user, run, action, share_token):
        raise Http404("No such run.")
    return run


def usable_entries(user, model):
    """The registry entries of ``model`` (Agent, Dataset, RewardFunction) ``user`` may choose for a
    run: the shared ones and those of every project ``user`` may view. Where the run may go is
    ``projects_for(user, "run")``'s to say; ``entry_problem`` judges an entry against that project."""
    if user is None or not user.is_authenticated:
        return model.objects.none()
    if user.is_superuser:
        return model.objects.all()
    return model.objects.filter(Q(project__isnull=True) | Q(project__in=projects_for(user, "view")))


def entry_problem(user, entry, project: Project | None) -> str | None:
    """Why ``user`` may not use registry ``entry`` in a run in ``project`` (None: they may)."""
    if entry.project_id is None or (project is not None and entry.project_id == project.pk):
        return None
    if not usable_entries(user, type(entry)).filter(pk=entry.pk).exists():
        return f"No such {entry._meta.verbose_name}."  # a stranger learns nothing of another project's entries
    secrets = sorted(entry.secret_names()) if hasattr(entry, "secret_names") else []
    if secrets:
        return (f"{entry._meta.verbose_name.capitalize()} {entry.name!r} uses secrets of project {entry.project} "
                f"({', '.join(secrets)}): only runs in that project may use it.")
    return None
