"""Shared helpers of the library's tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread, and many times faster when other processes share the CPU."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
