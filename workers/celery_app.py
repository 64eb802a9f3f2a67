"""The Celery app of the workers: the web side's app (``webapp.celery_app``, settings from Django's
``CELERY_*``) with the workers' tasks (``workers.tasks``, included by name), their ``gpus`` inspect
command, the housekeeping thread (lost runs, the outbox of queued runs, the graceful stop on
SIGTERM; ``workers.housekeeping``) and the worker's warm process (``RUN_WARM_PROCESS``), which
forks its pool processes' children."""

import os

import django
from celery.signals import worker_init, worker_shutdown
from celery.worker.control import inspect_command

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()  # the modules below use the ORM at import; Celery's own Django fix-up sets it up only later

from django.conf import settings  # noqa: E402 (after Django's setup, as every import below)

from webapp.celery_app import app  # noqa: E402
from webapp.privileges import drop_root  # noqa: E402
from workers.database import bound_idle_transactions  # noqa: E402
from workers import housekeeping  # noqa: E402 (also connects the graceful stop on SIGTERM)
from workers.gpus import inventory  # noqa: E402
from workers.processes import start_warm_process, stop_warm_process  # noqa: E402

app.conf.include = ["workers.tasks"]
app.steps["worker"].add(housekeeping.HousekeepingStep)


@inspect_command()
def gpus(state) -> list[dict]:
    """``celery inspect gpus``: the GPUs this worker owns (the workers page shows them)."""
    return inventory()


_warm_process = None


@worker_init.connect
def _not_as_root(**kwargs) -> None:
    """A worker started as root becomes the platform's user before it takes any task. Its
    transactions (and its pool processes') are bounded (``workers.database``). With
    ``RUN_WARM_PROCESS`` it starts its warm process, which its pool processes fork their children from."""
    global _warm_process
    drop_root(settings.VAR_DIR)
    bound_idle_transactions()
    if settings.RUN_WARM_PROCESS and not inventory():  # CUDA and fork do not mix: with GPUs each child starts plain
        _warm_process = start_warm_process()


@worker_shutdown.connect
def _stop_warm_process(**kwargs) -> None:
    """The worker's warm process goes with it (the children it forked are sessions of their own:
    the graceful stop has asked them to stop already)."""
    if _warm_process is not None:
        stop_warm_process(_warm_process)
