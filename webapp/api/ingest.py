"""Reports of external runs (trained elsewhere, sent over the API) take the workers' path: the
same metric store and log recorder write them, and the same channel-layer publishing pushes them
to live viewers."""

from __future__ import annotations

from typing import Any

from webapp.dashboard import live
from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run
from webapp.runs.recording import RunRecorder


def record_metrics(run: Run, steps: list[dict[str, Any]]) -> int:
    """``[{"step": 1, "metrics": {"reward": 0.5}}, ...]`` -> stored and published. Returns the point count."""
    points = [(key, item["step"], value) for item in steps for key, value in item["metrics"].items()]
    SeriesWriter(run.pk).write(points)
    for item in steps:
        live.publish_metrics(run.pk, item["step"], item["metrics"])
    run.heartbeat()
    return len(points)


def record_logs(run: Run, lines: list[dict[str, Any]]) -> int:
    recorder = RunRecorder(run.pk)
    for line in lines:
        recorder.add_log(line.get("level", "INFO"), line["message"])
    recorder.flush()  # also publishes the stored lines
    run.heartbeat()
    return len(lines)
