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


def _logged_step(rng, step: int) -> dict[str, float]:
    import math

    metrics = {"reward": rng.uniform(-1, 1), "loss": rng.choice([rng.random(), math.nan])}
    if step % 25 == 0:
        metrics["val/reward"] = rng.random()  # a rare key: small blocks of its own
    if rng.random() < 0.01:
        metrics["reward"] = rng.choice([50.0, -50.0])  # spikes the chart must keep
    return metrics


@pytest.fixture
def log_with_restarts():
    """Log random steps into a run as four writers in turn (a restarted worker each), each resuming
    some steps back (those steps come again) and flushing now and then; ``check(run_id, record)``
    runs after each flush and each writer. Returns the record: {key: {step: last value logged}}."""
    from webapp.dashboard.recording import DashboardSink

    def log(run_id: int, rng, check, back: tuple[int, int], steps: tuple[int, int], flush_chance: float):
        record: dict[str, dict[int, float]] = {}
        step = 0
        for attempt in range(4):
            sink = DashboardSink(run_id, flush_seconds=3600, publish=False)
            if attempt:
                step -= rng.randint(*back)
            for _ in range(rng.randint(*steps)):
                step += 1
                metrics = _logged_step(rng, step)
                sink.log_metrics(step, metrics)
                for key, value in metrics.items():
                    record.setdefault(key, {})[step] = value
                if rng.random() < flush_chance:
                    sink.flush()
                    check(run_id, record)
            sink.close()
            check(run_id, record)
        return record

    return log
