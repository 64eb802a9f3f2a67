"""Teams managed from their pages: start a team, invite people by username (who accept), change
roles, remove, leave, add projects. Owners and admins manage; only owners touch owners; a team
keeps an owner."""

from __future__ import annotations

from webapp.teams.models import Membership, Project, Team

Role = Membership.Role


def _role(team, user) -> str | None:
    return Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()


def _messages(response) -> str:
    return " ".join(str(m) for m in response.context["messages"]) if response.context else ""


def test_anyone_signed_in_starts_a_team_and_owns_it(stranger, page_client):
    client = page_client(stranger)
    response = client.post("/teams/new/", {"name": "Lake team"}, follow=True)
    team = Team.objects.get(memberships__user=stranger)
    assert team.slug == "lake-team" and _role(team, stranger) == Role.OWNER
    assert response.request["PATH_INFO"] == f"/teams/{team.slug}/" and "owner" in response.content.decode()
    client.post("/teams/new/", {"name": "Lake team"})  # the same name again: a slug of its own
    assert sorted(Team.objects.values_list("slug", flat=True)) == ["lake-team", "lake-team-2"]
    assert page_client(None).post("/teams/new/", {"name": "x"}).status_code == 302  # to the login


def _invite(client, team, invitee: str, role: str = "member"):
    return client.post(f"/teams/{team.slug}/invitations/", {"invitee": invitee, "role": role}, follow=True)


def _accept_on_teams_page(client) -> None:
    (invitation,) = client.get("/teams/").context["invitations"]
    client.post(f"/invitations/{invitation.pk}/answer/")


def test_an_owner_invites_by_username_the_person_accepts_and_gets_a_role(team, owner, stranger, page_client):
    client = page_client(owner)
    _invite(client, team, "stranger", "viewer")
    assert _role(team, stranger) is None  # nobody is in a team without accepting
    _accept_on_teams_page(page_client(stranger))
    assert _role(team, stranger) == Role.VIEWER
    client.post(f"/teams/{team.slug}/members/{stranger.pk}/role/", {"role": "admin"})
    assert _role(team, stranger) == Role.ADMIN
    page = client.get(f"/teams/{team.slug}/").content.decode()
    assert 'id="member-stranger"' in page and 'id="invitation-create"' in page and 'id="project-add"' in page


def test_bad_invitation_input_is_said_and_changes_nothing(team, owner, page_client):
    from webapp.teams.models import Invitation

    response = _invite(page_client(owner), team, "stranger", "boss")
    assert "role: Select a valid choice" in _messages(response)
    response = _invite(page_client(owner), team, "x" * 255)
    assert "invitee: Ensure this value has at most 254 characters" in _messages(response)
    assert not Invitation.objects.exists()


def test_an_admin_manages_members_but_not_owners(team, owner, teammate, stranger, page_client):
    admin = stranger
    Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    client = page_client(admin)
    client.post(f"/teams/{team.slug}/members/{teammate.pk}/role/", {"role": "viewer"})
    assert _role(team, teammate) == Role.VIEWER
    for path, data in ((f"/teams/{team.slug}/members/{teammate.pk}/role/", {"role": "owner"}),
                       (f"/teams/{team.slug}/members/{owner.pk}/role/", {"role": "member"}),
                       (f"/teams/{team.slug}/members/{owner.pk}/remove/", {})):
        response = client.post(path, data, follow=True)
        assert "Only an owner can make, unmake or remove an owner." in _messages(response), path
    assert _role(team, owner) == Role.OWNER and _role(team, teammate) == Role.VIEWER


def test_members_and_viewers_see_the_team_but_cannot_change_it(team, teammate, viewer, stranger, page_client):
    for user in (teammate, viewer):
        client = page_client(user)
        page = client.get(f"/teams/{team.slug}/").content.decode()
        assert 'id="team-members"' in page and 'id="invitation-create"' not in page
        assert client.post(f"/teams/{team.slug}/invitations/", {"invitee": "stranger", "role": "member"}).status_code == 403
        assert client.post(f"/teams/{team.slug}/members/{viewer.pk if user == teammate else teammate.pk}/remove/").status_code == 403
        assert client.post(f"/teams/{team.slug}/projects/", {"name": "mine"}).status_code == 403
    assert _role(team, stranger) is None and not Project.objects.filter(name="mine").exists()
    # Outsiders learn nothing about the team, not even that it exists.
    assert page_client(stranger).get(f"/teams/{team.slug}/").status_code == 404
    assert page_client(stranger).post(f"/teams/{team.slug}/invitations/", {"invitee": "stranger", "role": "owner"}).status_code == 404


def test_a_team_keeps_an_owner(team, owner, teammate, page_client):
    client = page_client(owner)
    for path, data in ((f"/teams/{team.slug}/members/{owner.pk}/role/", {"role": "admin"}),
                       (f"/teams/{team.slug}/members/{owner.pk}/remove/", {})):
        response = client.post(path, data, follow=True)
        assert "needs an owner: make someone else owner first" in _messages(response)
    assert _role(team, owner) == Role.OWNER
    client.post(f"/teams/{team.slug}/members/{teammate.pk}/role/", {"role": "owner"})
    response = client.post(f"/teams/{team.slug}/members/{owner.pk}/remove/", follow=True)  # now the owner may leave
    assert _role(team, owner) is None and response.request["PATH_INFO"] == "/teams/"


def test_a_member_may_leave(team, teammate, page_client):
    page_client(teammate).post(f"/teams/{team.slug}/members/{teammate.pk}/remove/")
    assert _role(team, teammate) is None


def test_projects_are_added_by_managers_and_named_once(team, owner, page_client):
    client = page_client(owner)
    client.post(f"/teams/{team.slug}/projects/", {"name": "countdown", "description": "arithmetic"})
    assert Project.objects.filter(team=team, name="countdown", description="arithmetic").exists()
    response = client.post(f"/teams/{team.slug}/projects/", {"name": "countdown"}, follow=True)
    assert "already has a project named 'countdown'" in _messages(response)
    response = client.post(f"/teams/{team.slug}/projects/", {"name": "not a slug!"}, follow=True)
    assert "name:" in _messages(response) and Project.objects.filter(team=team).count() == 2


def test_someone_who_accepts_an_invitation_sees_the_teams_runs(team, project, owner, stranger, make_run, page_client):
    run = make_run(name="team run", project=project, visibility="team")
    assert page_client(stranger).get(f"/runs/{run.pk}/").status_code == 404
    _invite(page_client(owner), team, "stranger", "viewer")
    assert page_client(stranger).get(f"/runs/{run.pk}/").status_code == 404
    _accept_on_teams_page(page_client(stranger))
    assert page_client(stranger).get(f"/runs/{run.pk}/").status_code == 200
