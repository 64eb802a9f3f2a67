"""Live metric messages are numbered per run, by a counter every publishing process shares, and
the websocket's opening status says where the numbers stand."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from channels.layers import get_channel_layer

from webapp.dashboard import live
from webapp.dashboard.live import group_name


class RecordingLayer:
    """A channel layer that keeps what it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def group_send(self, group, message) -> None:
        await asyncio.sleep(0)
        self.sent.append(message)


def _numbers(*layers: RecordingLayer) -> list[int]:
    return sorted(message["seq"] for layer in layers for message in layer.sent if message["type"] == "run.metrics")


@pytest.fixture
def redis_run_id(settings):
    """A run id whose Redis counter starts empty and is removed afterwards (no Run row is needed)."""
    import redis

    run_id = random.randrange(10**9, 2 * 10**9)
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(live.RedisSequences.key(run_id))
    yield run_id
    client.delete(live.RedisSequences.key(run_id))


@pytest.mark.redis
def test_two_publishers_of_a_run_number_its_messages_contiguously(redis_run_id):
    assert isinstance(live.sequences(), live.RedisSequences)  # REDIS_URL set: the counter is Redis's
    first_layer, second_layer = RecordingLayer(), RecordingLayer()
    first, second = live.Publisher(first_layer), live.Publisher(second_layer)
    for step in range(1, 41):  # both send at once, as a worker and a web process taking API reports do
        (first if step % 2 else second).publish(redis_run_id, {"type": "run.metrics", "steps": [[step, {"reward": 0.0}]]})
    first.publish(redis_run_id, {"type": "run.status", "status": "running", "steps": 40})
    first.flush()
    second.flush()
    numbers = _numbers(first_layer, second_layer)
    sent = [m for layer in (first_layer, second_layer) for m in layer.sent if m["type"] == "run.metrics"]
    # Each message sent got one number (events queued together are merged into one message first),
    # no number twice, none skipped, and only metric messages are numbered.
    assert numbers == list(range(1, len(sent) + 1))
    assert sorted(step for m in sent for step, _ in m["steps"]) == list(range(1, 41))
    assert not any("seq" in m for m in first_layer.sent if m["type"] != "run.metrics")
    assert live.sequences().current(redis_run_id) == len(sent)


# One counting process: it says it is ready, waits for the go file, then takes numbers. Separate
# interpreters, not forks: a fork of the test process can inherit a lock held by one of its threads.
COUNTER = """
import json, sys, time
from pathlib import Path
from webapp.dashboard.live import FileSequences
folder, times = sys.argv[1], int(sys.argv[2])
counter = FileSequences(folder)
print("ready", flush=True)
while not (Path(folder) / "go").exists():
    time.sleep(0.01)
print(json.dumps([counter.next(7) for _ in range(times)]), flush=True)
"""


def test_the_file_counter_is_shared_by_processes(tmp_path):
    """The embedded mode's counter (no Redis): processes taking numbers at once never get the same one."""
    root = Path(__file__).resolve().parents[2]
    processes = [subprocess.Popen([sys.executable, "-c", COUNTER, str(tmp_path), "300"], cwd=root,
                                  stdout=subprocess.PIPE, text=True) for _ in range(3)]
    for process in processes:
        assert process.stdout.readline().strip() == "ready"
    (tmp_path / "go").touch()
    taken = sorted(n for process in processes for n in json.loads(process.communicate(timeout=60)[0]))
    assert taken == list(range(1, 901))
    assert live.FileSequences(tmp_path).current(7) == 900 and live.FileSequences(tmp_path).current(8) == 0


async def _sync(fn, *args, **kwargs):
    from channels.db import database_sync_to_async

    return await database_sync_to_async(fn)(*args, **kwargs)


async def _next_metrics(communicator) -> dict:
    while True:
        message = await communicator.receive_json_from(timeout=3)
        if message["type"] == "metrics":
            return message


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
async def test_the_opening_status_carries_the_current_number(ws_connect, make_run, owner, store):
    run = await _sync(make_run)
    await _sync(store, run, {"reward": [(1, 0.1)]})
    before = live.sequences().current(run.pk)  # a run id may be reused by a later test database
    earlier = live.Publisher(RecordingLayer())  # messages no viewer got
    for step in (1, 2, 3):
        earlier.publish(run.pk, {"type": "run.metrics", "steps": [[step, {"reward": 0.0}]]})
    await asyncio.to_thread(earlier.flush)
    current = live.sequences().current(run.pk)

    communicator, connected = await ws_connect(owner, run.pk, "after=0")
    assert connected
    opening = await communicator.receive_json_from(timeout=3)
    assert opening["type"] == "status" and opening["seq"] == current > before
    assert (await _next_metrics(communicator))["points"] == {"reward": [[1, 0.1]]}  # the backlog: not numbered

    # The next message published through the channel layer comes numbered one past the opening.
    publisher = live.Publisher()
    publisher.publish(run.pk, {"type": "run.metrics", "steps": [[4, {"reward": 0.4}]]})
    await asyncio.to_thread(publisher.flush)
    assert await _next_metrics(communicator) == {"type": "metrics", "points": {"reward": [[4, 0.4]]}, "seq": current + 1}
    # A numbered message whose points the viewer has still says its number: the page counts them all.
    await get_channel_layer().group_send(group_name(run.pk), {"type": "run.metrics", "steps": [[4, {"reward": 0.4}]],
                                                              "seq": current + 2})
    assert await _next_metrics(communicator) == {"type": "metrics", "points": {}, "seq": current + 2}
    # A message numbered at or below the opening was published before the backlog read, which
    # covers it: it comes without a number, so the page does not take it for a gap.
    await get_channel_layer().group_send(group_name(run.pk), {"type": "run.metrics", "steps": [[5, {"reward": 0.5}]],
                                                              "seq": current})
    assert await _next_metrics(communicator) == {"type": "metrics", "points": {"reward": [[5, 0.5]]}}
    await communicator.disconnect()
