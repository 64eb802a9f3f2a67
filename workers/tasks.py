"""Celery tasks: thin wrappers over plain functions in ``workers.execute``."""

from workers.celery_app import app
from workers.execute import execute_run


@app.task(name="workers.execute_run", bind=True, acks_late=True)
def execute_run_task(self, run_id: int) -> str:
    # A run whose backend is full stays queued with a later dispatch_at: the dispatcher sends it again.
    return execute_run(run_id, worker_name=self.request.hostname or "worker")


@app.task(name="integrations.deliver_alerts", bind=True, acks_late=True, max_retries=None)
def deliver_alerts_task(self) -> dict:
    """Send the alerts that are due; come back when the next retry is due."""
    from webapp.integrations.alerts import deliver_due, next_due_in

    counts = deliver_due()
    wait = next_due_in()
    if wait is not None:
        raise self.retry(countdown=max(1.0, wait))
    return counts


@app.task(name="workers.playground_answer", bind=True, acks_late=True)
def playground_answer_task(self, request_id: int) -> str:
    """Answer one playground request on this worker's slot (``workers.playground``)."""
    from workers.playground import answer_request

    return answer_request(request_id, worker_name=self.request.hostname or "worker")
