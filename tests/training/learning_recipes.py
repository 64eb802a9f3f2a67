"""What the learning tests' recipes share with bench/learning_seeds.py, which calls them outside pytest:
a metric sink that keeps what it is given, and the bench's ``--set key=value`` items as config entries."""

from __future__ import annotations

import yaml


def overrides(items: tuple[str, ...]) -> dict:
    """``key=value`` items (a bench's ``--set``) as config entries, each value read as YAML."""
    return {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in items)}


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
