"""Teams, their members' roles, their projects, and read-only share links to runs.

Who may do what with these is decided in one place, ``webapp.runs.access``; this module only says
who belongs where.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.dispatch import Signal
from django.urls import reverse
from django.utils import timezone


class Team(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["team", "user"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="unique_team_member")]

    def __str__(self) -> str:
        return f"{self.user} ({self.role}) in {self.team}"


def teams_of(user) -> models.QuerySet[Team]:
    """The teams ``user`` belongs to, in any role (none for an anonymous user)."""
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def role_in(user, team_id: int) -> str | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(team_id=team_id, user=user).values_list("role", flat=True).first()


class Project(models.Model):
    """Where a team's runs and registry entries live."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="projects")
    name = models.SlugField(max_length=100)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    keep_checkpoints = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Checkpoints each run keeps in the artifact store, the newest (its final model is always kept). Empty: the platform's setting.",
    )

    class Meta:
        ordering = ["team__name", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_project_name")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"


class ShareLinkQuerySet(models.QuerySet):
    def active(self) -> "ShareLinkQuerySet":
        return self.filter(revoked_at__isnull=True)


def _new_token() -> str:
    return secrets.token_urlsafe(24)


class ShareLink(models.Model):
    """A revocable read-only link to one run: whoever has the URL sees the run, logged in or not."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="share_links")
    token = models.CharField(max_length=64, unique=True, default=_new_token, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ShareLinkQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"share link of {self.run_id}{' (revoked)' if self.revoked_at else ''}"

    def get_absolute_url(self) -> str:
        return reverse("runs:shared_run", args=[self.token])

    def revoke(self) -> bool:
        revoked = bool(ShareLink.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()))
        if revoked:
            share_link_revoked.send(sender=ShareLink, instance=self)
        return revoked


# Sent by ``ShareLink.revoke`` (a queryset update, so no post_save): the link's open sockets close.
share_link_revoked = Signal()


def token_digest(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()


class InvitationQuerySet(models.QuerySet):
    def open(self) -> "InvitationQuerySet":
        """Those that can still be used: not used, revoked or expired."""
        return self.filter(used_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())

    def addressed_to(self, user) -> "InvitationQuerySet":
        """Those that name ``user``: by username, or by the email address of their account."""
        named = models.Q(invitee=user.username)
        if user.email:
            named |= models.Q(invitee__iexact=user.email)
        return self.filter(named)


class Invitation(models.Model):
    """A link that lets one person join a team in a role: single-use, expiring, revocable. Only the
    token's SHA-256 is kept; the link is shown once, to whoever made it. One that names an invitee
    (a username or an email address) is for that person only, who also finds it on their Teams page."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    invitee = models.CharField(
        max_length=254, blank=True,
        help_text="The username or email address of the one person who may use it; empty: whoever has the link.",
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = InvitationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"invitation to {self.team} as {self.role}"

    @property
    def for_email(self) -> bool:
        return "@" in self.invitee

    @classmethod
    def usable(cls, token: str) -> "Invitation | None":
        """The invitation of ``token`` if it can still be used (not used, revoked or expired)."""
        return cls.objects.open().select_related("team", "created_by").filter(token_hash=token_digest(token)).first()

    def claim(self, user) -> bool:
        """Mark used by ``user``; False when someone else used it (or it expired) first."""
        return bool(Invitation.objects.filter(
            pk=self.pk, used_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now(),
        ).update(used_at=timezone.now(), used_by=user))
