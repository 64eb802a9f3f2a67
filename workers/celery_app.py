"""The Celery app of the workers: the web side's app (``webapp.celery_app``, settings from Django's
``CELERY_*``) with the workers' tasks (``workers.tasks``, included by name), their ``gpus`` inspect
command, the housekeeping thread (lost runs, the outbox of queued runs, the graceful stop on
SIGTERM; ``workers.housekeeping``) and each pool process's spare training process."""

import os

import django
from celery.signals import worker_init, worker_process_init, worker_process_shutdown
from celery.worker.control import inspect_command

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()  # the modules below use the ORM at import; Celery's own Django fix-up sets it up only later

from django.conf import settings  # noqa: E402 (after Django's setup, as every import below)

from webapp.celery_app import app  # noqa: E402
from webapp.privileges import drop_root  # noqa: E402
from workers.database import bound_idle_transactions  # noqa: E402
from workers import housekeeping  # noqa: E402 (also connects the graceful stop on SIGTERM)
from workers.execute import keep_spares, stop_spares  # noqa: E402
from workers.gpus import inventory  # noqa: E402

app.conf.include = ["workers.tasks"]
app.steps["worker"].add(housekeeping.HousekeepingStep)


@inspect_command()
def gpus(state) -> list[dict]:
    """``celery inspect gpus``: the GPUs this worker owns (the workers page shows them)."""
    return inventory()


@worker_init.connect
def _not_as_root(**kwargs) -> None:
    """A worker started as root becomes the platform's user before it takes any task. Its
    transactions (and its pool processes') are bounded (``workers.database``)."""
    drop_root(settings.VAR_DIR)
    bound_idle_transactions()


@worker_process_init.connect
def _start_spare_training_process(**kwargs) -> None:
    """Each pool process keeps a training process started ahead (``RUN_WARM_PROCESS``)."""
    keep_spares()


@worker_process_shutdown.connect
def _stop_spare_training_process(**kwargs) -> None:
    """A pool process that exits takes its spare with it."""
    stop_spares()
