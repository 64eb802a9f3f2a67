"""A worker keeps a training process started ahead (its libraries imported): the next run it
claims is trained by that process, and a new one is started once the run is over. A spare started
with another environment (here: another database) is never used for a run."""

from __future__ import annotations

import pytest

from webapp.runs.models import Run, RunLog
from workers import execute
from workers.processes import terminate_session

pytestmark = pytest.mark.django_db(transaction=True)  # the training process reads the committed rows


@pytest.fixture
def spares(monkeypatch, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    settings.RUN_WARM_PROCESS = True
    monkeypatch.setattr(execute, "_spare", None)
    monkeypatch.setattr(execute, "_keep_spares", False)
    yield
    if execute._spare is not None:
        terminate_session(execute._spare[0], wait_seconds=5)


def claimed_line(run: Run) -> str:
    return RunLog.objects.filter(run=run, message__startswith="Claimed by").get().message


def test_a_claimed_run_is_trained_by_the_process_started_ahead(make_run, spares):
    execute.keep_spares()
    spare = execute._spare[0]
    run = make_run()
    assert execute.execute_run(run.pk, "warm-worker") == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.steps == 2, f"{run.error}\n{run.traceback}"
    assert "the training process started ahead takes it" in claimed_line(run)
    assert spare.returncode == 0, "the run was not trained by the spare"
    assert "training on backend trl" in (run.folder() / "process.log").read_text()
    assert execute._spare is not None and execute._spare[0].pid != spare.pid and execute._spare[0].poll() is None


def test_a_spare_with_another_environment_is_not_used(spares):
    execute.keep_spares()
    spare, env = execute._spare
    assert execute._take_spare({**env, "DATABASE_URL": "postgres://elsewhere/other"}) is None
    assert spare.wait(timeout=10) is not None, "the unusable spare was left running"
    assert execute._spare is None
