"""A run's metric points are written in batches to the metric store (a re-sent point replaces,
never doubles, and the run's row carries each key's latest value); its log lines are capped."""

import logging
import math

from webapp.dashboard import series
from webapp.dashboard.recording import DashboardSink
from webapp.runs.models import Run, RunLog
from webapp.runs.recording import DatabaseSink, RunLogHandler, RunRecorder


def test_points_are_batched_and_upserted(make_run):
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False)  # flushes only when asked
    DatabaseSink(RunRecorder(run.pk)).log_metrics(1, {"reward": 9.0})  # logs only: points are stored once, below
    sink.log_metrics(1, {"reward": 0.25, "loss": 1.0})
    sink.log_metrics(2, {"reward": 0.5})
    assert series.points_after(run.pk, -1) == {}, "nothing is written before a flush"
    sink.flush()
    sink.log_metrics(2, {"reward": 0.75})  # re-sent after a flush
    sink.close()
    assert series.points_after(run.pk, -1) == {"loss": [[1, 1.0]], "reward": [[1, 0.25], [2, 0.75]]}
    run = Run.objects.get(pk=run.pk)
    assert run.steps == 2 and run.latest_metrics() == {"reward": 0.75, "loss": 1.0} and run.metrics_at


def test_nan_is_stored_as_null(make_run):
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False)
    sink.log_metrics(1, {"kl": math.nan, "loss": math.inf})
    sink.close()
    assert series.points_after(run.pk, -1) == {"kl": [[1, None]], "loss": [[1, None]]}
    assert Run.objects.get(pk=run.pk).latest_values == {"kl": None, "loss": None}


def test_log_lines_are_recorded_and_capped(make_run):
    run = make_run()
    recorder = RunRecorder(run.pk, max_log_lines=3)
    logger = logging.getLogger("training.test-recording")
    handler = RunLogHandler(recorder)
    logger.addHandler(handler)
    try:
        for i in range(5):
            logger.warning("line %d", i)
    finally:
        logger.removeHandler(handler)
    recorder.close()
    messages = list(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert messages[:2] == ["line 0", "line 1"] and "truncated" in messages[2] and len(messages) == 3
