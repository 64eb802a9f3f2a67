"""Finding 6: an open websocket must not outlive the access that opened it. Revoking a share link
(by the run page, the admin, or deleting it) and removing a member from the team close their
sockets at once; a socket whose access still holds stays open. Real Channels and the Redis layer."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from webapp.dashboard.live import group_name
from webapp.teams import roster
from webapp.teams.models import Membership, ShareLink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]


@pytest.fixture(autouse=True)
def _fresh_channel_layer():
    """Each test runs on an event loop of its own; channels-redis binds its locks to the loop that
    first used them, so each test gets a layer of its own too."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def _open(ws_connect, user, run, query: str = ""):
    communicator, connected = await ws_connect(user, run.pk, query)
    assert connected
    assert (await communicator.receive_json_from(timeout=3))["type"] == "status"
    return communicator


async def _publish(run) -> None:
    await get_channel_layer().group_send(group_name(run.pk), {"type": "run.logs", "lines": [{"id": 1, "message": "secret"}]})


async def _closed_with_4403(communicator) -> bool:
    output = await communicator.receive_output(timeout=3)
    while output["type"] == "websocket.send":  # what was already on its way
        output = await communicator.receive_output(timeout=3)
    return output == {"type": "websocket.close", "code": 4403}


async def _still_receives(communicator, run) -> bool:
    await _publish(run)
    return (await communicator.receive_json_from(timeout=3))["lines"][0]["message"] == "secret"


@pytest.mark.parametrize("how", ["run page", "admin edit", "delete"])
async def test_revoking_a_share_link_closes_its_sockets(ws_connect, make_run, owner, page_client, how):
    run = await database_sync_to_async(make_run)()
    link = await ShareLink.objects.acreate(run=run, created_by=owner)
    other = await ShareLink.objects.acreate(run=run, created_by=owner)
    revoked_viewer = await _open(ws_connect, None, run, f"share={link.token}")
    other_viewer = await _open(ws_connect, None, run, f"share={other.token}")
    owner_viewer = await _open(ws_connect, owner, run)
    assert await _still_receives(revoked_viewer, run)
    await other_viewer.receive_json_from(timeout=3)
    await owner_viewer.receive_json_from(timeout=3)

    if how == "run page":
        client = await database_sync_to_async(page_client)(owner)
        response = await database_sync_to_async(client.post)(f"/share-links/{link.pk}/revoke/")
        assert response.status_code == 302
    elif how == "admin edit":
        from django.utils import timezone

        link.revoked_at = timezone.now()
        await link.asave()
    else:
        await link.adelete()

    assert await _closed_with_4403(revoked_viewer)
    # The other link and the owner see the run as before.
    assert await _still_receives(other_viewer, run)
    assert await _still_receives(owner_viewer, run)
    for communicator in (revoked_viewer, other_viewer, owner_viewer):
        await communicator.disconnect()


async def test_removing_a_member_closes_their_sockets_and_only_theirs(ws_connect, make_run, owner, teammate, viewer, project, team):
    run = await database_sync_to_async(make_run)(project=project, visibility="team")
    removed = await _open(ws_connect, teammate, run)
    staying = await _open(ws_connect, viewer, run)
    assert await _still_receives(removed, run)
    await staying.receive_json_from(timeout=3)

    await database_sync_to_async(roster.remove_member)(owner, team, teammate.pk)

    assert await _closed_with_4403(removed)
    assert await _still_receives(staying, run)
    # Reconnecting is refused as well.
    _, connected = await ws_connect(teammate, run.pk)
    assert not connected
    await staying.disconnect()


async def test_a_member_who_still_may_see_the_run_keeps_the_socket(ws_connect, make_run, owner, teammate, team):
    """Leaving one team does not close a socket on a run the member owns."""
    own_run = await database_sync_to_async(make_run)(owner=teammate)
    communicator = await _open(ws_connect, teammate, own_run)
    await Membership.objects.filter(team=team, user=teammate).adelete()
    assert await _still_receives(communicator, own_run)
    await communicator.disconnect()


async def test_a_change_inside_a_rolled_back_transaction_closes_nothing(ws_connect, make_run, owner, teammate, project, team):
    """The sockets are told after commit: a removal that is rolled back leaves the member connected."""
    from django.db import transaction

    run = await database_sync_to_async(make_run)(project=project, visibility="team")
    communicator = await _open(ws_connect, teammate, run)

    def remove_then_fail() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            Membership.objects.filter(team=team, user=teammate).delete()
            raise RuntimeError("rolled back")

    await database_sync_to_async(remove_then_fail)()
    assert await _still_receives(communicator, run)
    await communicator.disconnect()


async def test_making_a_run_private_closes_teammates_sockets(ws_connect, make_run, owner, teammate, project, page_client):
    run = await database_sync_to_async(make_run)(project=project, visibility="team")
    teammate_viewer = await _open(ws_connect, teammate, run)
    owner_viewer = await _open(ws_connect, owner, run)
    client = await database_sync_to_async(page_client)(owner)
    response = await database_sync_to_async(client.post)(f"/runs/{run.pk}/edit/", {"visibility": "private", "tags": "", "notes": ""})
    assert response.status_code == 302
    assert await _closed_with_4403(teammate_viewer)
    assert await _still_receives(owner_viewer, run)
    await owner_viewer.disconnect()
