"""Membership changes and invitations. An invitation grants only what its maker may still grant: a
removed admin's open invitation admitted people as admin. Now acceptance checks the maker's role
again (void, with a clear message, when they may no longer grant it), and removing someone or
taking away the role that let them invite revokes their open invitations. Nobody is put in a team
without consenting, and inviting by name never says whether an account of that name exists."""

from __future__ import annotations

import html

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from webapp.teams.models import Invitation, Membership

Role = Membership.Role


@pytest.fixture
def team_admin(team):
    user = get_user_model().objects.create_user("team-admin", password="team-admin-password")
    Membership.objects.create(team=team, user=user, role=Role.ADMIN)
    return user


def make_link(client, team, role: str = "member", invitee: str = "") -> str:
    response = client.post(reverse("teams:create_invitation", args=[team.slug]), {"role": role, "invitee": invitee})
    assert response.status_code == 302
    return client.get(reverse("teams:detail", args=[team.slug])).context["new_invitation"]["url"].removeprefix("http://testserver")


def join(client, link, username="newcomer"):
    return client.post(link, {"username": username, "password1": "a long passphrase", "password2": "a long passphrase"})


def text(response) -> str:
    return html.unescape(response.content.decode())


def messages_of(response) -> str:
    return " ".join(str(m) for m in response.context["messages"]) if response.context else ""


def _role(team, user) -> str | None:
    return Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()


def test_a_removed_admins_open_invitation_admits_nobody(page_client, owner, team_admin, team):
    link = make_link(page_client(team_admin), team, role="admin")
    page_client(owner).post(reverse("teams:remove_member", args=[team.slug, team_admin.pk]))
    assert Invitation.objects.get().revoked_at is not None  # revoked with the removal
    assert page_client(None).get(link).status_code == 404
    assert join(page_client(None), link).status_code == 404
    assert not get_user_model().objects.filter(username="newcomer").exists()


def test_acceptance_checks_the_makers_role_again(page_client, owner, team_admin, team, stranger):
    """Even where no roster change revoked it (the membership deleted in the Django admin, say)."""
    link = make_link(page_client(team_admin), team, role="admin")
    Membership.objects.filter(user=team_admin).delete()
    page = page_client(None).get(link)
    assert page.status_code == 403
    assert ("This invitation no longer works: whoever made it may no longer invite people to Lake team as admin. "
            "Ask the team for a new one.") in text(page)
    assert join(page_client(None), link).status_code == 403
    assert page_client(stranger).post(link).status_code == 403
    assert not get_user_model().objects.filter(username="newcomer").exists() and _role(team, stranger) is None


def test_an_invitation_grants_at_most_what_its_maker_may_still_grant(page_client, owner, teammate, team, stranger):
    page_client(owner).post(reverse("teams:change_role", args=[team.slug, teammate.pk]), {"role": "owner"})
    owner_link = make_link(page_client(owner), team, role="owner")
    member_link = make_link(page_client(owner), team, role="member")
    # No longer an owner: the owner invitation is revoked, the member one still works.
    page_client(teammate).post(reverse("teams:change_role", args=[team.slug, owner.pk]), {"role": "admin"})
    assert page_client(None).get(owner_link).status_code == 404
    assert join(page_client(None), member_link).status_code == 302
    assert _role(team, get_user_model().objects.get(username="newcomer")) == Role.MEMBER
    # Made an owner's invitation, then lost the role outside the roster (the Django admin): void when accepted.
    page_client(teammate).post(reverse("teams:change_role", args=[team.slug, owner.pk]), {"role": "owner"})
    again = make_link(page_client(owner), team, role="owner")
    Membership.objects.filter(user=owner).update(role=Role.ADMIN)
    response = page_client(stranger).post(again)
    assert response.status_code == 403 and "may no longer invite people to Lake team as owner" in text(response)
    assert _role(team, stranger) is None


def test_a_demoted_admins_invitations_are_revoked(page_client, owner, team_admin, team):
    link = make_link(page_client(team_admin), team, role="member")
    other = make_link(page_client(owner), team, role="member")
    page_client(owner).post(reverse("teams:change_role", args=[team.slug, team_admin.pk]), {"role": "member"})
    assert page_client(None).get(link).status_code == 404
    assert page_client(None).get(other).status_code == 200  # others' invitations stay


def test_nobody_is_added_without_accepting(page_client, owner, team, stranger):
    # The old direct add is gone; an invitation by username waits for the person.
    assert page_client(owner).post(f"/teams/{team.slug}/members/", {"username": "stranger", "role": "admin"}).status_code == 404
    make_link(page_client(owner), team, role="member", invitee="stranger")
    assert _role(team, stranger) is None
    mine = page_client(stranger).get(reverse("teams:mine"))
    (invitation,) = mine.context["invitations"]
    assert 'id="my-invitations"' in text(mine) and invitation.team == team
    page_client(stranger).post(reverse("teams:answer_invitation", args=[invitation.pk]), {"decline": "1"})
    assert _role(team, stranger) is None and Invitation.objects.get().revoked_at is not None


def test_inviting_by_name_never_says_whether_the_account_exists(page_client, owner, team, stranger):
    client = page_client(owner)
    pages = {}
    for name in ("stranger", "nobody-by-this-name"):
        response = client.post(reverse("teams:create_invitation", args=[team.slug]), {"role": "member", "invitee": name}, follow=True)
        pages[name] = text(response).replace(name, "NAME")
        pages[name] = pages[name][pages[name].index("<h2>Invite</h2>"):pages[name].index('id="invitation-create"')]
        pages[name] = pages[name].split('value="http://testserver/invite/')[0]  # the link's token differs
    assert pages["stranger"] == pages["nobody-by-this-name"]
    assert Invitation.objects.filter(invitee__in=["stranger", "nobody-by-this-name"]).count() == 2


def test_an_invitation_for_someone_is_for_them_only(page_client, owner, team, stranger, teammate):
    link = make_link(page_client(owner), team, invitee="stranger")
    refused = page_client(teammate).get(link)
    assert refused.status_code == 403
    assert "This invitation is for stranger, not for you: sign in as them, or ask the team for an invitation of your own." in text(refused)
    assert join(page_client(None), link, username="someone-else").status_code == 302  # refused after the form, said on the login page
    assert not get_user_model().objects.filter(username="someone-else").exists()
    assert Invitation.objects.get().used_at is None
    page_client(stranger).post(link)
    assert _role(team, stranger) == Role.MEMBER


def test_an_invitation_to_an_email_address(page_client, owner, team, stranger):
    stranger.email = "Stranger@Example.org"
    stranger.save()
    make_link(page_client(owner), team, role="viewer", invitee="stranger@example.org")
    (invitation,) = page_client(stranger).get(reverse("teams:mine")).context["invitations"]
    page_client(stranger).post(reverse("teams:answer_invitation", args=[invitation.pk]))
    assert _role(team, stranger) == Role.VIEWER
    # A newcomer through the link gets the address the link was sent to.
    link = make_link(page_client(owner), team, invitee="new@example.org")
    assert join(page_client(None), link).status_code == 302
    newcomer = get_user_model().objects.get(username="newcomer")
    assert newcomer.email == "new@example.org" and _role(team, newcomer) == Role.MEMBER
