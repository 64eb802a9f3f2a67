"""A run page opened while the run waited for a worker learns when and where it started: the
live status carries ``started_at`` and ``worker``, and the page has the places to show them
(tests/browser/test_run_started.py watches them change in a browser)."""

import pytest
from channels.db import database_sync_to_async

from webapp.runs.models import Run
from workers.execute import claim

pytestmark = pytest.mark.django_db(transaction=True)


async def _receive_status(communicator, timeout: float = 10) -> dict:
    while True:
        message = await communicator.receive_json_from(timeout=timeout)
        if message["type"] == "status":
            return message


async def test_the_live_status_says_when_and_where_the_run_started(ws_connect, make_run, owner):
    run = await database_sync_to_async(make_run)()
    communicator, connected = await ws_connect(owner, run.pk)
    assert connected
    opening = await _receive_status(communicator)
    assert (opening["status"], opening["started_at"], opening["worker"]) == ("queued", None, "")

    await database_sync_to_async(claim)(run.pk, "cpu-worker-7")
    status = await _receive_status(communicator)
    started = (await database_sync_to_async(Run.objects.get)(pk=run.pk)).started_at
    assert status["status"] == "running" and status["worker"] == "cpu-worker-7"
    assert status["started_at"] == started.isoformat()
    await communicator.disconnect()


def test_the_page_marks_the_facts_the_live_status_fills(owner_client, make_run):
    run = make_run()
    page = owner_client.get(run.get_absolute_url()).content.decode()
    assert '<dd id="run-started">—</dd>' in page and '<dd id="run-worker">—</dd>' in page
    claim(run.pk, "cpu-worker-7")
    page = owner_client.get(run.get_absolute_url()).content.decode()
    assert '<dd id="run-worker">cpu-worker-7</dd>' in page
    started = Run.objects.get(pk=run.pk).started_at
    assert f'<dd id="run-started">{started:%Y-%m-%d %H:%M:%S}</dd>' in page
