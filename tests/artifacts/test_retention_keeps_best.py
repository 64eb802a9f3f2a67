"""A project's checkpoint retention (``manage.py artifacts retention``, and the end of each attempt
without a shared store) keeps the run's best checkpoints by its ``trainer.metric_for_best_model``
beside the newest ``keep_checkpoints``, by the values its training recorded beside its checkpoints:
in a shared store (moto's S3 server on loopback) and in the run's own folder."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command

from training.backends.processor import write_best_metric
from training.platform.artifacts import RunUploader
from webapp.checkpoints.models import CheckpointAlias
from webapp.runs import artifacts
from webapp.runs.models import Run

REWARDS = {1: 0.9, 2: 0.1, 3: 0.2, 4: 0.3, 5: 0.0}  # step 1 is the best, and the oldest
RANKED = {"trainer": {"metric_for_best_model": "reward", "keep_best_checkpoints": 1, "greater_is_better": None}}


def save_checkpoint(folder: Path, step: int) -> Path:
    folder = folder / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes([step]) * 10)
    return folder


@pytest.fixture(params=["shared", "folder"])
def trained_run(request, settings, make_run, project, tmp_path):
    """A run that ended with checkpoints of every step of ``REWARDS`` and the values its rotation recorded."""
    settings.RUNS_DIR = str(tmp_path / "runs")
    run = make_run(status=Run.Status.SUCCEEDED, steps=5, project=project, final_config=RANKED)
    if request.param == "shared":
        settings.ARTIFACTS_URL = request.getfixturevalue("s3_url")
        scratch = tmp_path / "scratch"
        write_best_metric(_mkdir(scratch / "checkpoints"), "reward", REWARDS)  # as the worker's ranking writes it
        uploader = RunUploader(artifacts.store(), artifacts.run_prefix(run), scratch)
        for step in REWARDS:
            uploader.checkpoint_saved(save_checkpoint(scratch / "checkpoints", step))
        uploader.finish(None, timeout=60)
    else:
        settings.ARTIFACTS_URL = ""
        folder = run.folder()
        Run.objects.filter(pk=run.pk).update(run_path=str(folder))
        run.refresh_from_db()
        for step in REWARDS:
            save_checkpoint(folder / "checkpoints", step)
        write_best_metric(folder / "checkpoints", "reward", REWARDS)
    return run


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def kept_steps(run: Run) -> list[int]:
    return [step for step, _ in artifacts.run_checkpoints(run)]


def test_retention_keeps_the_best_checkpoint_beside_the_newest(trained_run, project):
    project.keep_checkpoints = 2
    project.save()
    call_command("artifacts", "retention", stdout=io.StringIO())
    assert kept_steps(trained_run) == [1, 4, 5]  # the newest two, and the best by reward


def test_a_loss_is_ranked_lower_is_better(trained_run, project):
    Run.objects.filter(pk=trained_run.pk).update(final_config={"trainer": {**RANKED["trainer"], "metric_for_best_model": "loss"}})
    trained_run.refresh_from_db()
    prefix = artifacts.run_prefix(trained_run)
    artifacts.store().put_bytes(b'{"metric": "loss", "values": {"1": 0.9, "2": 0.1, "3": 0.2, "4": 0.3, "5": 0.4}}',
                                f"{prefix}/checkpoints/best_metric.json")
    project.keep_checkpoints = 1
    project.save()
    trained_run.project = project
    assert artifacts.apply_retention(trained_run)
    assert kept_steps(trained_run) == [2, 5]


def test_without_the_metric_only_the_newest_are_kept(trained_run, project):
    Run.objects.filter(pk=trained_run.pk).update(final_config={"trainer": {"metric_for_best_model": None}})
    project.keep_checkpoints = 2
    project.save()
    call_command("artifacts", "retention", stdout=io.StringIO())
    assert kept_steps(trained_run) == [4, 5]


def test_retention_keeps_a_checkpoint_a_project_alias_names(trained_run, project):
    CheckpointAlias.objects.create(project=project, name="candidate", run=trained_run, step=2)
    project.keep_checkpoints = 2
    project.save()
    call_command("artifacts", "retention", stdout=io.StringIO())
    assert kept_steps(trained_run) == [1, 2, 4, 5]  # the newest two, the best by reward, the aliased one
