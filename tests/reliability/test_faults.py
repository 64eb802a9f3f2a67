"""Fault injection against real Postgres, Redis and Celery worker processes: a run survives its
worker (SIGKILL of everything, SIGKILL of Celery alone, SIGTERM of a deploy), a Redis outage and a
Postgres outage (both cut by a TCP proxy on loopback), and ends with every logged step stored
exactly once. Heartbeats and thresholds are shortened through settings (harness.FAST_SETTINGS)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from fault_harness import finished as ended
from fault_harness import latest_step, lost_and_doubled, private_trl_queue, slow_run_maker, start_worker, wait_for
from tcp_proxy import TcpProxy
from webapp.runs.models import Run, RunLog
from workers.processes import database_url

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

STEPS = 12
RUN_TIMEOUT = 240


@pytest.fixture
def queue(registry):
    return private_trl_queue("test-faults")


@pytest.fixture
def env(tmp_path):
    return {"DATABASE_URL": database_url(connection.settings_dict), "REDIS_URL": settings.REDIS_URL,
            "PLATFORM_VAR_DIR": str(tmp_path / "var")}


@pytest.fixture
def workers(tmp_path):
    started = []

    def start(queue: str, tag: str, env: dict, machine_faults: bool = True):
        worker = start_worker(queue, tag, env, tmp_path, machine_faults=machine_faults)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(timeout=10)


@pytest.fixture
def slow_run(make_run, queue):
    make = slow_run_maker(make_run)
    return lambda steps=STEPS: make(steps)


def finished(run: Run, *workers) -> Run:
    return ended(run, workers, RUN_TIMEOUT)


def assert_resumed_and_complete(run: Run, steps: int = STEPS) -> None:
    assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
    assert run.steps == steps
    assert lost_and_doubled(run.pk, steps) == (0, 0)
    messages = list(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert any("resuming from checkpoint" in m for m in messages), messages[-20:]
    assert any(f"attempt {run.attempts} of 3, resuming" in m for m in messages)


def test_a_run_lost_with_its_machine_resumes_on_another_worker(queue, env, workers, slow_run):
    first = workers(queue, "a", env)
    run = slow_run()
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.RUNNING, RUN_TIMEOUT, "the run to start", (first,))
    second = workers(queue, "b", env, machine_faults=False)  # the rest of the fleet, started while the first trains
    # Killed the moment step 4's checkpoint is saved: the reports of step 4 (logged just before it)
    # are, as a rule, not stored yet. The resumed attempt starts after step 4 and must still have them.
    saved = Path(env["PLATFORM_VAR_DIR"]) / "runs" / f"{run.pk}-{run.uid.hex}" / "checkpoints" / "checkpoint-4" / "trainer_state.json"
    wait_for(saved.exists, RUN_TIMEOUT, "the checkpoint of step 4", (first,), poll=0.02)
    first.kill()  # worker and training process, SIGKILL: nothing gets to say goodbye
    run = finished(run, second)
    assert_resumed_and_complete(run)
    assert run.attempts == 2 and run.lost_attempts == 1 and run.worker.startswith(second.name)
    assert RunLog.objects.filter(run=run, message__contains="sent no heartbeat").exists()


def test_celery_killed_alone_the_training_process_checkpoints_and_requeues_never_cancelled(queue, env, workers, slow_run):
    first = workers(queue, "a", env)
    run = slow_run()
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.RUNNING, RUN_TIMEOUT, "the run to start", (first,))
    second = workers(queue, "b", env, machine_faults=False)
    wait_for(lambda: latest_step(run.pk) >= 3, RUN_TIMEOUT, "step 3", (first,))
    first.kill_celery_only()
    run = finished(run, second)
    assert_resumed_and_complete(run)
    assert run.cancel_requested_at is None and run.attempts == 2 and run.lost_attempts == 0
    assert RunLog.objects.filter(run=run, message__contains="supervising worker process is gone").exists()


def test_sigterm_requeues_the_run_within_the_grace_period_instead_of_finishing_it(queue, env, workers, slow_run):
    first = workers(queue, "a", env)
    run = slow_run()
    wait_for(lambda: latest_step(run.pk) >= 3, RUN_TIMEOUT, "step 3", (first,))
    first.process.terminate()
    first.process.wait(timeout=60)
    run.refresh_from_db()
    # Had the worker waited for the run (as before), the run would have ended with it.
    assert run.status == Run.Status.QUEUED and run.steps < STEPS
    messages = list(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert any("Attempt 1 ended: The worker is shutting down" in m for m in messages), "\n".join(messages[-8:])
    second = workers(queue, "b", env, machine_faults=False)
    run = finished(run, second)
    assert_resumed_and_complete(run)
    assert run.lost_attempts == 0
def test_a_redis_outage_loses_no_run_and_queues_what_was_created_meanwhile(
    queue, env, workers, slow_run, owner_client, copy_form_data
):
    host, port = settings.REDIS_URL.split("//")[1].split("/")[0].split(":")
    proxy = TcpProxy(host, int(port))
    db_number = settings.REDIS_URL.rsplit("/", 1)[1]
    worker = workers(queue, "a", {**env, "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/{db_number}"}, machine_faults=False)
    try:
        running = slow_run(steps=16)
        wait_for(lambda: latest_step(running.pk) >= 2, RUN_TIMEOUT, "step 2", (worker,))
        proxy.cut()
        response = owner_client.post("/runs/new/", copy_form_data)  # no broker involved: recorded, never a 500
        assert response.status_code == 302, response.content[:2000]
        created = Run.objects.exclude(pk=running.pk).get()
        assert created.status == Run.Status.QUEUED
        time.sleep(4)
        proxy.restore()
        for run in (running, created):
            run = finished(run, worker)
            assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
            assert lost_and_doubled(run.pk, run.steps) == (0, 0) and run.attempts == 1
    finally:
        proxy.close()


def test_a_postgres_outage_buffers_reports_and_training_goes_on(queue, env, workers, slow_run):
    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    through_proxy = database_url({**db, "HOST": "127.0.0.1", "PORT": str(proxy.port)})
    # Its own process tree (machine_faults): the training process, still reporting through the proxy,
    # outlives the run's end by its database retry window once the test has closed the proxy.
    worker = workers(queue, "a", {**env, "DATABASE_URL": through_proxy})
    try:
        run = slow_run(steps=20)
        wait_for(lambda: latest_step(run.pk) >= 3, RUN_TIMEOUT, "step 3", (worker,))
        proxy.cut()
        cut_at_step = latest_step(run.pk)
        time.sleep(8)  # twice RUN_STALE_SECONDS: the run must not be taken for lost
        proxy.restore()
        wait_for(lambda: latest_step(run.pk) > cut_at_step + 3, 60, "the buffered steps", (worker,))
        run = finished(run, worker)
        assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
        assert run.attempts == 1 and run.lost_attempts == 0
        assert lost_and_doubled(run.pk, 20) == (0, 0)
    finally:
        proxy.close()


def finished_run_state(run: Run) -> dict:
    """Everything of a finished run an attempt could write: its row, points, log lines, checkpoint
    rows, and its checkpoints and final model byte for byte."""
    import hashlib

    from webapp.dashboard import series
    from webapp.runs.models import Checkpoint

    run.refresh_from_db()
    folder = run.folder()
    files = {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
             for part in ("checkpoints", "final_model") for path in sorted((folder / part).rglob("*")) if path.is_file()}
    return {
        "row": (run.status, run.attempts, run.steps, run.latest_values, run.final_metrics, run.checkpoint, run.finished_at),
        "points": series.points_after(run.pk, -1),
        "logs": list(RunLog.objects.filter(run=run).values_list("id", "level", "message")),
        "checkpoint_rows": list(Checkpoint.objects.filter(run=run).values_list("step", "path")),
        "files": files,
    }


def test_an_attempt_frozen_past_its_takeover_changes_nothing_of_the_finished_run(queue, env, workers, slow_run):
    first = workers(queue, "a", env)
    run = slow_run()
    wait_for(lambda: latest_step(run.pk) >= 3, RUN_TIMEOUT, "step 3", (first,))
    # A VM freeze (or a long GC, a partition): the worker and its training process stop mid-step.
    frozen = first.tree()
    training_pids = {p.pid for p in first.training_processes()}
    for process in frozen:
        process.suspend()
    second = workers(queue, "b", env, machine_faults=False)
    run = finished(run, second)  # taken over by the second worker, resumed and finished there
    assert run.status == Run.Status.SUCCEEDED and run.attempts == 2, f"{run.error}\n{run.traceback}"
    assert (run.folder() / "final_model").is_dir()
    before = finished_run_state(run)

    for process in frozen:
        process.resume()
    # The old attempt is killed (by its supervisor, or by itself at its first refused write), never asked to checkpoint.
    import psutil

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(lambda: all(gone(pid) for pid in training_pids), 60, "the old training process to stop", (first,))
    time.sleep(3)  # anything still in flight from it
    assert finished_run_state(run) == before
    assert lost_and_doubled(run.pk, STEPS) == (0, 0)


def test_postgres_away_while_a_run_starts_delays_it_and_it_then_succeeds(queue, env, workers, slow_run):
    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    through_proxy = database_url({**db, "HOST": "127.0.0.1", "PORT": str(proxy.port)})
    # No warm process: the training process imports its libraries for seconds after the claim, so
    # its first query (loading the run) certainly falls in the outage.
    worker = workers(queue, "a", {**env, "DATABASE_URL": through_proxy, "RUN_WARM_PROCESS": "0"})
    try:
        run = slow_run(steps=4)
        wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.RUNNING, RUN_TIMEOUT, "the claim", (worker,), poll=0.05)
        proxy.cut()
        time.sleep(15)
        assert Run.objects.get(pk=run.pk).steps == 0  # it waited for the database
        proxy.restore()
        run = finished(run, worker)
        assert run.status == Run.Status.SUCCEEDED, f"{run.error}\n{run.traceback}"
        assert run.lost_attempts == 0 and run.steps == 4
        assert lost_and_doubled(run.pk, 4) == (0, 0)
    finally:
        proxy.close()


def test_the_supervisor_kills_an_attempt_another_holds_with_sigkill_not_a_checkpoint_request(queue, env, workers, slow_run):
    """The training process is paused (it cannot notice anything itself) and the run is given to
    another attempt: its supervisor, finding its heartbeat refused, SIGKILLs the process group at
    once (a SIGTERM would ask it for a checkpoint, and wait)."""
    import psutil
    from django.db.models import F
    from django.db.models.functions import Now

    worker = workers(queue, "a", env)
    run = slow_run()
    wait_for(lambda: latest_step(run.pk) >= 2, RUN_TIMEOUT, "step 2", (worker,))
    training = [p for top in worker.training_processes() for p in (top, *top.children(recursive=True))]
    for process in training:
        process.suspend()
    Run.objects.filter(pk=run.pk).update(attempts=F("attempts") + 1, worker="another-worker", heartbeat_at=Now())
    taken_over = time.monotonic()

    def gone(process) -> bool:
        try:
            return process.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(lambda: all(gone(p) for p in training), 30, "the superseded training process to be killed", (worker,))
    assert time.monotonic() - taken_over < 4  # a heartbeat (1 s) and the kill; no 5 s wait after a SIGTERM
    assert "was given up on; killing its training process" in worker.log_tail(200_000)
