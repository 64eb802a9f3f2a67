"""One run page: progress of total, config as YAML, metrics as CSV, models as archives (only from
inside the run's own folder), the old dashboard URL redirecting to it, and the run list's live poll."""

from __future__ import annotations

import csv
import io
import tarfile

import pytest
import yaml
from asgiref.sync import async_to_sync

from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Checkpoint

pytestmark = pytest.mark.django_db


def body(response) -> bytes:
    """A streamed download's bytes (the views stream from async iterators, as the ASGI server serves them)."""
    async def collect():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


@pytest.fixture
def finished_run(make_run, settings, tmp_path):
    settings.RUNS_DIR = tmp_path / "runs"
    run_dir = settings.RUNS_DIR / "7"
    (run_dir / "final_model").mkdir(parents=True)
    (run_dir / "final_model" / "config.json").write_text('{"model_type": "qwen2"}')
    (run_dir / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run_dir / "checkpoints" / "checkpoint-2" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "secret.txt").write_text("not yours")
    (run_dir / "final_model" / "link.txt").symlink_to(tmp_path / "secret.txt")
    run = make_run(status="succeeded", steps=3, run_path=str(run_dir),
                   final_config={"trainer": {"total_training_steps": 3}, "data": {"train_batch_size": 2}})
    Checkpoint.objects.create(run=run, step=2, path=str(run_dir / "checkpoints" / "checkpoint-2"))
    Checkpoint.objects.create(run=run, step=3, path=str(tmp_path))  # outside the run's folder: never offered
    SeriesWriter(run.pk).write([("reward", 1, 0.1), ("loss", 1, 2.0), ("reward", 2, 0.5), ("reward", 3, 0.9), ("kl", 3, None)])
    return run


def test_the_page_shows_progress_config_and_downloads(owner_client, finished_run):
    page = owner_client.get(f"/runs/{finished_run.pk}/").content.decode()
    assert 'id="run-progress"' in page and "of 3" in page and 'value="3"' in page
    assert "total_training_steps: 3" in page  # YAML, not a dict repr
    assert f"/runs/{finished_run.pk}/models/final_model.tar.gz" in page
    assert f"/runs/{finished_run.pk}/models/checkpoint-2.tar.gz" in page
    assert "checkpoint-3" not in page and "What a good curve looks like" in page


def test_config_downloads_as_yaml(owner_client, finished_run):
    response = owner_client.get(f"/runs/{finished_run.pk}/config.yaml")
    assert response["Content-Disposition"].startswith("attachment")
    assert yaml.safe_load(response.content)["trainer"]["total_training_steps"] == 3


def test_metrics_download_as_one_row_per_step(owner_client, finished_run):
    response = owner_client.get(f"/runs/{finished_run.pk}/metrics.csv")
    rows = list(csv.reader(io.StringIO(body(response).decode())))
    assert rows == [["step", "kl", "loss", "reward"], ["1", "", "2.0", "0.1"], ["2", "", "", "0.5"], ["3", "", "", "0.9"]]


def test_models_download_as_archives_of_the_run_folder_only(owner_client, finished_run):
    response = owner_client.get(f"/runs/{finished_run.pk}/models/final_model.tar.gz")
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(body(response)), mode="r:gz") as tar:
        names = tar.getnames()
    assert f"run-{finished_run.pk}-final_model/config.json" in names
    assert not any(name.endswith("link.txt") for name in names)  # a symlink does not carry another file out
    assert owner_client.get(f"/runs/{finished_run.pk}/models/checkpoint-2.tar.gz").status_code == 200
    assert owner_client.get(f"/runs/{finished_run.pk}/models/checkpoint-3.tar.gz").status_code == 404
    assert owner_client.get(f"/runs/{finished_run.pk}/models/..%2F..%2Fetc.tar.gz").status_code == 404


def test_a_stranger_downloads_nothing(stranger_client, finished_run):
    for path in ("config.yaml", "metrics.csv", "models/final_model.tar.gz"):
        assert stranger_client.get(f"/runs/{finished_run.pk}/{path}").status_code == 404


def test_the_old_dashboard_url_redirects_to_the_run_page(owner_client, finished_run):
    response = owner_client.get(f"/dashboard/runs/{finished_run.pk}/")
    assert response.status_code == 301 and response["Location"] == f"/runs/{finished_run.pk}/"


def test_the_run_list_poll_reports_only_visible_runs(owner_client, finished_run, make_run, stranger):
    other = make_run(owner=stranger, name="theirs")
    data = owner_client.get(f"/runs/live.json?ids={finished_run.pk},{other.pk}").json()
    assert data["runs"] == {str(finished_run.pk): {"status": "succeeded", "steps": 3, "warnings": [], "waiting": ""}}
    assert data["newest"] == finished_run.pk


def test_an_empty_list_says_how_to_start(owner_client):
    page = owner_client.get("/").content.decode()
    assert 'id="first-run"' in page and "frozenlake" in page


def test_metrics_csv_pages_whole_steps(owner_client, finished_run, monkeypatch):
    from webapp.dashboard import views

    monkeypatch.setattr(views, "CSV_STEPS", 1)  # one step per window
    rows = list(csv.reader(io.StringIO(body(owner_client.get(f"/runs/{finished_run.pk}/metrics.csv")).decode())))
    assert rows == [["step", "kl", "loss", "reward"], ["1", "", "2.0", "0.1"], ["2", "", "", "0.5"], ["3", "", "", "0.9"]]
