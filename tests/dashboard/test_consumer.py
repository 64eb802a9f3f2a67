"""The run websocket: who may connect, backlog then live, reconnect from a step."""

import pytest
from channels.layers import get_channel_layer

from webapp.dashboard import consumers
from webapp.dashboard.live import group_name

pytestmark = pytest.mark.django_db(transaction=True)


async def _receive_until(communicator, kind: str, timeout: float = 3):
    while True:
        message = await communicator.receive_json_from(timeout=timeout)
        if message["type"] == kind:
            return message


async def _sync(fn, *args, **kwargs):
    from channels.db import database_sync_to_async

    return await database_sync_to_async(fn)(*args, **kwargs)


async def test_strangers_and_anonymous_are_refused(ws_connect, make_run, stranger):
    run = await _sync(make_run)
    for user in (stranger, None):
        communicator, connected = await ws_connect(user, run.pk)
        assert not connected
    _, connected = await ws_connect(stranger, 999_999)
    assert not connected


async def test_backlog_then_live_points(ws_connect, make_run, owner, store):
    run = await _sync(make_run)
    await _sync(store, run, {"reward": [(1, 0.1), (2, 0.2)], "loss": [(1, 1.0), (2, 0.9)]})
    communicator, connected = await ws_connect(owner, run.pk)
    assert connected
    status = await communicator.receive_json_from(timeout=3)
    assert isinstance(status.pop("seq"), int)  # the live messages' number (tests/dashboard/test_live_sequences.py)
    assert status == {"type": "status", "status": "queued", "steps": 2, "error": "",  # the store keeps the steps
                      "started_at": None, "worker": "", "attempts": 0}
    backlog = await _receive_until(communicator, "metrics")
    assert backlog["points"] == {"loss": [[1, 1.0], [2, 0.9]], "reward": [[1, 0.1], [2, 0.2]]}
    layer = get_channel_layer()
    await layer.group_send(group_name(run.pk), {"type": "run.metrics", "steps": [[2, {"reward": 0.2}], [3, {"reward": 0.3}]]})
    live = await _receive_until(communicator, "metrics")
    assert live["points"] == {"reward": [[3, 0.3]]}  # step 2 came with the backlog: no duplicate
    await layer.group_send(group_name(run.pk), {"type": "run.status", "status": "running", "steps": 3})
    assert (await _receive_until(communicator, "status"))["status"] == "running"
    await layer.group_send(group_name(run.pk), {"type": "run.logs", "lines": [{"id": 9, "time": "t", "level": "INFO", "message": "hi"}]})
    assert (await _receive_until(communicator, "logs"))["lines"][0]["message"] == "hi"
    await communicator.disconnect()


async def test_reconnect_from_a_step_sends_only_what_is_missing(ws_connect, make_run, owner, store):
    run = await _sync(make_run)
    await _sync(store, run, {"reward": [(s, s / 10) for s in range(1, 11)]})
    communicator, connected = await ws_connect(owner, run.pk, "after=7")
    assert connected
    backlog = await _receive_until(communicator, "metrics")
    assert backlog["points"] == {"reward": [[8, 0.8], [9, 0.9], [10, 1.0]]}
    await communicator.disconnect()


async def test_points_published_before_joining_but_stored_after_arrive_once(ws_connect, make_run, owner, store, monkeypatch):
    monkeypatch.setattr(consumers, "CATCH_UP_SECONDS", 0.3)
    run = await _sync(make_run)
    await _sync(store, run, {"reward": [(1, 0.1)]})
    communicator, _ = await ws_connect(owner, run.pk, "after=0")
    assert (await _receive_until(communicator, "metrics"))["points"] == {"reward": [[1, 0.1]]}
    # Step 2 was pushed before this viewer joined and reaches the database only now; step 3 comes live.
    await _sync(store, run, {"reward": [(2, 0.2), (3, 0.3)]})
    await get_channel_layer().group_send(group_name(run.pk), {"type": "run.metrics", "steps": [[3, {"reward": 0.3}]]})
    assert (await _receive_until(communicator, "metrics"))["points"] == {"reward": [[3, 0.3]]}
    assert (await _receive_until(communicator, "metrics"))["points"] == {"reward": [[2, 0.2]]}
    assert await communicator.receive_nothing(timeout=0.6)
    await communicator.disconnect()


async def test_a_long_gap_asks_for_a_downsampled_reload(ws_connect, make_run, owner, store, monkeypatch):
    monkeypatch.setattr(consumers, "BACKLOG_LIMIT", 100)
    run = await _sync(make_run)
    await _sync(store, run, {"reward": [(s, 0.0) for s in range(500)]})
    communicator, _ = await ws_connect(owner, run.pk)
    assert (await _receive_until(communicator, "resync"))["last_step"] == 499
    await communicator.disconnect()


async def test_without_a_shared_layer_new_points_come_from_the_database(ws_connect, make_run, owner, store, settings, monkeypatch):
    """The embedded mode: the worker's publishes never reach this process, so the consumer reads
    the database once a second (shortened here)."""
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    monkeypatch.setattr(consumers, "POLL_SECONDS", 0.2)
    try:
        run = await _sync(make_run)
        await _sync(store, run, {"reward": [(1, 0.1)]})
        communicator, connected = await ws_connect(owner, run.pk)
        assert connected
        assert (await _receive_until(communicator, "metrics"))["points"] == {"reward": [[1, 0.1]]}
        await _sync(store, run, {"reward": [(2, 0.2), (3, 0.3)]})
        assert (await _receive_until(communicator, "metrics"))["points"] == {"reward": [[2, 0.2], [3, 0.3]]}
        await _sync(type(run).objects.filter(pk=run.pk).update, status="running")
        status = await _receive_until(communicator, "status")
        while status["status"] != "running":  # the store's write moved the steps first
            status = await _receive_until(communicator, "status")
        assert (status["status"], status["steps"]) == ("running", 3)
        await communicator.disconnect()
    finally:
        channel_layers.backends.clear()


async def test_viewers_of_a_run_share_one_subscription(ws_connect, make_run, owner, store):
    """One group member per run per process, however many viewers; each still gets every event once."""
    run = await _sync(make_run)
    await _sync(store, run, {"reward": [(1, 0.1)]})
    first, _ = await ws_connect(owner, run.pk, "after=0")
    second, _ = await ws_connect(owner, run.pk, "after=0")
    for communicator in (first, second):
        assert (await _receive_until(communicator, "metrics"))["points"] == {"reward": [[1, 0.1]]}
    hubs = [hub for hub in consumers.RunHub._hubs.values() if hub.run_id == run.pk]
    assert len(hubs) == 1 and len(hubs[0].viewers) == 2
    await get_channel_layer().group_send(group_name(run.pk), {"type": "run.metrics", "steps": [[2, {"reward": 0.2}]]})
    for communicator in (first, second):
        assert (await _receive_until(communicator, "metrics"))["points"] == {"reward": [[2, 0.2]]}
        assert await communicator.receive_nothing(timeout=0.2)
    await first.disconnect()
    await second.disconnect()
    assert not [hub for hub in consumers.RunHub._hubs.values() if hub.run_id == run.pk]


async def test_after_the_catch_up_live_steps_are_not_kept_per_viewer(ws_connect, make_run, owner, store, monkeypatch):
    """A long run must not grow a set of sent steps in every viewer: once caught up, only the
    highest sent step is kept, and a re-sent step is still dropped."""
    monkeypatch.setattr(consumers, "CATCH_UP_SECONDS", 0.1)
    monkeypatch.setattr(consumers, "POLL_SECONDS", 0.1)
    run = await _sync(make_run)
    await _sync(store, run, {"reward": [(1, 0.1)]})
    communicator, _ = await ws_connect(owner, run.pk)
    await _receive_until(communicator, "metrics")
    await communicator.receive_nothing(timeout=0.4)  # the catch-up read has run
    layer = get_channel_layer()
    for step in range(2, 50):
        await layer.group_send(group_name(run.pk), {"type": "run.metrics", "steps": [[step, {"reward": step / 100}]]})
    received = []
    while len(received) < 48:
        message = await _receive_until(communicator, "metrics")
        received.extend(step for step, _ in message["points"]["reward"])
    assert received == list(range(2, 50))
    await layer.group_send(group_name(run.pk), {"type": "run.metrics", "steps": [[30, {"reward": 9.9}]]})
    assert await communicator.receive_nothing(timeout=0.4)
    viewers = [viewer for (_, run_id), hub in consumers.RunHub._hubs.items() if run_id == run.pk for viewer in hub.viewers]
    assert viewers and all(not viewer.live_steps and viewer.sent_through == 49 for viewer in viewers)
    await communicator.disconnect()


async def test_a_share_links_token_opens_its_runs_websocket_until_revoked(make_run, owner, ws_connect):
    from webapp.teams.models import ShareLink

    run, other = (await _sync(make_run, name="shared"), await _sync(make_run, name="not shared"))
    link = await _sync(ShareLink.objects.create, run=run, created_by=owner)
    communicator, connected = await ws_connect(None, run.pk, f"share={link.token}")
    assert connected and (await communicator.receive_json_from(timeout=3))["type"] == "status"
    await communicator.disconnect()
    for run_id, query in ((other.pk, f"share={link.token}"), (run.pk, "share=not-a-token"), (run.pk, "")):
        _, connected = await ws_connect(None, run_id, query)
        assert not connected, (run_id, query)
    await _sync(link.revoke)
    _, connected = await ws_connect(None, run.pk, f"share={link.token}")
    assert not connected
