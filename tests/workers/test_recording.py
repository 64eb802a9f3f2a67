"""The database sink writes metric points in batches; a re-sent point replaces, never doubles."""

import logging
import math

from webapp.runs.models import MetricPoint, Run, RunLog
from webapp.runs.recording import DatabaseSink, RunLogHandler, RunRecorder


def test_points_are_batched_and_upserted(make_run):
    run = make_run()
    recorder = RunRecorder(run.pk)  # not started: flushes only when asked
    sink = DatabaseSink(recorder)
    sink.log_metrics(1, {"reward": 0.25, "loss": 1.0})
    sink.log_metrics(2, {"reward": 0.5})
    assert MetricPoint.objects.count() == 0, "nothing is written before a flush"
    sink.close()
    sink.log_metrics(2, {"reward": 0.75})  # re-sent after a flush
    recorder.close()
    points = {(p.key, p.step): p.value for p in MetricPoint.objects.filter(run=run)}
    assert points == {("reward", 1): 0.25, ("loss", 1): 1.0, ("reward", 2): 0.75}
    assert Run.objects.get(pk=run.pk).steps == 2


def test_nan_is_stored_as_null(make_run):
    run = make_run()
    recorder = RunRecorder(run.pk)
    recorder.add_metrics(1, {"kl": math.nan})
    recorder.close()
    assert MetricPoint.objects.get(run=run).value is None


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
