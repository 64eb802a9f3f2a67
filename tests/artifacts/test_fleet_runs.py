"""Runs trained by real Celery workers that keep their files on an S3-compatible store (moto's
server mode on loopback, standing in for S3/MinIO): each worker has its own scratch folder (its own
PLATFORM_VAR_DIR, as on separate machines), and all they share is Postgres, Redis and the store."""

from __future__ import annotations

import io
import sys
import tarfile
import time
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from fault_harness import finished as ended  # noqa: E402
from fault_harness import latest_step, lost_and_doubled, private_trl_queue, slow_run_maker, start_worker, wait_for  # noqa: E402

from training.platform.artifacts import STORED_MARKER, ArtifactStore
from webapp.dashboard import episodes as episode_store
from webapp.dashboard.models import StoredEpisode
from webapp.runs.models import Run, RunLog
from workers.processes import database_url

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RUN_TIMEOUT = 300


@pytest.fixture
def queue(registry):
    return private_trl_queue("test-artifacts")


@pytest.fixture
def fleet(tmp_path, s3_url, s3_env):
    """Start workers that share the store: ``start(tag)`` gives each its own scratch folder."""
    started = []
    base = {"DATABASE_URL": database_url(connection.settings_dict), "REDIS_URL": settings.REDIS_URL,
            "ARTIFACTS_URL": s3_url, "ARTIFACTS_RETRY_MAX_SECONDS": "2", **s3_env}

    def start(queue: str, tag: str, machine_faults: bool = True):  # fault_harness.start_worker's
        worker = start_worker(queue, tag, {**base, "PLATFORM_VAR_DIR": str(tmp_path / f"machine-{tag}")}, tmp_path,
                              machine_faults=machine_faults)
        started.append(worker)
        return worker

    start.store = ArtifactStore(s3_url)
    start.scratch = lambda tag: tmp_path / f"machine-{tag}" / "runs"
    yield start
    for worker in started:
        worker.stop(timeout=10)


@pytest.fixture
def slow_run(make_run, queue):
    return slow_run_maker(make_run)


def streamed(response) -> bytes:
    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def finished(run: Run, *workers) -> Run:
    return ended(run, workers, RUN_TIMEOUT)


def messages(run: Run) -> list[str]:
    return list(RunLog.objects.filter(run=run).values_list("message", flat=True))


def test_a_run_killed_with_its_machine_resumes_on_another_from_the_stores_checkpoint(
    queue, fleet, slow_run, settings, s3_url, owner_client
):
    steps = 10
    first = fleet(queue, "a")
    run = slow_run(steps)
    prefix = f"runs/{run.pk}-{run.uid.hex}"
    wait_for(lambda: latest_step(run.pk) >= 3 and fleet.store.stored_checkpoints(f"{prefix}/checkpoints"),
             RUN_TIMEOUT, "step 3 and a stored checkpoint", (first,))
    first.kill()  # the machine is lost: worker and training process SIGKILLed, its disk out of reach
    second = fleet(queue, "b", machine_faults=False)  # another machine: its scratch folder has nothing of this run
    run = finished(run, second)

    assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
    assert run.steps == steps and run.attempts == 2 and run.lost_attempts == 1
    assert lost_and_doubled(run.pk, steps) == (0, 0)  # every step stored once
    log = messages(run)
    fetched = [m for m in log if m.startswith("fetched checkpoint checkpoint-") and "from the artifact store" in m]
    assert len(fetched) == 1, log[-30:]
    resumed_at = int(fetched[0].split("checkpoint-")[1].split(" ")[0])
    # The second machine trained in its own scratch folder, from the checkpoint it fetched there.
    fetched_copy = fleet.scratch("b") / f"{run.pk}-{run.uid.hex}" / "checkpoints" / f"checkpoint-{resumed_at}"
    assert any(m == f"resuming from checkpoint {fetched_copy}" for m in log), log[-20:]
    # The store holds every checkpoint whole, the final model, the run files and both attempts' logs.
    stored = [step for step, _ in fleet.store.stored_checkpoints(f"{prefix}/checkpoints")]
    assert stored == list(range(1, steps + 1))
    keys = set(fleet.store.list(prefix))
    assert {f"final_model/{STORED_MARKER}", "config.yaml", "metrics.jsonl", "logs/attempt-1.log", "logs/attempt-2.log"} <= keys
    assert any(k.startswith("final_model/") and k.endswith(".safetensors") for k in keys)
    with fleet.store.open(f"{prefix}/metrics.jsonl") as handle:
        logged = {int(line.split(b'"step": ')[1].split(b",")[0]) for line in handle if line.strip()}
    assert set(range(1, steps + 1)) <= logged
    # The web server (this process, on no worker's machine) offers the final model from the store.
    settings.ARTIFACTS_URL = s3_url
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert f"/runs/{run.pk}/models/final_model.tar.gz" in page
    archive = streamed(owner_client.get(f"/runs/{run.pk}/models/final_model.tar.gz"))
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        weights = tar.extractfile(f"run-{run.pk}-final_model/model.safetensors").read()
    with fleet.store.open(f"{prefix}/final_model/model.safetensors") as handle:
        assert weights == handle.read() and len(weights) > 1000


def test_the_store_down_for_30_s_mid_run_loses_nothing(queue, fleet, slow_run, s3_server, settings, s3_url):
    steps = 40
    worker = fleet(queue, "a", machine_faults=False)  # the store goes down, not the machine
    run = slow_run(steps, **{"trainer.save_freq": 5})
    prefix = f"runs/{run.pk}-{run.uid.hex}"
    wait_for(lambda: fleet.store.stored_checkpoints(f"{prefix}/checkpoints"), RUN_TIMEOUT, "a stored checkpoint", (worker,))
    s3_server.stop()
    try:
        stopped_at = latest_step(run.pk)
        time.sleep(30)
        trained_meanwhile = latest_step(run.pk) - stopped_at
        status_meanwhile = Run.objects.get(pk=run.pk).status
    finally:
        s3_server.start()
    run = finished(run, worker)

    assert trained_meanwhile > 0, "training waited for the store"
    assert status_meanwhile == Run.Status.RUNNING  # never succeeded before its final model is stored
    assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
    assert run.steps == steps and lost_and_doubled(run.pk, steps) == (0, 0)
    stored = [step for step, _ in fleet.store.stored_checkpoints(f"{prefix}/checkpoints")]
    assert stored == list(range(5, steps + 1, 5))
    assert fleet.store.exists(f"{prefix}/final_model/{STORED_MARKER}")
    log = messages(run)
    assert len([m for m in log if "artifact store unreachable" in m]) == 1, log
    assert any("artifact store reachable again" in m for m in log), "\n".join(log)
    # Every episode of every step, those trained while the store was away too, stored once (the
    # index's unique key would refuse a second row) with its body readable from the store.
    episodes = StoredEpisode.objects.filter(run=run, split="train")
    assert sorted(episodes.values_list("step", "position")) == [(s, p) for s in range(1, steps + 1) for p in range(4)]
    assert not [m for m in log if "not kept in the episode store" in m], log
    settings.ARTIFACTS_URL = s3_url
    during = episodes.get(step=stopped_at + 1, position=3)
    assert episode_store.detail(during)["token_ids"] and during.body_key.startswith(f"{prefix}/episodes/train/")
