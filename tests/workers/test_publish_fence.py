"""``Fence.holding``: an attempt publishes a checkpoint or its final model (a rename into the run's
folder) inside a transaction that holds the run's row lock, so a takeover, which updates that
row, cannot happen between the ownership check and the rename; once taken over, nothing is
published. Real Postgres: the takeover is a second connection's update."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection, transaction
from django.db.models import F

from training.errors import OwnerUnknown
from webapp.runs.models import Run
from workers.execute import claim
from workers.lifecycle import Fence

pytestmark = pytest.mark.django_db(transaction=True)  # the fence works in its own thread's connection


def take_over_now(run_id: int) -> int:
    """Another worker's takeover, refused at once when the row is locked."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '100ms'")
        return Run.objects.filter(pk=run_id).update(attempts=F("attempts") + 1, worker="another-worker")


def test_no_takeover_slips_between_the_check_and_the_rename_and_after_it_nothing_is_published(make_run, tmp_path):
    run = claim(make_run().pk, "w")
    fence = Fence(run)
    inside, release, answers = threading.Event(), threading.Event(), []

    def publish() -> None:  # the rename, held open
        inside.set()
        release.wait(30)
        (tmp_path / "published").mkdir()

    def hold() -> None:
        try:
            answers.append(fence.holding(publish))
        finally:
            connection.close()  # this thread's own connection

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    with pytest.raises(OperationalError, match="lock"):
        take_over_now(run.pk)  # the row is locked while the attempt publishes
    release.set()
    holder.join(30)
    assert answers == [True] and (tmp_path / "published").is_dir()

    assert take_over_now(run.pk) == 1
    published = []
    assert fence.holding(lambda: published.append("stale")) is False
    assert published == [] and fence.lost


def test_with_the_database_away_the_owner_is_unknown_and_nothing_is_published(make_run, monkeypatch):
    run = claim(make_run().pk, "w")
    fence = Fence(run)

    def unreachable(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("workers.lifecycle.lock_for_attempt", unreachable)
    published = []
    with pytest.raises(OwnerUnknown):
        fence.holding(lambda: published.append("checkpoint"))
    assert published == [] and not fence.lost
