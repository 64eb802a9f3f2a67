"""Per-attempt checkpoint folders on the trl backend (tiny model, CPU): an attempt saves in
``<run>/attempts/<n>`` and publishes into the run's ``checkpoints/`` and ``final_model`` while it
owns the run; the next attempt resumes from the newest published checkpoint; a stale attempt's
checkpoint never enters the run's list, rotates none of it out, nor replaces its final model.

Ownership is a value the test changes (a takeover); each attempt's fence asks it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from standins.ownership import Ownership
from training import AgentTrainer
from training.errors import RunSuperseded

pytestmark = pytest.mark.slow


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0


def train(run_path: Path, attempt: int, ownership: Ownership, steps: int, sink=None, may_write=None):
    return trainer(run_path, attempt, ownership, steps, sink, may_write).train()


def trainer(run_path: Path, attempt: int, ownership: Ownership, steps: int, sink=None, may_write=None) -> AgentTrainer:
    config = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 1,
              "data.max_response_length": 2, "trainer.total_training_steps": steps, "trainer.save_freq": 2,
              "trainer.max_checkpoints": 2, "trainer.logger": ["jsonl"]}
    return AgentTrainer(
        train_dataset=[{"prompt": "x="}], reward_func=starts_with_a, backend="trl", run_path=str(run_path), config=config,
        sinks=[sink] if sink is not None else [], attempt=attempt, write_fence=ownership.fence(attempt),
        may_write=may_write or (lambda: ownership.holder == attempt),
    )


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for part in ("checkpoints", "final_model", "config.yaml", "metrics.jsonl")
            for p in ([folder / part] if (folder / part).is_file() else sorted((folder / part).rglob("*"))) if p.is_file()}


def logged_steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("checkpoint-*"))


def test_attempts_publish_their_checkpoints_resume_from_the_newest_and_a_stale_one_changes_nothing(tmp_path, sink):
    ownership = Ownership(1)
    first = train(tmp_path, 1, ownership, 4)
    assert first.steps == 4 and first.checkpoint == str(tmp_path / "final_model")
    assert names(tmp_path / "checkpoints") == ["checkpoint-2", "checkpoint-4"]
    assert names(tmp_path / "attempts" / "1" / "checkpoints") == ["checkpoint-4"]  # its own folder keeps its newest
    assert (tmp_path / "final_model" / "config.json").is_file()

    ownership.holder = 2  # the next attempt holds the run: it resumes from the newest published checkpoint
    second = train(tmp_path, 2, ownership, 6, sink=sink)
    assert second.steps == 6 and [m["step"] for m in sink.metrics] == [5, 6]
    assert names(tmp_path / "checkpoints") == ["checkpoint-4", "checkpoint-6"]  # trainer.max_checkpoints, rotated by the owner
    assert logged_steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]  # each attempt's records, published

    # A third attempt, built while it held the run, then frozen past a takeover: its lease check
    # answered before the takeover (may_write says yes), so it trains, logs and saves in its own
    # folder; publishing is refused and stops it.
    ownership.holder = 3
    stale = trainer(tmp_path, 3, ownership, 8, may_write=lambda: True)
    finished = files(tmp_path)
    ownership.holder = 4
    with pytest.raises(RunSuperseded, match="checkpoint of step 8"):
        stale.train()
    assert (tmp_path / "attempts" / "3" / "checkpoints" / "checkpoint-8" / "trainer_state.json").is_file()
    assert logged_steps(tmp_path / "attempts" / "3" / "metrics.jsonl")[-2:] == [7, 8]
    assert files(tmp_path) == finished  # not listed, nothing rotated out, no step logged, the final model untouched
    assert not (tmp_path / "attempts" / "3" / "publishing" / "checkpoint-8").exists()
