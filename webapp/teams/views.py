"""Teams: members, roles, projects, invitations
(the rules live in ``webapp.teams.roster``)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.db import transaction
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.teams import roster
from webapp.teams.forms import InvitationForm, ProjectForm, RoleForm, TeamForm
from webapp.teams.models import Invitation, Membership, Team, role_in

NEW_INVITATION = "new_invitation_link"


@login_required
def my_teams(request):
    memberships = Membership.objects.filter(user=request.user).select_related("team").prefetch_related("team__projects")
    invitations = Invitation.objects.open().addressed_to(request.user).select_related("team", "created_by")
    return render(request, "teams/my_teams.html", {"memberships": memberships, "form": TeamForm(), "invitations": invitations})


@login_required
@require_POST
def answer_invitation(request, pk: int):
    """Accept (or, with ``decline``, turn down) an invitation that names the person signed in."""
    invitation = Invitation.objects.open().addressed_to(request.user).select_related("team").filter(pk=pk).first()
    if invitation is None:
        raise Http404("No such invitation for you (it may have been used, revoked or expired).")
    if "decline" in request.POST:
        roster.decline(invitation, request.user)
        messages.info(request, f"You turned down the invitation to {invitation.team}.")
        return redirect("teams:mine")
    try:
        roster.accept(invitation, request.user)
    except roster.RosterError as error:
        messages.error(request, str(error))
        return redirect("teams:mine")
    messages.success(request, f"Welcome to {invitation.team}: you joined as {invitation.role}.")
    return redirect("teams:detail", slug=invitation.team.slug)


@login_required
@require_POST
def create_team(request):
    form = TeamForm(request.POST)
    if not form.is_valid():
        messages.error(request, _errors(form))
        return redirect("teams:mine")
    team = roster.create_team(request.user, form.cleaned_data["name"])
    messages.success(request, f"Team {team} created; you are its owner.")
    return redirect("teams:detail", slug=team.slug)


@login_required
def team_detail(request, slug: str):
    """Members and projects; owners and admins also get the forms that change them."""
    team = _team_of_member(request.user, slug)
    may_manage = roster.may_manage(request.user, team)
    return render(request, "teams/team_detail.html", {
        "team": team, "role": role_in(request.user, team.pk), "may_manage": may_manage,
        "memberships": team.memberships.select_related("user").order_by("user__username"),
        "projects": team.projects.all(), "roles": Membership.Role.choices,
        "project_form": ProjectForm(), "invitation_form": InvitationForm(),
        "invitations": team.invitations.open().select_related("created_by") if may_manage else [],
        "new_invitation": request.session.pop(NEW_INVITATION, None) if may_manage else None,
    })


@login_required
@require_POST
def create_invitation(request, slug: str):
    """A single-use link to join; shown once on the team page (only its hash is stored)."""
    team = _team_of_member(request.user, slug)
    form = InvitationForm(request.POST)
    if not form.is_valid():
        messages.error(request, _errors(form))
        return redirect("teams:detail", slug=slug)
    try:
        invitation, token = roster.invite(request.user, team, form.cleaned_data["role"], form.cleaned_data["invitee"])
    except roster.RosterError as error:
        messages.error(request, str(error))
        return redirect("teams:detail", slug=slug)
    request.session[NEW_INVITATION] = {
        "url": request.build_absolute_uri(reverse("teams:accept_invitation", args=[token])),
        "role": invitation.role, "invitee": invitation.invitee,
        "expires_at": invitation.expires_at.isoformat(timespec="minutes"),
    }
    return redirect("teams:detail", slug=slug)


@login_required
@require_POST
def revoke_invitation(request, pk: int):
    invitation = get_object_or_404(Invitation.objects.select_related("team"), pk=pk)
    team = _team_of_member(request.user, invitation.team.slug)
    roster.revoke_invitation(request.user, invitation)
    messages.info(request, "Invitation revoked; its link no longer works.")
    return redirect("teams:detail", slug=team.slug)


def accept_invitation(request, token: str):
    """Join a team by link: a newcomer picks a username and password; someone logged in joins as themselves."""
    invitation = Invitation.usable(token)
    if invitation is None:
        return render(request, "teams/invitation.html", {"invalid": True}, status=404)
    try:
        roster.check_invitation(invitation, request.user if request.user.is_authenticated else None)
    except roster.RosterError as error:
        return render(request, "teams/invitation.html", {"invalid": True, "reason": str(error)}, status=403)
    form = None
    if not request.user.is_authenticated:
        named = {"username": invitation.invitee} if invitation.invitee and not invitation.for_email else {}
        form = UserCreationForm(request.POST or None, initial=named)
    if request.method == "POST" and (form is None or form.is_valid()):
        try:
            with transaction.atomic():  # no account is left behind when the link was used meanwhile
                user = request.user if form is None else _new_account(form, invitation)
                roster.accept(invitation, user)
        except roster.RosterError as error:
            messages.error(request, str(error))
            return redirect("runs:list" if request.user.is_authenticated else "login")
        if form is not None:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome to {invitation.team}: you joined as {invitation.role}.")
        return redirect("teams:detail", slug=invitation.team.slug)
    return render(request, "teams/invitation.html", {"invitation": invitation, "form": form})


def _new_account(form: UserCreationForm, invitation: Invitation):
    """The account a newcomer makes through ``invitation``: one sent to an email address gives the
    account that address (whoever has the link received it there)."""
    user = form.save(commit=False)
    if invitation.for_email:
        user.email = invitation.invitee
    user.save()
    return user


class LoginView(auth_views.LoginView):
    """Django's login page, with a link to sign-up where it is open."""

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "signup_open": settings.SIGNUP_OPEN}


def signup(request):
    """Anyone makes an account, where an administrator opened sign-up (``SIGNUP_OPEN``); 404 otherwise."""
    if not settings.SIGNUP_OPEN:
        raise Http404("Sign-up is closed; ask a team for an invitation link.")
    if request.user.is_authenticated:
        return redirect("runs:list")
    form = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}. Start a team, or ask one for an invitation.")
        return redirect("teams:mine")
    return render(request, "registration/signup.html", {"form": form})


@login_required
@require_POST
def change_role(request, slug: str, user_id: int):
    team = _team_of_member(request.user, slug)
    form = RoleForm(request.POST)
    _apply(request, form, lambda data: roster.set_role(request.user, team, user_id, data["role"]),
           lambda m: f"{m.user} is now {m.role}.")
    return redirect("teams:detail", slug=slug)


@login_required
@require_POST
def remove_member(request, slug: str, user_id: int):
    team = _team_of_member(request.user, slug)
    try:
        roster.remove_member(request.user, team, user_id)
    except roster.RosterError as error:
        messages.error(request, str(error))
        return redirect("teams:detail", slug=slug)
    if user_id == request.user.pk:
        messages.info(request, f"You left {team}.")
        return redirect("teams:mine")
    messages.info(request, "Removed from the team.")
    return redirect("teams:detail", slug=slug)


@login_required
@require_POST
def add_project(request, slug: str):
    team = _team_of_member(request.user, slug)
    form = ProjectForm(request.POST)
    _apply(request, form, lambda data: roster.add_project(request.user, team, data["name"], data["description"]),
           lambda p: f"Project {p} added.")
    return redirect("teams:detail", slug=slug)


def _team_of_member(user, slug: str) -> Team:
    """The team, for its members; 404 for everyone else (as with runs, a stranger learns nothing)."""
    team = get_object_or_404(Team, slug=slug)
    if role_in(user, team.pk) is None:
        raise Http404("No such team.")
    return team


def _apply(request, form, change, success) -> None:
    """Validate ``form``, make the roster ``change``, and say how it went (refusals by the rules included)."""
    if not form.is_valid():
        messages.error(request, _errors(form))
        return
    try:
        done = change(form.cleaned_data)
    except roster.RosterError as error:
        messages.error(request, str(error))
        return
    messages.success(request, success(done))


def _errors(form) -> str:
    return " ".join(f"{field}: {' '.join(errors)}" if field != "__all__" else " ".join(errors)
                    for field, errors in form.errors.items())
