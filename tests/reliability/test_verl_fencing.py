"""A verl attempt frozen past its takeover, with real Celery workers, Postgres and Redis: when it
wakes it changes nothing of the run the next attempt finished. verl's trainer cannot run here
(CUDA GPUs, vLLM): the run's backend is ``verl-standin`` (``tests/standins/verl_trainer.py``), the
verl backend with a stand-in of verl's trainer loop in place of ``run_ppo``, which writes what
verl writes (metrics through verl's ``Tracking``, rollouts, ``global_step_N`` and its marker) and
asks nothing of ours. What is fenced is the verl backend's own: its metrics bridge, its checkpoint
publisher, the attempt's folder."""

from __future__ import annotations

import os
import time
import uuid

import psutil
import pytest

import standins.verl_trainer  # noqa: F401 - registers verl-standin here too (the run is checked against it)
from fault_harness import ROOT, latest_step, lost_and_doubled, wait_for
from fault_harness import finished as ended
from test_faults import env, finished_run_state, workers  # noqa: F401 - fixtures
from training.backends.verl.backend import latest_checkpoint
from webapp.registry.models import Backend
from webapp.runs.models import Run, RunLog

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS = 12
RUN_TIMEOUT = 240


@pytest.fixture
def queue():
    return f"test-verl-fencing-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def verl_env(env):  # noqa: F811 - test_faults' env, with the stand-in loaded as a plugin
    return {**env, "TRAINING_PLUGINS": "examples,standins.verl_trainer", "VERL_STANDIN_STEP_SECONDS": "0.5",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def verl_run(make_run, queue):
    backend = Backend.objects.create(name="verl-standin", processor="verl-standin", queue=queue, max_attempts=3)

    def make():
        run = make_run(backend=backend, config_overrides={
            "trainer.total_training_steps": STEPS, "trainer.save_freq": 1, "trainer.val_before_train": False,
            "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4})
        run.enqueue()
        return run

    return make


def published_checkpoint(run_id: int) -> str | None:
    """The newest checkpoint published into the run's folder (as recorded by the worker that claimed it)."""
    return latest_checkpoint(Run.objects.get(pk=run_id).folder() / "checkpoints")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_verl_attempt_frozen_past_its_takeover_changes_nothing_of_the_finished_run(queue, verl_env, workers, verl_run):  # noqa: F811
    first = workers(queue, "a", verl_env)
    run = verl_run()
    # Frozen once step 3 is stored and a checkpoint is published (verl saves a step's checkpoint before it
    # logs the step, and it is published only after), so that the next attempt has one to resume from.
    # The folder is the one the worker recorded on the run (``run`` here is from before the claim).
    wait_for(lambda: latest_step(run.pk) >= 3 and published_checkpoint(run.pk) is not None, RUN_TIMEOUT,
             "step 3 and a published checkpoint", (first,))
    frozen = first.tree()  # the worker, its training process and its verl job, stopped mid-step
    training_pids = {p.pid for p in first.training_processes()}
    for process in frozen:
        process.suspend()
    second = workers(queue, "b", verl_env)
    run = ended(run, (second,), RUN_TIMEOUT)
    assert run.status == Run.Status.SUCCEEDED and run.attempts == 2, f"{run.error}\n{run.traceback}"
    assert run.checkpoint == str(run.folder() / "checkpoints" / f"global_step_{STEPS}")
    messages = list(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert any("resuming from checkpoint" in m and "/checkpoints/global_step_" in m for m in messages), messages[-20:]
    before = finished_run_state(run)
    assert f"global_step_{STEPS}/actor/model.pt" in "\n".join(before["files"])

    for process in frozen:
        process.resume()
    # It wakes: its verl job goes on a moment, its bridge and publisher are refused, and it is killed.
    wait_for(lambda: all(gone(pid) for pid in training_pids), 60, "the old training process to stop", (first,))
    time.sleep(3)  # anything still in flight from it
    assert finished_run_state(run) == before
    assert lost_and_doubled(run.pk, STEPS) == (0, 0)
    # The run's checkpoints (its newest trainer.max_checkpoints) are the second attempt's.
    published = list((run.folder() / "checkpoints").glob("global_step_*/actor/model.pt"))
    assert len(published) == 2 and all("attempt 2" in path.read_text() for path in published)
