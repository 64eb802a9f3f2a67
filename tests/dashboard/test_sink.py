"""The worker's sink: points into series blocks, episodes into the viewer, every step pushed live."""

import asyncio

import pytest

from webapp.dashboard import live, series
from webapp.dashboard.models import EpisodeSample
from webapp.dashboard.recording import DashboardSink


class RecordingLayer:
    def __init__(self):
        self.sent = []

    async def group_send(self, group, message):
        await asyncio.sleep(0)
        self.sent.append((group, message))


@pytest.mark.django_db(transaction=True)
def test_sink_stores_and_publishes(make_run, monkeypatch, episode):
    layer = RecordingLayer()
    publisher = live.Publisher(layer)
    monkeypatch.setattr(live, "_publisher", publisher)
    run = make_run()
    sink = DashboardSink(run.pk, flush_seconds=0.05)
    for step in range(1, 4):
        sink.log_metrics(step, {"reward": step / 10, "loss": float("nan")})
    sink.log_episodes(3, [episode, episode])
    sink.close()
    assert series.points_after(run.pk, 0)["reward"] == [[1, 0.1], [2, 0.2], [3, 0.3]]
    assert series.points_after(run.pk, 0)["loss"][0] == [1, None]
    assert list(EpisodeSample.objects.filter(run=run).values_list("step", "position")) == [(3, 0), (3, 1)]
    steps = [s for _, m in layer.sent if m["type"] == "run.metrics" for s, _ in m["steps"]]
    assert steps == [1, 2, 3] and {g for g, _ in layer.sent} == {f"run-{run.pk}"}
    assert any(m["type"] == "run.episodes" and m["count"] == 2 for _, m in layer.sent)


def test_metric_events_queued_together_are_merged():
    merged = live._merge([
        (1, {"type": "run.metrics", "steps": [[1, {}]]}), (1, {"type": "run.metrics", "steps": [[2, {}]]}),
        (2, {"type": "run.metrics", "steps": [[1, {}]]}), (1, {"type": "run.status", "status": "running"}),
    ])
    assert [(r, len(e.get("steps", []))) for r, e in merged] == [(1, 2), (2, 1), (1, 0)]
