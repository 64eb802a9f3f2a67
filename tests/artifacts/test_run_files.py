"""What the platform does with a run's files in a shared artifact store (moto's S3 server on
loopback standing in for S3/MinIO): the run page's downloads stream from the store after the run's
access check (a presigned link where the store signs), retention keeps a project's number of
checkpoints and always the final model, deleting a run deletes its objects, and the orphans
command finds what no row names. The objects are put as a worker stores them (RunUploader)."""

from __future__ import annotations

import io
import tarfile
import urllib.request
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.test import Client

from training.platform.artifacts import ArtifactStore, RunUploader
from webapp.runs import artifacts
from webapp.runs.models import Run


def streamed(response) -> bytes:
    async def collect() -> bytes:  # the view streams an async iterator, as the ASGI server reads it
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


@pytest.fixture
def shared_store(settings, s3_url):
    settings.ARTIFACTS_URL = s3_url
    return ArtifactStore(s3_url)


def store_run_files(run: Run, tmp_path, steps=(1, 2, 3, 4)) -> dict[str, bytes]:
    """What a worker leaves in the store for ``run``: checkpoints, the final model, run files, a log."""
    scratch = tmp_path / f"scratch-{run.pk}"
    (scratch / "checkpoints").mkdir(parents=True)
    uploader = RunUploader(artifacts.store(), artifacts.run_prefix(run), scratch, log_name="attempt-1.log")
    for step in steps:
        folder = scratch / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(bytes([step]) * 100)
        uploader.checkpoint_saved(folder)
    final = scratch / "final_model"
    (final / "nested").mkdir(parents=True)
    weights = {"model.safetensors": b"final-weights" * 1000, "nested/tokenizer.json": b'{"vocab": {}}'}
    for name, data in weights.items():
        (final / name).write_bytes(data)
    (scratch / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    (scratch / "trackers.json").write_text('{"wandb": {"id": "w4nd8", "mode": "offline"}}')
    (scratch / "process.log").write_text("training...\n")
    uploader.finish(final, timeout=60)
    return weights


@pytest.fixture
def stored_run(make_run, shared_store, tmp_path):
    run = make_run(status=Run.Status.SUCCEEDED, steps=4)
    return run, store_run_files(run, tmp_path)


def test_the_final_model_downloads_through_the_page_streamed_from_the_store(stored_run, owner_client):
    run, weights = stored_run
    page = owner_client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"/runs/{run.pk}/models/final_model.tar.gz" in html and f"/runs/{run.pk}/models/checkpoint-4.tar.gz" in html
    assert f"/runs/{run.pk}/files/metrics.jsonl" in html and f"/runs/{run.pk}/files/logs/attempt-1.log" in html
    response = owner_client.get(f"/runs/{run.pk}/models/final_model.tar.gz")
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    body = streamed(response)
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert got == {f"run-{run.pk}-final_model/{name}": data for name, data in weights.items()}


def test_a_stored_file_is_a_presigned_link_given_only_after_the_access_check(stored_run, owner_client, stranger):
    run, _ = stored_run
    response = owner_client.get(f"/runs/{run.pk}/files/metrics.jsonl")
    assert response.status_code == 302 and "Signature" in response["Location"]
    with urllib.request.urlopen(response["Location"], timeout=10) as fetched:  # the store serves it, no keys
        assert fetched.read() == b'{"step": 1, "reward": 0.5}\n'
    other = Client()
    other.force_login(stranger)
    for path in ("files/metrics.jsonl", "models/final_model.tar.gz", "models/checkpoint-1.tar.gz"):
        assert other.get(f"/runs/{run.pk}/{path}").status_code == 404
    assert owner_client.get(f"/runs/{run.pk}/files/checkpoints/checkpoint-1/model.safetensors").status_code == 404
    assert owner_client.get(f"/runs/{run.pk}/files/../../etc/passwd").status_code == 404


def test_retention_keeps_the_projects_number_of_checkpoints_and_the_final_model(stored_run, project):
    run, _ = stored_run
    project.keep_checkpoints = 2
    project.save()
    Run.objects.filter(pk=run.pk).update(project=project)
    call_command("artifacts", "retention", stdout=io.StringIO())
    run.refresh_from_db()
    assert [step for step, _ in artifacts.run_checkpoints(run)] == [3, 4]
    assert artifacts.final_model_key(run)
    assert not [k for k in artifacts.store().list(artifacts.run_prefix(run)) if k.startswith("checkpoints/checkpoint-1/")]


def test_deleting_a_run_deletes_its_objects_and_the_orphans_command_finds_what_a_crash_left(
    stored_run, make_run, tmp_path, shared_store, django_capture_on_commit_callbacks
):
    run, _ = stored_run
    prefix = artifacts.run_prefix(run)
    keep = make_run(status=Run.Status.SUCCEEDED)
    store_run_files(keep, tmp_path, steps=(1,))
    with django_capture_on_commit_callbacks(execute=True):
        run.delete()
    assert shared_store.list(prefix) == []
    assert shared_store.list(artifacts.run_prefix(keep))  # another run's files stay
    # A worker crashed after storing files of a run whose row is gone (deleted meanwhile), and an
    # upload was stored but its row never written.
    crashed = "runs/99999-" + "ab" * 16
    shared_store.put_bytes(b"x", f"{crashed}/checkpoints/checkpoint-1/model.safetensors")
    shared_store.put_bytes(b"rows", "uploads/datasets/7/never-saved.jsonl")
    assert set(artifacts.orphans(older_than=timedelta(0))) == {crashed, "uploads/datasets/7/never-saved.jsonl"}
    assert artifacts.orphans(older_than=timedelta(hours=1)) == []  # too young: a row may be being written
    out = io.StringIO()
    call_command("artifacts", "orphans", "--delete", "--min-age-minutes", "0", stdout=out)
    assert "2 orphan(s) removed" in out.getvalue()
    assert shared_store.list(crashed) == [] and artifacts.orphans(older_than=timedelta(0)) == []
    assert shared_store.list(artifacts.run_prefix(keep))


def test_an_uploaded_file_is_stored_in_the_artifact_store(shared_store, project, settings, tmp_path):
    from django.core.files.storage import default_storage

    # What settings.py sets when ARTIFACTS_URL is (read at start-up, so set here as it would be).
    settings.STORAGES = {**settings.STORAGES, "default": {"BACKEND": "webapp.runs.artifacts.ArtifactStorage"}}

    name = artifacts.store_upload(project.pk, "../my data.jsonl", io.BytesIO(b'{"prompt": "hi"}\n'))
    assert name.startswith(f"datasets/{project.pk}/") and name.endswith("-my_data.jsonl")
    assert shared_store.exists(f"uploads/{name}")
    with default_storage.open(name) as handle:
        assert handle.read() == b'{"prompt": "hi"}\n'
    # A worker (no shared disk with the web host) reads it through the dataset's file field.
    from webapp.registry.models import Dataset, local_path

    settings.VAR_DIR = tmp_path / "worker-var"
    dataset = Dataset.objects.create(name="uploaded", source=Dataset.Source.UPLOAD, file=name)
    copy = local_path(Dataset.objects.get(pk=dataset.pk).file)
    assert copy.startswith(str(tmp_path / "worker-var")) and open(copy, "rb").read() == b'{"prompt": "hi"}\n'


def test_without_a_shared_store_a_run_keeps_its_folder_and_deleting_it_removes_the_folder(
    settings, make_run, tmp_path, django_capture_on_commit_callbacks
):
    settings.RUNS_DIR = tmp_path / "runs"
    run = make_run(status=Run.Status.SUCCEEDED)
    folder = tmp_path / "runs" / f"{run.pk}-{run.uid.hex}"
    (folder / "final_model").mkdir(parents=True)
    (folder / "final_model" / "model.safetensors").write_bytes(b"w")
    Run.objects.filter(pk=run.pk).update(run_path=str(folder))
    run.refresh_from_db()
    assert not artifacts.shared() and artifacts.scratch_folder(run) == folder
    assert artifacts.final_model_key(run) == f"{folder.name}/final_model"
    with django_capture_on_commit_callbacks(execute=True):
        run.delete()
    assert not folder.exists()


def test_a_run_starts_from_another_runs_model_fetched_from_the_store(stored_run, owner, settings, tmp_path):
    from webapp.policy.keys import MODEL_KEY
    from webapp.runs.trainer_args import model_config

    settings.RUNS_DIR = tmp_path / "another-machine" / "runs"
    source, weights = stored_run
    config = model_config(f"run:{source.pk}", owner)
    local = tmp_path / "another-machine" / "runs" / f"{source.pk}-{source.uid.hex}" / "final_model"
    assert config[MODEL_KEY] == str(local) and not local.exists()  # the web side only checks the store
    assert artifacts.fetch_trained_model(f"run:{source.pk}") == local  # the worker fetches it
    assert {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file() and p.name != ".stored"} == weights
    assert artifacts.fetch_trained_model("tiny-char") is None
    Run.objects.filter(pk=source.pk).update(status=Run.Status.FAILED)
    with pytest.raises(ValueError, match="no trained model in the artifact store"):
        model_config(f"run:{source.pk}", owner)


def test_the_run_page_links_the_trackers_a_worker_recorded_in_the_store(stored_run, owner_client):
    run, _ = stored_run
    assert "offline run w4nd8" in owner_client.get(f"/runs/{run.pk}/").content.decode()


def test_an_archive_streams_in_bounded_chunks_and_an_abandoned_download_stops_its_writer():
    import threading

    from webapp.runs.downloads import _piped

    written, stopped = [], threading.Event()

    def write(out) -> None:
        try:
            for _ in range(10_000):  # far more than the pipe holds: the writer waits for the reader
                out.write(b"x" * 1024)
                written.append(1)
        except OSError:
            stopped.set()

    chunks = _piped(write, depth=4)
    assert next(chunks) == b"x" * 1024
    chunks.close()  # the client went away
    assert stopped.wait(10)
    assert len(written) < 100
