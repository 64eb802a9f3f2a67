"""Celery tasks: thin wrappers over plain functions in ``workers.execute``."""

from workers.celery_app import app
from workers.execute import BUSY, execute_run

# How long a run waits before trying again when its backend is at max_concurrent_runs.
BUSY_RETRY_SECONDS = 30


@app.task(name="workers.execute_run", bind=True, acks_late=True, max_retries=None)
def execute_run_task(self, run_id: int) -> str:
    outcome = execute_run(run_id, worker_name=self.request.hostname or "worker")
    if outcome == BUSY:
        raise self.retry(countdown=BUSY_RETRY_SECONDS)
    return outcome
