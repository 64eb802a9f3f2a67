"""The artifact store over a real S3 client (s3fs) against an S3-compatible server on loopback
(moto's server mode standing in for S3/MinIO), and over a local folder: put, get, list, delete,
presign, whole checkpoints, and the background uploader's retries while the store is down."""

from __future__ import annotations

import logging
import time
import urllib.request
from pathlib import Path

import pytest

from training.platform.artifacts import STORED_MARKER, ArtifactStore, RunUploader, checkpoint_step, fetch_run_files, prune_checkpoints

from training.errors import ArtifactStoreError


@pytest.fixture(params=["s3", "folder"])
def store(request, tmp_path):
    if request.param == "s3":
        return ArtifactStore(request.getfixturevalue("s3_url"))
    return ArtifactStore(str(tmp_path / "store"))


def write_checkpoint(folder: Path, weights: bytes = b"weights") -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "sub" / "trainer_state.json").write_text('{"global_step": 1}')
    return folder


def test_put_get_list_delete_round_trip(store, tmp_path):
    source = tmp_path / "a.txt"
    source.write_bytes(b"hello store")
    store.put_file(source, "runs/1-x/config.yaml")
    store.put_bytes(b"rows", "runs/1-x/metrics.jsonl")
    assert store.list("runs/1-x") == ["config.yaml", "metrics.jsonl"]
    assert store.children("runs") == ["1-x"]
    assert store.exists("runs/1-x/config.yaml") and not store.exists("runs/1-x/missing")
    assert store.size("runs/1-x/config.yaml") == len(b"hello store")
    store.get_file("runs/1-x/config.yaml", tmp_path / "back" / "config.yaml")
    assert (tmp_path / "back" / "config.yaml").read_bytes() == b"hello store"
    with store.open("runs/1-x/metrics.jsonl") as handle:
        assert handle.read() == b"rows"
    assert store.delete("runs/1-x") == 2
    assert store.list("runs/1-x") == [] and store.list() == []


def test_keys_never_leave_the_root(store):
    for key in ("../escape", "runs/../../escape", "/etc/passwd", ""):
        with pytest.raises(ValueError):
            store.path(key)


def test_a_checkpoint_is_whole_only_with_its_marker_and_the_newest_is_fetched(store, tmp_path):
    scratch = tmp_path / "scratch"
    store.put_dir(write_checkpoint(scratch / "checkpoint-1", b"one"), "runs/r/checkpoints/checkpoint-1")
    store.put_dir(write_checkpoint(scratch / "checkpoint-2", b"two"), "runs/r/checkpoints/checkpoint-2")
    # A third whose upload was cut before its marker: not a checkpoint to resume from.
    store.put_dir(write_checkpoint(scratch / "checkpoint-3", b"three"), "runs/r/checkpoints/checkpoint-3", marker=False)
    assert store.stored_checkpoints("runs/r/checkpoints") == [(1, "checkpoint-1"), (2, "checkpoint-2")]
    fetched = store.fetch_latest_checkpoint("runs/r/checkpoints", tmp_path / "other-worker" / "checkpoints")
    assert fetched == tmp_path / "other-worker" / "checkpoints" / "checkpoint-2"
    assert (fetched / "model.safetensors").read_bytes() == b"two"
    assert (fetched / "sub" / "trainer_state.json").is_file()
    assert store.fetch_latest_checkpoint("runs/none/checkpoints", tmp_path / "x") is None
    # Capped at a step (the last one the database holds reports of): the newest at or before it.
    capped = store.fetch_latest_checkpoint("runs/r/checkpoints", tmp_path / "third" / "checkpoints", max_step=1)
    assert capped.name == "checkpoint-1" and (capped / "model.safetensors").read_bytes() == b"one"
    assert store.fetch_latest_checkpoint("runs/r/checkpoints", tmp_path / "fourth", max_step=0) is None


def test_prune_keeps_the_newest(store, tmp_path):
    for step in (1, 2, 3, 4):
        store.put_dir(write_checkpoint(tmp_path / f"checkpoint-{step}"), f"p/checkpoint-{step}")
    assert prune_checkpoints(store, "p", 2) == ["checkpoint-1", "checkpoint-2"]
    assert store.stored_checkpoints("p") == [(3, "checkpoint-3"), (4, "checkpoint-4")]
    assert not any(key.startswith("checkpoint-1") for key in store.list("p"))
    # A step the platform keeps (an alias names it) is never pruned.
    for step in (5, 6):
        store.put_dir(write_checkpoint(tmp_path / f"checkpoint-{step}"), f"p/checkpoint-{step}")
    assert prune_checkpoints(store, "p", 2, kept={3}) == ["checkpoint-4"]
    assert [step for step, _ in store.stored_checkpoints("p")] == [3, 5, 6]


def test_presigned_urls_fetch_without_credentials(s3_url, tmp_path, monkeypatch):
    store = ArtifactStore(s3_url)
    store.put_bytes(b"final weights", "runs/5-y/final_model/model.safetensors")
    url = store.presign("runs/5-y/final_model/model.safetensors", expires=60)
    assert url and "Signature" in url
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    with urllib.request.urlopen(url, timeout=10) as response:  # a plain HTTP GET: no AWS client, no keys
        assert response.read() == b"final weights"
    assert ArtifactStore(str(tmp_path / "local")).presign("anything") is None


def test_checkpoint_step_names():
    assert checkpoint_step("checkpoint-12") == 12 and checkpoint_step("global_step_3") == 3
    assert checkpoint_step("checkpoint-") is None and checkpoint_step("final_model") is None


def test_uploader_stores_checkpoints_and_run_files_once_and_waits_for_the_final_model(store, tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "checkpoints").mkdir(parents=True)
    (scratch / "metrics.jsonl").write_text('{"step": 1}\n')
    (scratch / "process.log").write_text("training\n")
    uploader = RunUploader(store, "runs/9-z", scratch, log_name="attempt-1.log", keep_last=2)
    for step in (1, 2, 3):
        uploader.checkpoint_saved(write_checkpoint(scratch / "checkpoints" / f"checkpoint-{step}", bytes([step])))
    uploader.checkpoint_saved(scratch / "checkpoints" / "checkpoint-3")  # told twice: stored once
    final = write_checkpoint(scratch / "final_model", b"final")
    uploader.finish(final, timeout=60)
    assert store.stored_checkpoints("runs/9-z/checkpoints") == [(2, "checkpoint-2"), (3, "checkpoint-3")]
    keys = store.list("runs/9-z")
    assert {"metrics.jsonl", "logs/attempt-1.log", f"final_model/{STORED_MARKER}", "final_model/model.safetensors"} <= set(keys)
    fresh = tmp_path / "another-scratch"
    fresh.mkdir()
    assert fetch_run_files(store, "runs/9-z", fresh) == ["metrics.jsonl"]
    assert (fresh / "metrics.jsonl").read_text() == '{"step": 1}\n'


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.slow  # a store outage injected
def test_uploader_retries_through_an_outage_and_logs_it_once(s3_server, s3_env, tmp_path):
    store = ArtifactStore(f"s3://{s3_server.new_bucket()}/p")
    scratch = tmp_path / "scratch"
    uploader = RunUploader(store, "runs/1-a", scratch, retry_max_seconds=1)
    collected = Collected()
    logging.getLogger("training").addHandler(collected)
    s3_server.stop()
    try:
        for step in (1, 2, 3):
            uploader.checkpoint_saved(write_checkpoint(scratch / "checkpoints" / f"checkpoint-{step}"))
        deadline = time.monotonic() + 60
        while not any("unreachable" in m for m in collected.messages) and time.monotonic() < deadline:
            time.sleep(0.2)
        with pytest.raises(ArtifactStoreError, match="did not take"):
            uploader.finish(None, timeout=2)
    finally:
        s3_server.start()
    try:
        uploader.finish(write_checkpoint(scratch / "final_model"), timeout=120)
    finally:
        logging.getLogger("training").removeHandler(collected)
    assert [step for step, _ in store.stored_checkpoints("runs/1-a/checkpoints")] == [1, 2, 3]
    assert store.exists(f"runs/1-a/final_model/{STORED_MARKER}")
    assert len([m for m in collected.messages if "unreachable" in m]) == 1, collected.messages
    assert any("reachable again" in m for m in collected.messages), collected.messages


def test_artifacts_url_setting_names_what_it_accepts(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from webapp.settings import envartifacts

    for value in ("", "s3://bucket/prefix", "s3://bucket", "/srv/artifacts", "file:///srv/artifacts"):
        monkeypatch.setenv("ARTIFACTS_URL", value)
        assert envartifacts("ARTIFACTS_URL") == value
    for value in ("relative/folder", "gs://bucket", "s3://", "http://minio:9000/bucket"):
        monkeypatch.setenv("ARTIFACTS_URL", value)
        with pytest.raises(ImproperlyConfigured, match="ARTIFACTS_URL"):
            envartifacts("ARTIFACTS_URL")


def test_verl_checkpoints_are_stored_once_its_marker_names_them_and_resume_gets_the_marker(store, tmp_path):
    from training.platform.artifacts import VERL_LATEST, CheckpointUploadSink

    scratch = tmp_path / "scratch"
    checkpoints = scratch / "checkpoints"
    uploader = RunUploader(store, "runs/v", scratch)
    sink = CheckpointUploadSink(uploader)
    write_checkpoint(checkpoints / "global_step_2")
    sink.log_metrics(2, {"reward": 0.1})  # saved, but verl has not marked it whole yet
    (checkpoints / VERL_LATEST).write_text("2")
    sink.log_metrics(3, {"reward": 0.2})
    sink.log_metrics(4, {"reward": 0.3})  # still step 2's marker: nothing new to store
    uploader.finish(None, timeout=60)
    assert store.stored_checkpoints("runs/v/checkpoints") == [(2, "global_step_2")]
    elsewhere = tmp_path / "elsewhere" / "checkpoints"
    assert store.fetch_latest_checkpoint("runs/v/checkpoints", elsewhere).name == "global_step_2"
    assert (elsewhere / VERL_LATEST).read_text() == "2"  # what verl resumes from


class Recording(ArtifactStore):
    """The folder store, recording what metrics.jsonl held each time a checkpoint was stored."""

    def __init__(self, url: str, scratch: Path) -> None:
        super().__init__(url)
        self.scratch = scratch
        self.metrics_when_checkpoint_stored: dict[str, str] = {}

    def put_dir(self, local, key, marker=True):
        stored = super().put_dir(local, key, marker)
        if "/checkpoints/" in key:
            with self.open("runs/1/metrics.jsonl") as handle:
                self.metrics_when_checkpoint_stored[key.rsplit("/", 1)[1]] = handle.read().decode()
        return stored


def test_a_stored_checkpoint_finds_its_steps_metrics_stored_before_it(tmp_path):
    # A machine lost between a checkpoint's upload and the next upload of the run files must not
    # leave a store whose newest checkpoint is ahead of its metrics.jsonl: the next attempt resumes
    # after the checkpoint and appends, so the step would be missing from the file for ever.
    scratch = tmp_path / "scratch"
    (scratch / "checkpoints").mkdir(parents=True)
    store = Recording(str(tmp_path / "store"), scratch)
    uploader = RunUploader(store, "runs/1", scratch)
    with open(scratch / "metrics.jsonl", "a") as metrics:
        for step in (1, 2, 3):
            metrics.write(f'{{"step": {step}}}\n')
            metrics.flush()
            uploader.checkpoint_saved(write_checkpoint(scratch / "checkpoints" / f"checkpoint-{step}"))
            uploader.finish(None, timeout=60) if step == 3 else _wait_stored(uploader, step)
    for step in (1, 2, 3):
        assert f'{{"step": {step}}}' in store.metrics_when_checkpoint_stored[f"checkpoint-{step}"]


def _wait_stored(uploader: RunUploader, step: int) -> None:
    deadline = time.monotonic() + 60
    while not any(key.endswith(f"checkpoint-{step}") for key in uploader.stored):
        assert time.monotonic() < deadline, f"checkpoint-{step} was not stored"
        time.sleep(0.01)


def test_the_uploader_asks_may_write_before_each_upload_and_a_superseded_attempt_stores_nothing(store, tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "checkpoints").mkdir(parents=True)
    (scratch / "metrics.jsonl").write_text('{"step": 1}\n')
    holds = [True]
    asked = []

    def may_write():
        asked.append(holds[0])
        return holds[0]

    uploader = RunUploader(store, "runs/5-f", scratch, may_write=may_write)
    uploader.checkpoint_saved(write_checkpoint(scratch / "checkpoints" / "checkpoint-1", b"1"))
    _wait_stored(uploader, 1)
    holds[0] = False  # another attempt holds the run from here on
    uploader.checkpoint_saved(write_checkpoint(scratch / "checkpoints" / "checkpoint-2", b"2"))
    uploader.finish(write_checkpoint(scratch / "final_model", b"stale"), timeout=10)  # returns: nothing more is stored
    assert uploader.superseded and asked[-1] is False
    assert store.stored_checkpoints("runs/5-f/checkpoints") == [(1, "checkpoint-1")]
    assert not any(key.startswith("final_model") for key in store.list("runs/5-f"))

    # An attempt superseded before its first checkpoint uploads nothing at all.
    other = RunUploader(store, "runs/6-g", scratch, may_write=lambda: False)
    other.checkpoint_saved(scratch / "checkpoints" / "checkpoint-2")
    other.finish(None, timeout=10)
    assert store.list("runs/6-g") == []
