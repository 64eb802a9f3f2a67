"""Evaluations of checkpoints on a real Celery worker (Redis, the test database): asked through the
API, each scores a stored checkpoint of a run on a dataset of the project in the worker's child
process (the tiny model, CPU) and leaves one table row per (run, checkpoint, data source); one whose
checkpoint was removed after it was asked fails naming that."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
from django.conf import settings
from django.db import connection

from standins.checkpoints import with_checkpoints
from webapp.checkpoints.models import Evaluation
from webapp.registry.models import Backend
from workers.processes import database_url

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

QUEUE = f"test-eval-{uuid.uuid4().hex[:8]}"  # no other worker listens here


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, tmp_path_factory):
    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    env = {**os.environ, "DATABASE_URL": db_url, "PLATFORM_VAR_DIR": str(settings.VAR_DIR), "PLAYGROUND_QUEUE": "",
           "RUN_WARM_PROCESS": "1"}  # its worker evaluates several checkpoints: each forked, as in production
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", QUEUE, "--concurrency", "1",
             "-n", f"{QUEUE}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
            cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    yield log_path
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def wait_until_final(ids: list[int], log_path, timeout: float = 300) -> list[Evaluation]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(Evaluation.objects.filter(pk__in=ids).order_by("pk"))
        if all(e.is_final for e in found):
            return found
        time.sleep(0.5)
    pytest.fail(f"evaluations {ids} did not end in {timeout} s; worker log:\n{log_path.read_text()[-4000:]}")


@pytest.fixture
def two_runs(registry, make_run, project, settings):
    settings.PLAYGROUND_QUEUE = ""
    Backend.objects.filter(name="trl").update(queue=QUEUE)
    runs = [with_checkpoints(make_run(name=f"run {n}", project=project, visibility="team", status="succeeded", steps=4),
                             [2, 4]) for n in (1, 2)]
    yield runs
    for run in runs:
        shutil.rmtree(run.folder(), ignore_errors=True)


def test_evaluations_run_on_a_worker_and_fill_the_table(worker, two_runs, registry, api_client, owner, project):
    client = api_client(owner)
    url = f"/api/projects/{project.pk}/evaluations/"
    dataset = registry["datasets"]["copy"].pk
    first, second = two_runs
    asked = [client.post(url, {"run": first.pk, "step": 2, "dataset": dataset, "max_tasks": 4}, format="json"),
             client.post(url, {"run": second.pk, "step": 4, "dataset": dataset, "max_tasks": 4, "episodes_per_task": 2},
                         format="json")]
    for response in asked:
        assert response.status_code == 201, response.content
        assert response.json()["status"] == "queued" and response.json()["queue"] == QUEUE and response.json()["split"] == "test"
    done = wait_until_final([r.json()["id"] for r in asked], worker)
    assert [e.status for e in done] == ["succeeded", "succeeded"], [e.error for e in done]
    assert all(e.worker.startswith(QUEUE) and e.tasks == 4 for e in done)

    rows = client.get(url, {"sort": "run"}).json()["rows"]
    assert [(r["run"], r["checkpoint"], r["data_source"], r["dataset"], r["k"], r["tasks"]) for r in rows] == [
        (first.pk, "checkpoint-2", "copy", "copy", 1, 4), (second.pk, "checkpoint-4", "copy", "copy", 2, 4)]
    greedy, sampled = rows
    assert 0 <= greedy["reward"] <= 1 and greedy["pass_at_k"] == greedy["pass_at_1"]  # one greedy episode per task
    assert 0 <= sampled["pass_at_1"] <= sampled["pass_at_k"] <= 1  # pass@2 is at least pass@1
    by_run_descending = client.get(url, {"sort": "run", "descending": "true"}).json()["rows"]
    assert [r["run"] for r in by_run_descending] == [second.pk, first.pk]


def test_an_evaluation_whose_checkpoint_is_gone_fails_naming_it(worker, two_runs, registry, owner, project):
    """Rotated out between the request and the worker: the row is as the API left it, the folder gone."""
    from webapp.celery_app import app
    from webapp.checkpoints.logic import EVALUATE_CHECKPOINT

    run = two_runs[0]
    shutil.rmtree(run.folder() / "checkpoints" / "checkpoint-2")
    evaluation = Evaluation.objects.create(project=project, run=run, step=2, dataset=registry["datasets"]["copy"], split="test",
                                           max_tasks=2, created_by=owner, queue=QUEUE)
    app.send_task(EVALUATE_CHECKPOINT, args=[evaluation.pk], queue=QUEUE)
    (done,) = wait_until_final([evaluation.pk], worker)
    assert done.status == "failed" and f"Run {run.pk} keeps no checkpoint at step 2" in done.error
    assert not done.scores.exists()


def test_a_lost_message_is_sent_again_and_a_lost_workers_evaluation_fails_naming_it(worker, two_runs, registry, owner, project,
                                                                                     settings):
    """Nothing stuck: a queued evaluation whose message never reached a worker (sent, then lost with
    the broker's queue) is sent again by the housekeeping sweep and scored; a running one whose worker
    is gone (it never wrote its row since) is failed, naming that worker, and frees its project slot."""
    from datetime import timedelta

    from django.utils import timezone

    from workers.housekeeping import recover_lost_evaluations

    settings.RUN_REDISPATCH_SECONDS = 60
    long_ago = timezone.now() - timedelta(minutes=10)
    run, dataset = two_runs[0], registry["datasets"]["copy"]
    lost_message = Evaluation.objects.create(project=project, run=run, step=2, dataset=dataset, split="test", max_tasks=2,
                                             created_by=owner, queue=QUEUE, sent_at=long_ago)  # no message on the queue
    lost_worker = Evaluation.objects.create(project=project, run=run, step=4, dataset=dataset, split="test", max_tasks=2,
                                            created_by=owner, queue=QUEUE, status="running", worker="gone@nowhere",
                                            started_at=long_ago, sent_at=long_ago)
    outcome = recover_lost_evaluations()
    assert outcome == {lost_message.pk: "sent again", lost_worker.pk: "failed"}
    lost_worker.refresh_from_db()
    assert lost_worker.status == "failed" and "its worker (gone@nowhere) was lost" in lost_worker.error
    (done,) = wait_until_final([lost_message.pk], worker)
    assert done.status == "succeeded" and done.worker.startswith(QUEUE), done.error
    assert recover_lost_evaluations() == {}  # nothing more to do
