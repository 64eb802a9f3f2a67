"""Shared helpers of the library's tests."""

import pytest
import torch

from learning_recipes import RecordingSink


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread, and many times faster when other processes share the CPU."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
