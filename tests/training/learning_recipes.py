"""What the learning tests' recipes share with bench/learning_seeds.py, which calls them outside pytest:
a metric sink that keeps what it is given, the bench's ``--set key=value`` items as config entries, and
what a recipe measured by its reward returns."""

from __future__ import annotations

import contextlib
import os

import yaml


def overrides(items: tuple[str, ...]) -> dict:
    """``key=value`` items (a bench's ``--set``) as config entries, each value read as YAML."""
    return {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in items)}


def reward_rise(sink: "RecordingSink", result, window: int = 3) -> dict:
    """What a recipe measured by its reward returns: the mean reward of the first and of the last
    ``window`` steps (``before``, ``after``), the steps' metrics and episodes, the result and the sink."""
    rewards = [m["reward"] for m in sink.metrics]
    return {"before": sum(rewards[:window]) / window, "after": sum(rewards[-window:]) / window, "metrics": sink.metrics,
            "episodes": sink.episodes, "result": result, "sink": sink}


@contextlib.contextmanager
def stand_in(given, make, key: str):
    """``given`` (a stand-in service that a test's fixture started), else one ``make()`` starts for the
    block, its API key in the environment variable ``key``, closed after it (a bench's recipe)."""
    if given is not None:
        yield given
        return
    service = make()
    os.environ[key] = service.api_key
    try:
        yield service
    finally:
        service.close()


class RecordingSink:
    """A metric sink that keeps everything it is given, for assertions."""

    def __init__(self):
        self.metrics: list[dict] = []
        self.episodes: list[dict] = []
        self.outcomes: list[tuple[str, str]] = []  # how the run ended, where it raised (MultiSink.log_outcome)
        self.closed = False
        self.closes = 0

    def log_metrics(self, step, metrics):
        self.metrics.append({"step": step, **metrics})

    def log_episodes(self, step, episodes):
        self.episodes.extend(episodes)

    def log_outcome(self, status, message):
        self.outcomes.append((status, message))

    def close(self):
        self.closed = True
        self.closes += 1
