"""A reader of the metric store sees it at one moment: a fold (the run's tail moved into blocks, as
at its end) committed while a reader is between its queries hides no point from it. The fold runs
for real, in another thread with its own connection, between the reader's first and second query."""

import threading

import pytest

from webapp.dashboard import series

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 40


def fold_between_the_reads(monkeypatch, run_id: int, after: int) -> list[str]:
    """After the reader's query number ``after``, the run's tail is folded (and committed) elsewhere."""
    fetch = series._fetch_bytes
    done: list[str] = []
    queries = []

    def fetch_then_fold(query):
        rows = fetch(query)
        queries.append(query)
        if len(queries) == after:  # (the fold's own reads come later and pass through)

            def fold() -> None:
                from django.db import connection

                try:
                    done.append(f"folded {series.SeriesWriter(run_id).fold()}")
                finally:
                    connection.close()

            thread = threading.Thread(target=fold)
            thread.start()
            thread.join(30)
        return rows

    monkeypatch.setattr(series, "_fetch_bytes", fetch_then_fold)
    return done


# The points reader makes two queries (blocks, tail); the chart's makes three here (summaries, blocks,
# tail): the fold comes after the second, when a reader without one snapshot has read the blocks.
@pytest.mark.parametrize("reader,after", [("points", 1), ("chart", 2)])
def test_a_fold_between_a_readers_queries_hides_no_point(make_run, store, monkeypatch, reader, after):
    run = make_run()
    store(run, {"reward": [(step, step / 10) for step in range(1, STEPS + 1)]})  # all in the tail, not folded
    done = fold_between_the_reads(monkeypatch, run.pk, after)

    if reader == "points":
        found = [step for step, _ in series.points_after(run.pk, -1)["reward"]]
    else:
        found = series.downsample(run.pk, "reward")["x"]

    assert done == [f"folded {STEPS}"]  # the fold did happen in between
    assert found == list(range(1, STEPS + 1))
    assert [step for step, _ in series.points_after(run.pk, -1)["reward"]] == list(range(1, STEPS + 1))  # and after it
