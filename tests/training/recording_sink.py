"""A metric sink for tests and the learning benches, which call test recipes outside pytest."""

from __future__ import annotations


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
