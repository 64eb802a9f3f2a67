"""The plain functions behind the Celery task, called directly."""

import socket
import subprocess
import time
from pathlib import Path


import pytest

from training.backends.base import BuiltinProcessor, TrainResult
from training.backends.processor import register_processor, unregister_processor
from webapp.registry.models import Agent, Backend
from webapp.dashboard.series import points_after
from webapp.runs.downloads import config_yaml
from webapp.runs.models import Run, RunAttempt, RunLog
from webapp.runs.table import run_config
from workers import execute
from workers.execute import BUSY, SKIPPED, claim, train_run
from workers.processes import database_url, terminate_session


def test_claim_skips_a_run_that_is_not_queued(make_run):
    run = make_run()
    run.request_cancel()
    assert claim(run.pk, "w") == SKIPPED


def test_claim_waits_when_the_backend_is_full(make_run):
    Backend.objects.filter(name="trl").update(max_concurrent_runs=1)
    busy, waiting = make_run(), make_run()
    assert isinstance(claim(busy.pk, "w"), Run)
    assert claim(waiting.pk, "w") == BUSY
    assert Run.objects.get(pk=waiting.pk).status == Run.Status.QUEUED


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_train_run_succeeds_and_records_metrics_and_logs(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run()
    claimed = claim(run.pk, "test-worker")
    assert train_run(claimed.pk) == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.traceback
    assert run.steps == 2 and run.finished_at and run.final_config["trainer"]["total_training_steps"] == 2
    assert "reward" in run.final_metrics
    assert [step for step, _ in points_after(run.pk, -1)["reward"]] == [1, 2]
    assert RunLog.objects.filter(run=run, message__contains="step 2/2").exists()
    # The attempt's row: begun by the claim, its host said by the training process, ended by the run's end.
    attempt = RunAttempt.objects.get(run=run)
    assert (attempt.number, attempt.worker, attempt.host) == (1, "test-worker", socket.gethostname())
    assert (attempt.start_step, attempt.end_step, attempt.cause) == (0, 2, RunAttempt.Cause.SUCCEEDED)
    assert attempt.started_at <= attempt.ended_at


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_a_key_without_effect_on_the_backend_is_recorded_with_the_final_config(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run()
    run.config_overrides = {**run.config_overrides, "actor_rollout_ref.rollout.gpu_memory_utilization": 0.9}
    run.save(update_fields=["config_overrides"])
    assert train_run(claim(run.pk, "test-worker").pk) == Run.Status.SUCCEEDED
    run.refresh_from_db()
    ignored = run.final_config["ignored_keys"]
    assert ignored["actor_rollout_ref.rollout.gpu_memory_utilization"]["value"] == 0.9
    assert "verl" in ignored["actor_rollout_ref.rollout.gpu_memory_utilization"]["why"]
    assert "ignored_keys" in config_yaml(run) and not any(key.startswith("ignored_keys") for key in run_config(run))


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_train_run_failure_keeps_error_and_traceback(make_run, tmp_path, settings, registry):
    settings.RUNS_DIR = tmp_path
    broken = Agent.objects.create(name="broken", workflow_class="no_such_module.Workflow")
    run = make_run(agent=broken)
    claim(run.pk, "w")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    assert "no_such_module" in run.error and "Traceback" in run.traceback


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_train_run_stops_when_cancelled(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run(config_overrides={"trainer.total_training_steps": 500, "data.train_batch_size": 2,
                                     "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4})
    claim(run.pk, "w")
    run.request_cancel()
    assert train_run(run.pk) == Run.Status.CANCELLED
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.steps < 500


MISPORTED_AGENT = str(Path(__file__).resolve().parents[1] / "fixtures" / "misported_agent.py") + ":MisportedAgent"


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_a_run_whose_every_episode_raised_fails_with_the_count_and_traceback_on_its_page_and_api(
    make_run, tmp_path, settings, registry, owner_client
):
    settings.RUNS_DIR = tmp_path
    agent = Agent.objects.create(name="misported", agent_class=MISPORTED_AGENT, env_class="examples.frozenlake.FrozenLakeEnv")
    run = make_run(agent=agent, dataset=registry["datasets"]["frozenlake"], reward=None, config_overrides={
        "trainer.total_training_steps": 2, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
        "rllm.agent.max_tokens_per_turn": 1,
    })
    claim(run.pk, "w")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    headline = "4 of 4 episodes in step 1 ended with an error"
    assert run.error.startswith(headline) and "unexpected keyword argument 'confidence_score'" in run.error
    assert 'misported_agent.py", line' in run.traceback and run.steps == 0
    page = owner_client.get(run.get_absolute_url()).content.decode()
    assert headline in page and "misported_agent.py" in page
    shown = owner_client.get(f"/api/runs/{run.pk}/").json()
    assert shown["status"] == "failed" and shown["error"] == run.error and shown["traceback"] == run.traceback


class ZeroStepProcessor(BuiltinProcessor):
    """A backend that returns without training: the worker must not call that a success."""

    def train(self) -> TrainResult:
        return TrainResult(run_path=self.run_path, steps=0)


@pytest.mark.django_db(transaction=True)
def test_a_backend_that_trained_zero_steps_fails_the_run(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    register_processor("zero-steps", ZeroStepProcessor)
    try:
        run = make_run(backend=Backend.objects.create(name="zero-steps", processor="zero-steps"))
        claim(run.pk, "w")
        assert train_run(run.pk) == Run.Status.FAILED
    finally:
        unregister_processor("zero-steps")
    run.refresh_from_db()
    assert run.error == "The zero-steps backend ended after 0 training steps; nothing was learned."


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only not reaped yet
    except FileNotFoundError:
        return False


def test_terminate_session_kills_the_whole_tree(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    process = subprocess.Popen(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; sleep 60"], start_new_session=True)
    for _ in range(50):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    terminate_session(process, wait_seconds=2)
    assert process.poll() is not None
    deadline = time.monotonic() + 10  # killed: gone as soon as the kernel has torn it down
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(grandchild)


def test_database_url_round_trips():
    assert database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"}) == "sqlite:////tmp/x.sqlite3"
    url = database_url({"ENGINE": "django.db.backends.postgresql", "NAME": "test_test", "USER": "postgres",
                        "PASSWORD": "", "HOST": "127.0.0.1", "PORT": 5432})
    assert url == "postgres://postgres@127.0.0.1:5432/test_test"


@pytest.mark.slow  # a database outage injected
@pytest.mark.django_db(transaction=True)
def test_the_claim_is_retried_while_the_database_is_away_and_a_claim_whose_answer_was_lost_is_recognised(
        make_run, tmp_path, settings, monkeypatch):
    """The database away at the claim delays the run; a claim that went through but whose answer
    was lost (the connection dropped after the commit) is this worker's, not another's: the run
    trains in its first attempt, no lost attempt counted."""
    from django.db import OperationalError

    settings.RUNS_DIR = tmp_path
    run = make_run()
    real_claim, calls = execute.claim, []

    def flaky(run_id, worker_name, retried=False):
        calls.append(retried)
        if len(calls) == 1:
            raise OperationalError("could not connect to server")  # before anything happened
        claimed = real_claim(run_id, worker_name, retried)
        if len(calls) == 2:
            raise OperationalError("server closed the connection unexpectedly")  # after the claim's commit
        return claimed

    monkeypatch.setattr(execute, "claim", flaky)
    assert execute.execute_run(run.pk, "test-worker") == Run.Status.SUCCEEDED
    assert calls == [False, True, True]
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.attempts == 1 and run.lost_attempts == 0, run.error
