"""Celery tasks: thin wrappers over plain functions. Registered by name (``shared_task``), so
nothing below imports this module: the dispatchers send ``EXECUTE_RUN`` and ``ANSWER_REQUEST`` by
name, and ``workers.celery_app`` includes it by name."""

from celery import shared_task

from webapp.integrations.alerts import deliver_due, next_due_in
from workers.evaluation import EVALUATE_CHECKPOINT, run_evaluation
from workers.execute import EXECUTE_RUN, execute_run
from workers.playground import ANSWER_REQUEST, answer_request


@shared_task(name=EXECUTE_RUN, bind=True)
def execute_run_task(self, run_id: int) -> str:
    # A run whose backend is full stays queued with a later dispatch_at: the dispatcher sends it again.
    return execute_run(run_id, worker_name=self.request.hostname or "worker")


@shared_task(name="integrations.deliver_alerts", bind=True, max_retries=None)
def deliver_alerts_task(self) -> dict:
    """Send the alerts that are due; come back when the next retry is due."""
    counts = deliver_due()
    wait = next_due_in()
    if wait is not None:
        raise self.retry(countdown=max(1.0, wait))
    return counts


@shared_task(name=ANSWER_REQUEST, bind=True)
def playground_answer_task(self, request_id: int) -> str:
    """Answer one playground request on this worker's slot (``workers.playground``)."""
    return answer_request(request_id, worker_name=self.request.hostname or "worker")


@shared_task(name=EVALUATE_CHECKPOINT, bind=True)
def evaluate_checkpoint_task(self, evaluation_id: int) -> str:
    """Score one checkpoint on a dataset on this worker's slot (``workers.evaluation``)."""
    return run_evaluation(evaluation_id, worker_name=self.request.hostname or "worker")
