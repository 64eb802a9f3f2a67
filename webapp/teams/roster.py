"""Changing who belongs to a team, and its projects.

The rules: anyone signed in may start a team (and owns it); a team's owners and admins add and
remove members, change roles and add projects; only an owner makes, unmakes or removes an owner;
a team always keeps one owner. A refused change raises ``RosterError`` with what to do instead;
someone outside the team, or without the right role, gets ``PermissionDenied``.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils.text import slugify

from webapp.teams.models import Invitation, Membership, Project, Team, role_in, token_digest

Role = Membership.Role
MANAGERS = (Role.OWNER, Role.ADMIN)


class RosterError(ValueError):
    """A change the rules refuse; the message says why and what to do."""


def create_team(user, name: str) -> Team:
    base = slugify(name) or "team"
    slug, n = base, 1
    while Team.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    with transaction.atomic():
        team = Team.objects.create(name=name, slug=slug)
        Membership.objects.create(team=team, user=user, role=Role.OWNER)
    return team


def may_manage(user, team: Team) -> bool:
    return role_in(user, team.pk) in MANAGERS


def add_member(actor, team: Team, username: str, role: str) -> Membership:
    _require_manager(actor, team)
    _require_owner_for(actor, team, role)
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise RosterError(f"There is no user named {username!r}; they need an account first.")
    if Membership.objects.filter(team=team, user=user).exists():
        raise RosterError(f"{username} is already in {team}; change their role in the list instead.")
    return Membership.objects.create(team=team, user=user, role=role)


def set_role(actor, team: Team, user_id: int, role: str) -> Membership:
    _require_manager(actor, team)
    membership = _membership(team, user_id)
    _require_owner_for(actor, team, role, membership.role)
    with transaction.atomic():
        if membership.role == Role.OWNER and role != Role.OWNER:
            _keep_an_owner(team, membership)
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def remove_member(actor, team: Team, user_id: int) -> None:
    membership = _membership(team, user_id)
    if membership.user_id != actor.pk:  # leaving needs no role; removing someone else does
        _require_manager(actor, team)
        _require_owner_for(actor, team, membership.role)
    with transaction.atomic():
        if membership.role == Role.OWNER:
            _keep_an_owner(team, membership)
        membership.delete()


def add_project(actor, team: Team, name: str, description: str = "") -> Project:
    _require_manager(actor, team)
    if Project.objects.filter(team=team, name=name).exists():
        raise RosterError(f"{team} already has a project named {name!r}.")
    return Project.objects.create(team=team, name=name, description=description)


def invite(actor, team: Team, role: str) -> tuple[Invitation, str]:
    """A single-use link to join ``team`` as ``role`` (same rules as adding a member), valid for
    ``INVITATION_DAYS``; returns the invitation and its token, which is not stored."""
    import secrets
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    _require_manager(actor, team)
    _require_owner_for(actor, team, role)
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        team=team, role=role, token_hash=token_digest(token), created_by=actor,
        expires_at=timezone.now() + timedelta(days=settings.INVITATION_DAYS),
    )
    return invitation, token


def revoke_invitation(actor, invitation: Invitation) -> None:
    from django.utils import timezone

    _require_manager(actor, invitation.team)
    Invitation.objects.filter(pk=invitation.pk, used_at__isnull=True).update(revoked_at=timezone.now())


def accept(invitation: Invitation, user) -> Membership:
    """``user`` joins through ``invitation`` (once: a second use, or one after expiry, is refused)."""
    with transaction.atomic():
        if not invitation.claim(user):
            raise RosterError("This invitation was already used, revoked or has expired; ask for a new one.")
        membership, created = Membership.objects.get_or_create(team=invitation.team, user=user, defaults={"role": invitation.role})
        if not created:
            raise RosterError(f"You are already in {invitation.team}; the invitation was not used.")
    return membership


def _require_manager(actor, team: Team) -> None:
    if not may_manage(actor, team):
        raise PermissionDenied("Only the team's owners and admins manage its members and projects.")


def _require_owner_for(actor, team: Team, *roles: str) -> None:
    if Role.OWNER in roles and role_in(actor, team.pk) != Role.OWNER:
        raise RosterError("Only an owner can make, unmake or remove an owner.")


def _keep_an_owner(team: Team, leaving: Membership) -> None:
    owners = Membership.objects.select_for_update().filter(team=team, role=Role.OWNER).exclude(pk=leaving.pk)
    if not owners.exists():
        raise RosterError(f"{team} needs an owner: make someone else owner first.")


def _membership(team: Team, user_id: int) -> Membership:
    membership = Membership.objects.filter(team=team, user_id=user_id).select_related("user").first()
    if membership is None:
        raise RosterError("That person is not in this team.")
    return membership
