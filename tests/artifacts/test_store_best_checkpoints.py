"""The artifact store keeps a run's best checkpoints too: its pruning to the newest ``keep_last`` keeps
the best ``trainer.keep_best_checkpoints`` by ``trainer.metric_for_best_model``, by the rule of the local
rotation (``TrainerProcessor.best_checkpoint_steps``), over a real S3 client against the loopback server
and over a folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from training import AgentTrainer
from training.platform.artifacts import ArtifactStore, RunUploader, fetch_run_files, prune_checkpoints


@pytest.fixture(params=["s3", "folder"])
def store(request, tmp_path):
    if request.param == "s3":
        return ArtifactStore(request.getfixturevalue("s3_url"))
    return ArtifactStore(str(tmp_path / "store"))


def processor(run_path: Path, **trainer_keys):
    """The trl backend's processor of a run ranking its checkpoints by reward (built, never trained)."""
    config = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 1,
              "trainer.save_freq": 1, **trainer_keys}
    return AgentTrainer(train_dataset=[{"prompt": "x="}], reward_func=lambda task, response: 0.0, backend="trl",
                        run_path=str(run_path), config=config).train_processor


def write_checkpoint(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes([step]))
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return folder


def stored_steps(store: ArtifactStore, prefix: str) -> list[int]:
    return [step for step, _ in store.stored_checkpoints(prefix)]


def test_the_uploaders_pruning_keeps_the_best_checkpoint_by_the_metric(store, tmp_path):
    ranking = processor(tmp_path / "run", **{"trainer.metric_for_best_model": "reward", "trainer.keep_best_checkpoints": 1})
    scratch = tmp_path / "scratch"
    uploader = RunUploader(store, "runs/3-b", scratch, keep_last=2, best=ranking.best_checkpoint_steps)
    rewards = {1: 0.2, 2: 0.9, 3: 0.1, 4: 0.3, 5: 0.0}  # step 2 is the best; older than the newest two
    for step, reward in rewards.items():
        ranking.sinks.log_metrics(step, {"reward": reward})
        uploader.checkpoint_saved(write_checkpoint(scratch / "checkpoints" / f"checkpoint-{step}", step))
    uploader.finish(None, timeout=60)
    assert stored_steps(store, "runs/3-b/checkpoints") == [2, 4, 5]


def test_pruning_ranks_only_the_stored_steps_in_the_metrics_direction(store, tmp_path):
    ranking = processor(tmp_path / "run", **{"trainer.metric_for_best_model": "loss", "trainer.keep_best_checkpoints": 2})
    for step, loss in {1: 0.5, 2: 0.1, 3: 0.05, 4: 0.9, 5: 0.8, 6: 0.7}.items():
        ranking.sinks.log_metrics(step, {"loss": loss})
    for step in (2, 4, 5, 6):  # step 3, the lowest loss, was never stored
        store.put_dir(write_checkpoint(tmp_path / f"checkpoint-{step}", step), f"p/checkpoint-{step}")
    # The newest (6) and the two lowest losses among the stored (2 and 6): a loss is better lower.
    assert prune_checkpoints(store, "p", 1, best=ranking.best_checkpoint_steps) == ["checkpoint-4", "checkpoint-5"]
    assert stored_steps(store, "p") == [2, 6]


def test_without_the_metric_only_the_newest_are_kept(store, tmp_path):
    ranking = processor(tmp_path / "run")
    for step in (1, 2, 3):
        ranking.sinks.log_metrics(step, {"reward": 1.0 if step == 1 else 0.0})
        store.put_dir(write_checkpoint(tmp_path / f"checkpoint-{step}", step), f"q/checkpoint-{step}")
    assert prune_checkpoints(store, "q", 1, best=ranking.best_checkpoint_steps) == ["checkpoint-1", "checkpoint-2"]


def test_an_attempt_on_another_machine_keeps_the_first_attempts_best(store, tmp_path):
    """The values that rank the best are stored beside the checkpoints: attempt 2, on a machine whose
    scratch folder never saw attempt 1, fetches them with the run's files and ranks attempt 1's best too."""
    keys = {"trainer.metric_for_best_model": "reward", "trainer.keep_best_checkpoints": 1}
    machine_a, machine_b = tmp_path / "a" / "run", tmp_path / "b" / "run"

    first = processor(machine_a, **keys)
    uploader = RunUploader(store, "runs/4-c", machine_a, keep_last=1, best=first.best_checkpoint_steps)
    for step, reward in {1: 0.1, 2: 0.9, 3: 0.2}.items():  # step 2 is the best of the run
        first.sinks.log_metrics(step, {"reward": reward})
        uploader.checkpoint_saved(write_checkpoint(machine_a / "checkpoints" / f"checkpoint-{step}", step))
    uploader.finish(None, timeout=60)
    assert stored_steps(store, "runs/4-c/checkpoints") == [2, 3]

    assert "checkpoints/best_metric.json" in fetch_run_files(store, "runs/4-c", machine_b)
    second = processor(machine_b, **keys)  # built after the fetch, as the worker builds it
    uploader = RunUploader(store, "runs/4-c", machine_b, keep_last=1, best=second.best_checkpoint_steps)
    for step, reward in {4: 0.3, 5: 0.4, 6: 0.0}.items():  # each better than step 1 and 3, none than step 2
        second.sinks.log_metrics(step, {"reward": reward})
        uploader.checkpoint_saved(write_checkpoint(machine_b / "checkpoints" / f"checkpoint-{step}", step))
    uploader.finish(None, timeout=60)
    assert stored_steps(store, "runs/4-c/checkpoints") == [2, 6]


def test_a_copy_left_by_an_earlier_attempt_on_this_machine_gives_way_to_the_stored_one(store, tmp_path):
    """Attempt 1 on machine A, attempt 2 on B, attempt 3 on A again: A's copy of the values is attempt 1's."""
    scratch = tmp_path / "a"
    (scratch / "checkpoints").mkdir(parents=True)
    (scratch / "checkpoints" / "best_metric.json").write_text('{"metric": "reward", "values": {"2": 0.9}}')
    store.put_bytes(b'{"metric": "reward", "values": {"2": 0.9, "7": 1.5}}', "runs/5-d/checkpoints/best_metric.json")
    fetch_run_files(store, "runs/5-d", scratch)
    ranking = processor(scratch, **{"trainer.metric_for_best_model": "reward", "trainer.keep_best_checkpoints": 1})
    assert ranking.best_checkpoint_steps([2, 7, 8]) == {7}
