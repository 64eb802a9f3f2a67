"""The episode writer never holds its run's row while the artifact store takes a step's file: a
store that answers slowly (or not at all, until it is back) must not hold the row the supervisor's
heartbeat updates, or the run is taken for lost while it trains. The store is held mid-write by
the test; the database is real."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from webapp.dashboard import episodes as episode_store
from webapp.dashboard.models import StoredEpisode
from webapp.dashboard.recording import EpisodeWriter
from webapp.runs.models import AttemptSuperseded, Run

pytestmark = pytest.mark.django_db(transaction=True)


def record(position: int) -> dict:
    return {"split": "train", "position": position, "reward": 1.0, "prompt": "x", "response": "y"}


def test_a_slow_store_does_not_hold_the_runs_row(make_run, monkeypatch, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run()
    assert run.claim("w@host")
    in_store, release = threading.Event(), threading.Event()
    store = episode_store.artifacts.store()

    class SlowStore:
        def put_bytes(self, *args, **kwargs):
            in_store.set()
            assert release.wait(60)
            return store.put_bytes(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(store, name)

    monkeypatch.setattr(episode_store.artifacts, "store", SlowStore)
    writer = EpisodeWriter(run.pk, flush_seconds=3600, attempt=run.attempts)
    writer.store(1, [record(0), record(1)])
    flushing = threading.Thread(target=writer.flush)
    flushing.start()
    try:
        assert in_store.wait(60)
        with transaction.atomic():  # the heartbeat, while the store is busy with the step's file
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '5s'")
            assert run.heartbeat()
    finally:
        release.set()
        flushing.join(60)
        writer.close()
    assert StoredEpisode.objects.filter(run=run, step=1).count() == 2


def test_an_attempt_that_no_longer_holds_the_run_writes_no_file(make_run, monkeypatch, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run()
    assert run.claim("w@host")
    written = []

    class Store:
        def put_bytes(self, data, key):
            written.append(key)

    monkeypatch.setattr(episode_store.artifacts, "store", Store)
    writer = EpisodeWriter(run.pk, flush_seconds=3600, attempt=run.attempts)
    writer.store(1, [record(0)])
    Run.objects.filter(pk=run.pk).update(attempts=run.attempts + 1, heartbeat_at=Now())  # taken over
    with pytest.raises(AttemptSuperseded):
        writer.flush()
    writer.close()
    assert written == [] and not StoredEpisode.objects.filter(run=run).exists()
