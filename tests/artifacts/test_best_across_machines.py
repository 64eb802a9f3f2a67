"""A run's best checkpoint survives an attempt on another machine: the worker's own path
(``artifacts.start_uploads``, which fetches what earlier attempts stored, then the trainer's ranking
given to the uploader as ``workers.execute`` gives it), two scratch folders (two ``RUNS_DIR``, as two
machines) and one shared store (moto's S3 server on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training import AgentTrainer
from webapp.runs import artifacts
from webapp.runs.models import Run

RANKED = {"trainer.metric_for_best_model": "reward", "trainer.keep_best_checkpoints": 1}


@pytest.fixture
def shared(settings, s3_url):
    settings.ARTIFACTS_URL = s3_url
    settings.ARTIFACTS_KEEP_CHECKPOINTS = 1


def attempt_on(machine: Path, run: Run, settings, rewards: dict[int, float]) -> None:
    """One attempt of ``run`` on ``machine``: the trl backend's ranking (built, never trained) logs
    ``rewards`` and saves a checkpoint at each of their steps, which the uploader stores and prunes."""
    settings.RUNS_DIR = str(machine)
    scratch = artifacts.scratch_folder(run)
    uploader = artifacts.start_uploads(run, scratch)
    config = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 1,
              "trainer.save_freq": 1, **RANKED}
    ranking = AgentTrainer(train_dataset=[{"prompt": "x="}], reward_func=lambda task, response: 0.0, backend="trl",
                           run_path=str(scratch), config=config).train_processor
    uploader.best = ranking.best_checkpoint_steps
    for step, reward in rewards.items():
        ranking.sinks.log_metrics(step, {"reward": reward})
        folder = scratch / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(bytes([step]))
        uploader.checkpoint_saved(folder)
    uploader.finish(None, timeout=60)


def stored_steps(run: Run) -> list[int]:
    return [step for step, _ in artifacts.run_checkpoints(run)]


def test_the_second_attempt_on_another_machine_keeps_the_first_attempts_best(shared, make_run, settings, tmp_path):
    run = make_run(status=Run.Status.RUNNING)
    attempt_on(tmp_path / "machine-a", run, settings, {1: 0.2, 2: 0.8, 3: 0.1})
    assert stored_steps(run) == [2, 3]
    attempt_on(tmp_path / "machine-b", run, settings, {4: 0.5, 5: 0.3})  # its scratch folder never saw attempt 1
    assert not (tmp_path / "machine-b" / f"{run.pk}-{run.uid.hex}" / "checkpoints" / "checkpoint-2").exists()
    assert stored_steps(run) == [2, 5]
