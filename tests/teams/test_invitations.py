"""Joining a team by link (single-use, expiring, revocable; the invitee sets a password), and
sign-up, which stays closed unless an administrator opens it."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from webapp.teams.models import Invitation, Membership


def make_link(client, team, role="member") -> str:
    response = client.post(reverse("teams:create_invitation", args=[team.slug]), {"role": role})
    assert response.status_code == 302
    page = client.get(reverse("teams:detail", args=[team.slug]))
    link = page.context["new_invitation"]["url"]
    assert link in page.content.decode()
    assert client.get(reverse("teams:detail", args=[team.slug])).context["new_invitation"] is None  # shown once
    return link.removeprefix("http://testserver")


def join(client, link, username="newcomer", password="a long passphrase"):
    return client.post(link, {"username": username, "password1": password, "password2": password})


def test_an_invitee_sets_a_password_joins_and_logs_in(page_client, owner, team, client):
    link = make_link(page_client(owner), team, role="viewer")
    token = link.rstrip("/").rsplit("/", 1)[1]
    assert not Invitation.objects.filter(token_hash=token).exists()  # only its hash is stored
    assert "Join Lake team" in client.get(link).content.decode()
    response = join(client, link)
    assert response.status_code == 302 and response["Location"] == reverse("teams:detail", args=[team.slug])
    user = get_user_model().objects.get(username="newcomer")
    assert Membership.objects.get(team=team, user=user).role == "viewer"
    assert client.get(reverse("runs:list")).status_code == 200  # logged in
    fresh = page_client(None)  # the password they chose logs them in through the login form
    assert fresh.post(reverse("login"), {"username": "newcomer", "password": "a long passphrase"}).status_code == 302
    assert fresh.get(reverse("runs:list")).status_code == 200
    # Single use: the link is dead now, for anyone.
    assert page_client(None).get(link).status_code == 404
    assert join(page_client(None), link, username="second").status_code == 404
    assert not get_user_model().objects.filter(username="second").exists()


def test_expired_and_revoked_links_do_not_work(page_client, owner, team):
    client = page_client(owner)
    expired = make_link(client, team)
    Invitation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert page_client(None).get(expired).status_code == 404
    revoked = make_link(client, team)
    invitation = Invitation.objects.get(expires_at__gt=timezone.now())
    client.post(reverse("teams:revoke_invitation", args=[invitation.pk]))
    assert join(page_client(None), revoked).status_code == 404
    assert not get_user_model().objects.filter(username="newcomer").exists()


def test_a_bad_password_keeps_the_link_usable(page_client, owner, team, client):
    link = make_link(page_client(owner), team)
    response = client.post(link, {"username": "newcomer", "password1": "short", "password2": "short"})
    assert response.status_code == 200 and response.context["form"].errors["password2"]
    assert join(client, link).status_code == 302


def test_a_logged_in_person_joins_as_themselves(page_client, owner, team, stranger):
    link = make_link(page_client(owner), team)
    client = page_client(stranger)
    assert "Join as stranger" in client.get(link).content.decode()
    client.post(link)
    assert Membership.objects.get(team=team, user=stranger).role == "member"


def test_who_may_invite(page_client, owner, teammate, team, stranger):
    url = reverse("teams:create_invitation", args=[team.slug])
    page_client(teammate).post(url, {"role": "member"})  # members do not manage the team
    assert page_client(stranger).post(url, {"role": "member"}).status_code == 404
    assert not Invitation.objects.exists()
    admin = get_user_model().objects.create_user("team-admin", password="x" * 12)
    Membership.objects.create(team=team, user=admin, role="admin")
    page_client(admin).post(url, {"role": "owner"})  # only owners make owners
    assert not Invitation.objects.exists()
    page_client(admin).post(url, {"role": "member"})
    assert Invitation.objects.count() == 1


def test_sign_up_is_closed_unless_the_admin_opens_it(client, settings, db):
    assert client.get(reverse("teams:signup")).status_code == 404
    assert "Sign up" not in client.get(reverse("login")).content.decode()
    settings.SIGNUP_OPEN = True
    assert 'id="signup-link"' in client.get(reverse("login")).content.decode()
    response = client.post(reverse("teams:signup"), {"username": "walk-in", "password1": "a long passphrase",
                                                     "password2": "a long passphrase"})
    assert response.status_code == 302
    assert client.get(reverse("teams:mine")).status_code == 200
    assert not get_user_model().objects.get(username="walk-in").is_staff
