"""The Celery app. Its settings come from Django's (``CELERY_*`` in webapp/settings.py)."""

import os

from celery import Celery
from celery.signals import worker_ready
from celery.worker.control import inspect_command

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("workers", include=["workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")


@worker_ready.connect
def _fail_runs_of_dead_workers(**kwargs) -> None:
    from webapp.runs.models import Run

    Run.objects.mark_stale_failed()


@inspect_command()
def gpus(state) -> list[dict]:
    """``celery inspect gpus``: the GPUs this worker owns (the workers page shows them)."""
    from workers.gpus import inventory

    return inventory()
