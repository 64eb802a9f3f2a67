"""Who may do what in a project: ``view`` it, ``run`` (start runs and register entries there).
Owners, admins and members may start runs; viewers may only look. Platform admins may do everything."""

from __future__ import annotations

from webapp.teams.models import Membership, Project, role_in

PROJECT_ACTIONS = ("view", "run")
PROJECT_ACTIONS_BY_ROLE = {
    Membership.Role.OWNER: frozenset(PROJECT_ACTIONS),
    Membership.Role.ADMIN: frozenset(PROJECT_ACTIONS),
    Membership.Role.MEMBER: frozenset(PROJECT_ACTIONS),
    Membership.Role.VIEWER: frozenset({"view"}),
}


def can_in_project(user, project: Project, action: str) -> bool:
    """``view``: see the project; ``run``: start runs (and register entries) in it."""
    if action not in PROJECT_ACTIONS:
        raise ValueError(f"Unknown project action {action!r}; known: {', '.join(PROJECT_ACTIONS)}.")
    if user is None or not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    role = role_in(user, project.team_id)
    return role is not None and action in PROJECT_ACTIONS_BY_ROLE[role]


def projects_for(user, action: str = "view"):
    """The projects where ``user`` may ``action`` (the same rule as ``can_in_project``)."""
    if user is None or not user.is_authenticated:
        return Project.objects.none()
    projects = Project.objects.select_related("team")
    if user.is_superuser:
        return projects
    roles = [role for role, actions in PROJECT_ACTIONS_BY_ROLE.items() if action in actions]
    return projects.filter(team__memberships__user=user, team__memberships__role__in=roles)
