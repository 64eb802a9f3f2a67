"""The Celery app of the workers: the web side's app (``webapp.celery_app``, settings from Django's
``CELERY_*``) with the workers' tasks, their ``gpus`` inspect command, and the housekeeping thread
(lost runs, the outbox of queued runs, the graceful stop on SIGTERM; ``workers.housekeeping``)."""

import os

from celery.signals import worker_init, worker_process_init, worker_process_shutdown
from celery.worker.control import inspect_command

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

from webapp.celery_app import app  # noqa: E402 (Django's settings module must be named first)

app.conf.include = ["workers.tasks"]


@inspect_command()
def gpus(state) -> list[dict]:
    """``celery inspect gpus``: the GPUs this worker owns (the workers page shows them)."""
    from workers.gpus import inventory

    return inventory()


from workers import housekeeping  # noqa: E402 (also connects the graceful stop on SIGTERM)

app.steps["worker"].add(housekeeping.HousekeepingStep)


@worker_init.connect
def _not_as_root(**kwargs) -> None:
    """A worker started as root becomes the platform's user before it takes any task."""
    from django.conf import settings

    from webapp.privileges import drop_root

    drop_root(settings.VAR_DIR)


@worker_process_init.connect
def _start_spare_training_process(**kwargs) -> None:
    """Each pool process keeps a training process started ahead (``RUN_WARM_PROCESS``)."""
    from workers.execute import keep_spares

    keep_spares()


@worker_process_shutdown.connect
def _stop_spare_training_process(**kwargs) -> None:
    """A pool process that exits takes its spare with it."""
    from workers.execute import stop_spares

    stop_spares()
