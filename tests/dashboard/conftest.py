"""Dashboard fixtures: a run with a stored series, and a logged-in websocket communicator."""

from __future__ import annotations

import pytest


@pytest.fixture
def store():
    """Write ``{key: [(step, value), ...]}`` into a run's series blocks."""
    from webapp.dashboard.series import SeriesWriter

    def write(run, series: dict[str, list[tuple[int, float]]]) -> None:
        SeriesWriter(run.pk).write((key, step, value) for key, pairs in series.items() for step, value in pairs)

    return write


EPISODE = {
    "id": "e1", "task": {"map": "SFFG"}, "reward": 1.0, "num_turns": 2, "termination_reason": "env_done",
    "prompt_ids": [1, 2, 3], "response_ids": [4], "response_mask": [1],
    "trajectories": [{"name": "agent", "reward": 1.0, "info": {}, "steps": [
        {"chat_completions": [{"role": "user", "content": "You are at S. Move."}], "observation": "grid 1",
         "model_response": "right", "reward": 0.0, "done": False, "prompt_ids": [1], "response_ids": [2], "logprobs": [-0.1]},
        {"chat_completions": [{"role": "user", "content": "Now?"}], "observation": "grid 2",
         "model_response": "down", "reward": 1.0, "done": True},
    ]}],
}


@pytest.fixture
def episode() -> dict:
    """An ``Episode.to_dict()`` of two FrozenLake turns, token ids included."""
    return EPISODE
