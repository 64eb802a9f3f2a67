"""A real Celery worker process against Redis: a run created through the form view trains to the
end, and a running run cancelled from the browser stops and ends ``cancelled``; the stopped worker
leaves no training process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.db import connection

from webapp.registry.models import Backend
from webapp.dashboard.series import points_after
from webapp.runs.models import Run, RunLog
from workers.processes import database_url

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # slow: trains in the worker

QUEUE = f"test-e2e-{uuid.uuid4().hex[:8]}"  # no other worker listens here, so nothing else takes our runs


@pytest.fixture(scope="module")
def celery_worker(django_db_setup, django_db_blocker, tmp_path_factory):
    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    env = {**os.environ, "DATABASE_URL": db_url, "RUN_CANCEL_GRACE_SECONDS": "30", "RUN_HEARTBEAT_SECONDS": "1",
           "PLATFORM_VAR_DIR": str(settings.VAR_DIR), "RUN_WARM_PROCESS": "1"}  # the production path: a warm process
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", QUEUE, "--concurrency", "1",
             "-n", f"{QUEUE}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
            cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    # The worker's warm process listens once it has imported: the runs below are forked (one claimed
    # before would start plain, as in production).
    warm = Path(settings.VAR_DIR) / "warm" / f"{process.pid}.sock"
    deadline = time.monotonic() + 180
    while not warm.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the worker's warm process never listened"
        time.sleep(0.2)
    yield log_path
    started = psutil.Process(process.pid).create_time()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # Killed, the worker cannot be asked what it left behind.
        process.kill()
        return
    # Neither a training process nor the warm process that forked it outlives the worker.
    warm_process = f"training.isolation.forkserver {settings.VAR_DIR}/warm/{process.pid}.sock"  # workers.processes
    deadline = time.monotonic() + 10
    while orphans := [p for p in psutil.process_iter(["cmdline", "ppid", "create_time"])
                      if p.info["create_time"] >= started and (warm_process in " ".join(p.info["cmdline"] or [])
                      or "workers.child" in " ".join(p.info["cmdline"] or []) and p.info["ppid"] == 1)]:
        assert time.monotonic() < deadline, f"processes outlived their worker: {orphans}"
        time.sleep(0.2)


def wait_for(predicate, timeout: float, what: str, log_path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout} s waiting for {what}; worker log:\n{log_path.read_text()[-4000:]}")


@pytest.fixture
def on_test_queue(registry, celery_worker):
    Backend.objects.filter(name="trl").update(queue=QUEUE)
    yield
    # A run is final before its worker is done with it: the training process folds the run's metric
    # tail after recording the end (``run_status_changed``). The test's database is emptied only once
    # the worker has finished every task it received, or the two lock the same rows.
    wait_for(lambda: worker_idle(celery_worker.read_text()), 60, "the worker to finish its tasks", celery_worker)


def worker_idle(log: str) -> bool:
    received = set(re.findall(r"Task [\w.]+\[([\w-]+)\] received", log))
    done = set(re.findall(r"Task [\w.]+\[([\w-]+)\] (?:succeeded|failed|raised)", log))
    return received <= done


def create_run(client, data) -> Run:
    response = client.post("/runs/new/", data)
    assert response.status_code == 302, response.context["form"].errors.as_data()
    return Run.objects.get()


def test_run_created_in_the_browser_trains_to_the_end(celery_worker, on_test_queue, owner_client, copy_form_data):
    run = create_run(owner_client, copy_form_data)
    wait_for(lambda: Run.objects.get(pk=run.pk).is_final, 300, "the run to end", celery_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
    assert run.worker.startswith(QUEUE) and run.started_at and run.finished_at
    assert run.steps == 3 and run.final_config and "reward" in run.final_metrics
    assert [step for step, _ in points_after(run.pk, -1)["reward"]] == [1, 2, 3]
    messages = list(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert any("Claimed by" in m for m in messages) and any("step 3/3" in m for m in messages)
    # The worker started its warm process (workers.celery_app) and it forked this run's training process.
    assert any("its training process forked from the worker's warm process" in m for m in messages), messages


def test_cancel_from_the_browser_stops_a_running_run(celery_worker, on_test_queue, owner_client, copy_form_data):
    copy_form_data["overrides"] = copy_form_data["overrides"].replace("total_training_steps=3", "total_training_steps=1000")
    run = create_run(owner_client, copy_form_data)
    wait_for(lambda: Run.objects.get(pk=run.pk).latest_values, 300, "the first training step", celery_worker)
    assert owner_client.post(f"/runs/{run.pk}/cancel/").status_code == 302
    wait_for(lambda: Run.objects.get(pk=run.pk).is_final, 90, "the run to stop", celery_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED, f"{run.error}\n{run.traceback}"
    assert run.steps < 1000  # stopped within wait_for's 90 s above


def test_a_run_trained_by_the_worker_keeps_every_episode_and_exports_them(celery_worker, on_test_queue, owner_client,
                                                                          copy_form_data, api_client, owner):
    """The episode store through the platform's path: the worker's training process writes every
    episode; the API's Parquet export, read with pandas, holds each one's tokens as training produced
    them (the tokens decode to the reply the reward scored, and the reward is that reply's score)."""
    import io
    import json

    import pandas as pd
    from transformers import AutoTokenizer

    from training.rewards.builtin import char_accuracy

    run = create_run(owner_client, copy_form_data)
    wait_for(lambda: Run.objects.get(pk=run.pk).is_final, 300, "the run to end", celery_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
    response = api_client(owner).get(f"/api/runs/{run.pk}/episodes/", {"format": "parquet", "split": "train"})
    assert response.status_code == 200
    frame = pd.read_parquet(io.BytesIO(b"".join(response.streaming_content)))
    assert sorted(frame.groupby("step").size().items()) == [(1, 4), (2, 4), (3, 4)]  # 2 prompts x 2 episodes a step
    tokenizer = AutoTokenizer.from_pretrained(f"{run.run_path}/base_model")
    for _, episode in frame.iterrows():
        turn = json.loads(episode["turns"])[0]
        reply = tokenizer.decode(list(episode["token_ids"]), skip_special_tokens=True)
        assert reply == turn["response"] and list(episode["mask"]) == [1] * len(episode["token_ids"])
        prompt = turn["messages"][0]["content"]
        assert tokenizer.decode(list(episode["prompt_ids"])) == prompt
        assert episode["reward"] == char_accuracy("copy", reply, prompt[:-1], {}).reward
