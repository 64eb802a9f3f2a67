"""Every logged step, once, at every moment after a flush: replayed steps replace their value, and
two writers of one run's series (an attempt resumed beside the one it replaced, reports arriving
over the API at once) never drop each other's points. Before the writer locked the run's row, each
rewrote the open block from its own copy and the last one's copy won: points were lost, not late."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from webapp.dashboard import series
from webapp.dashboard.recording import DashboardSink
from webapp.dashboard.series import SeriesWriter

pytestmark = pytest.mark.django_db(transaction=True)


def stored(run_id: int, key: str = "reward") -> list[int]:
    return [step for step, _ in series.points_after(run_id, -1).get(key, [])]


def test_after_each_flush_the_series_holds_every_logged_step_once(make_run):
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False)
    try:
        for step in range(1, 41):
            sink.log_metrics(step, {"reward": step / 40, "loss": 1.0})
            if step % 7 == 0:
                sink.flush()
                assert stored(run.pk) == list(range(1, step + 1))
        for step in range(30, 41):  # a resumed attempt replays steps after its checkpoint
            sink.log_metrics(step, {"reward": -1.0})
        sink.flush()
        points = series.points_after(run.pk, -1)["reward"]
        assert [s for s, _ in points] == list(range(1, 41))
        assert [v for s, v in points if s >= 30] == [-1.0] * 11
    finally:
        sink.close()


def test_two_writers_of_one_run_keep_each_others_points(make_run):
    run = make_run()
    errors = []
    start = threading.Barrier(2)

    def write(steps: range) -> None:
        writer = SeriesWriter(run.pk)
        try:
            start.wait()
            for step in steps:
                writer.write([("reward", step, float(step))])
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(range(first, 300, 2),)) for first in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert stored(run.pk) == list(range(1, 300))
