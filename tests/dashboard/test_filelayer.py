"""The embedded mode's channel layer: channels and groups shared by processes through files."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
from channels.exceptions import ChannelFull

from webapp.dashboard.filelayer import FileChannelLayer


@pytest.fixture
def layer(tmp_path):
    return FileChannelLayer(str(tmp_path / "channels"))


async def test_messages_arrive_once_in_the_order_sent(layer):
    channel = await layer.new_channel()
    layer.require_valid_channel_name(channel)
    for n in range(3):
        await layer.send(channel, {"type": "x", "n": n})
    assert [(await layer.receive(channel))["n"] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(channel), 0.2)


async def test_two_readers_of_one_channel_never_get_the_same_message(layer):
    channel = await layer.new_channel()
    for n in range(20):
        await layer.send(channel, {"n": n})
    first, second = await asyncio.gather(*(asyncio.gather(*(layer.receive(channel) for _ in range(10))) for _ in range(2)))
    assert sorted(m["n"] for m in first + second) == list(range(20))


async def test_a_full_channel_refuses_and_a_non_json_message_is_not_written(tmp_path):
    layer = FileChannelLayer(str(tmp_path), capacity=2)
    channel = await layer.new_channel()
    await layer.send(channel, {"n": 1})
    await layer.send(channel, {"n": 2})
    with pytest.raises(ChannelFull):
        await layer.send(channel, {"n": 3})
    other = await layer.new_channel()
    with pytest.raises(TypeError):
        await layer.send(other, {"when": object()})
    assert not os.listdir(tmp_path / "channels" / other) and not os.listdir(tmp_path / "tmp")


async def test_group_send_reaches_the_members_only(layer):
    a, b, outsider = [await layer.new_channel() for _ in range(3)]
    await layer.group_add("run-1", a)
    await layer.group_add("run-1", b)
    await layer.group_add("run-2", outsider)
    await layer.group_send("run-1", {"type": "hello"})
    assert await layer.receive(a) == {"type": "hello"} and await layer.receive(b) == {"type": "hello"}
    await layer.group_discard("run-1", b)
    await layer.group_send("run-1", {"type": "again"})
    assert await layer.receive(a) == {"type": "again"}
    for channel in (b, outsider):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(channel), 0.2)


async def test_expired_messages_are_dropped_and_a_member_that_stopped_reading_leaves(tmp_path):
    layer = FileChannelLayer(str(tmp_path), expiry=1)
    reader, gone = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("run-1", reader)
    await layer.group_add("run-1", gone)
    await layer.group_send("run-1", {"n": 1})
    await asyncio.sleep(1.1)
    with pytest.raises(asyncio.TimeoutError):  # older than expiry: never delivered
        await asyncio.wait_for(layer.receive(reader), 0.2)
    await layer.group_send("run-1", {"n": 2})  # ``gone`` still holds an expired message: it leaves
    assert os.listdir(tmp_path / "groups" / "run-1") == [reader]
    assert await layer.receive(reader) == {"n": 2}


async def test_flush_empties_channels_and_groups(layer):
    channel = await layer.new_channel()
    await layer.group_add("run-1", channel)
    await layer.group_send("run-1", {"n": 1})
    await layer.flush()
    await layer.group_send("run-1", {"n": 2})
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(channel), 0.2)


def _publish_from_another_process(var_dir, run_id: int, steps: list[int]) -> None:
    """A process configured as the embedded mode's worker is (no REDIS_URL) publishes steps of a run."""
    code = textwrap.dedent(f"""
        import django
        django.setup()
        from webapp.dashboard import live
        for step in {steps!r}:
            live.publish_metrics({run_id}, step, {{"reward": step / 10}})
        live.publisher().flush()
    """)
    env = {**os.environ, "REDIS_URL": "", "PLATFORM_VAR_DIR": str(var_dir), "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


async def test_another_process_publishes_to_this_one(tmp_path):
    """The embedded settings pick this layer, and a worker process's publish reaches the web process."""
    layer = FileChannelLayer(str(tmp_path / "channels"))
    channel = await layer.new_channel()
    await layer.group_add("run-7", channel)
    await asyncio.to_thread(_publish_from_another_process, tmp_path, 7, [1, 2])
    steps: list[int] = []
    while len(steps) < 2:  # the publisher may merge the two steps into one message
        message = await asyncio.wait_for(layer.receive(channel), 5)
        assert message["type"] == "run.metrics"
        steps += [step for step, _ in message["steps"]]
    assert steps == [1, 2]


@pytest.mark.django_db(transaction=True)
async def test_the_run_websocket_pushes_a_worker_process_publish_in_embedded_mode(ws_connect, make_run, owner, settings,
                                                                                  tmp_path):
    """The consumer on the file layer: points a separate process publishes (and never stores) arrive
    over the websocket, so they came through the layer, not from the database."""
    from channels.db import database_sync_to_async
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "webapp.dashboard.filelayer.FileChannelLayer",
                                           "CONFIG": {"path": str(tmp_path / "channels")}}}
    channel_layers.backends.clear()
    try:
        run = await database_sync_to_async(make_run)()
        communicator, connected = await ws_connect(owner, run.pk)
        assert connected
        await asyncio.to_thread(_publish_from_another_process, tmp_path, run.pk, [1, 2, 3])
        points: list = []
        while len(points) < 3:
            message = await communicator.receive_json_from(timeout=5)
            if message["type"] == "metrics":
                points += message["points"]["reward"]
        assert points == [[1, 0.1], [2, 0.2], [3, 0.3]]
        await communicator.disconnect()
    finally:
        channel_layers.backends.clear()
