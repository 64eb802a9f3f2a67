"""Changing who belongs to a team, and its projects.

The rules: anyone signed in may start a team (and owns it); a team's owners and admins invite
people, remove members, change roles and add projects; only an owner makes, unmakes or removes an
owner; a team always keeps one owner. Nobody joins without consenting: people join by accepting an
invitation (a link, or one that names them), never by being added. An invitation grants only what
its maker may still grant: it is checked again when accepted, and revoked when its maker leaves the
team or loses the role it needed. A refused change raises ``RosterError`` with what to do instead;
someone outside the team, or without the right role, gets ``PermissionDenied``.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
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


def set_role(actor, team: Team, user_id: int, role: str) -> Membership:
    _require_manager(actor, team)
    membership = _membership(team, user_id)
    _require_owner_for(actor, team, role, membership.role)
    with transaction.atomic():
        if membership.role == Role.OWNER and role != Role.OWNER:
            _keep_an_owner(team, membership)
        membership.role = role
        membership.save(update_fields=["role"])
        _revoke_what_they_may_no_longer_grant(team, membership.user_id, role)
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
        _revoke_what_they_may_no_longer_grant(team, membership.user_id, None)


def add_project(actor, team: Team, name: str, description: str = "") -> Project:
    _require_manager(actor, team)
    if Project.objects.filter(team=team, name=name).exists():
        raise RosterError(f"{team} already has a project named {name!r}.")
    return Project.objects.create(team=team, name=name, description=description)


def invite(actor, team: Team, role: str, invitee: str = "") -> tuple[Invitation, str]:
    """A single-use link to join ``team`` as ``role``, valid for ``INVITATION_DAYS``; returns the
    invitation and its token, which is not stored. With ``invitee`` (a username or an email address)
    only that person may use it; whether such an account exists is neither checked nor said."""
    import secrets
    from datetime import timedelta

    from django.conf import settings

    _require_manager(actor, team)
    _require_owner_for(actor, team, role)
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        team=team, role=role, invitee=invitee.strip(), token_hash=token_digest(token), created_by=actor,
        expires_at=timezone.now() + timedelta(days=settings.INVITATION_DAYS),
    )
    return invitation, token


def revoke_invitation(actor, invitation: Invitation) -> None:
    _require_manager(actor, invitation.team)
    Invitation.objects.filter(pk=invitation.pk, used_at__isnull=True).update(revoked_at=timezone.now())


def decline(invitation: Invitation, user) -> None:
    """``user`` turns down an invitation that names them; its link stops working."""
    Invitation.objects.addressed_to(user).filter(pk=invitation.pk, used_at__isnull=True).update(revoked_at=timezone.now())


def check_invitation(invitation: Invitation, user=None) -> None:
    """RosterError unless ``invitation`` still grants its role: its maker may still grant it, and,
    when it names someone and ``user`` is known, ``user`` is that person."""
    if not _may_grant(role_in(invitation.created_by, invitation.team_id), invitation.role):
        raise RosterError(f"This invitation no longer works: whoever made it may no longer invite people to "
                          f"{invitation.team} as {invitation.role}. Ask the team for a new one.")
    if user is not None and invitation.invitee and not Invitation.objects.addressed_to(user).filter(pk=invitation.pk).exists():
        raise RosterError(f"This invitation is for {invitation.invitee}, not for you: sign in as them, or ask the team "
                          "for an invitation of your own.")


def accept(invitation: Invitation, user) -> Membership:
    """``user`` joins through ``invitation`` (once: a second use, one after expiry, one whose maker
    may no longer grant its role, or one that names someone else is refused)."""
    with transaction.atomic():
        check_invitation(invitation, user)
        if not invitation.claim(user):
            raise RosterError("This invitation was already used, revoked or has expired; ask for a new one.")
        membership, created = Membership.objects.get_or_create(team=invitation.team, user=user, defaults={"role": invitation.role})
        if not created:
            raise RosterError(f"You are already in {invitation.team}; the invitation was not used.")
    return membership


def _may_grant(granter_role: str | None, role: str) -> bool:
    return granter_role in MANAGERS and (role != Role.OWNER or granter_role == Role.OWNER)


def _revoke_what_they_may_no_longer_grant(team: Team, user_id: int, role: str | None) -> None:
    """Revoke the open invitations to ``team`` that ``user_id``, now in ``role`` (None: out of the
    team), may no longer grant."""
    still = [granted for granted in Role.values if _may_grant(role, granted)]
    Invitation.objects.open().filter(team=team, created_by_id=user_id).exclude(role__in=still).update(revoked_at=timezone.now())


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
