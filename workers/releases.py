"""Deleting what a run that ended without its training process had provisioned on a remote service.

A run lost for the last time (or cancelled with its worker gone) ran no teardown, so a fireworks
trainer job and deployment it started would go on billing. ``release_in_background`` marks the
deletion on the run's row and starts it in a thread of its own; ``retry_remote_releases`` (the
liveness sweep, ``workers.housekeeping``) starts the ones a refusal or a worker's exit left.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models.functions import Now

from training.backends.processor import get_processor_class
from webapp.runs.models import Run, RunLog

logger = logging.getLogger(__name__)

# Retries of lost remote runs' deletions: settings.RUN_RELEASE_* (backoff, batch, lease).

_releases: list[threading.Thread] = []


def release_in_background(run) -> threading.Thread | None:
    """Record that ``run``'s remote resources are to be deleted (on its row, before anything is
    tried), then ``release_remote_resources`` in a thread of its own: the service's SDK retries an
    unreachable service for minutes per call, and neither the sweep nor the dispatcher may wait.
    None when another sweep holds the deletion."""
    Run.objects.filter(pk=run.pk, remote_release_pending=False).update(
        remote_release_pending=True, remote_release_attempts=0, remote_release_at=Now())
    return _start_release(run)


def retry_remote_releases(limit: int | None = None) -> list[int]:
    """Start the deletions due again (refused before, or cut short by a worker's exit), at most
    ``limit`` (default ``RUN_RELEASE_BATCH``). Returns the ids of the runs whose deletion was started."""
    limit = settings.RUN_RELEASE_BATCH if limit is None else limit
    due = (Run.objects.filter(remote_release_pending=True, remote_release_at__lte=Now())
           .select_related("backend").order_by("remote_release_at")[:limit])
    return [run.pk for run in due if _start_release(run) is not None]


def _start_release(run) -> threading.Thread | None:
    # Take it: another worker's sweep may look at the same row.
    taken = Run.objects.filter(pk=run.pk, remote_release_pending=True, remote_release_at__lte=Now()).update(
        remote_release_at=Now() + timedelta(seconds=settings.RUN_RELEASE_LEASE_SECONDS))
    if not taken:
        return None

    def release() -> None:
        try:
            release_remote_resources(run)
        except Exception:  # noqa: BLE001 (logged: a thread's exception would otherwise vanish; the lease runs out and a later sweep tries again)
            logger.exception("Run %s: releasing its remote resources failed.", run.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=release, name=f"release-run-{run.pk}", daemon=True)
    _releases[:] = [t for t in _releases if t.is_alive()] + [thread]
    thread.start()
    return thread


def wait_for_releases(timeout: float | None = None) -> None:
    """Wait for the releases started so far (tests; a worker's shutdown)."""
    for thread in list(_releases):
        thread.join(timeout)


def release_remote_resources(run) -> None:
    """A run ended without its training process (lost for the last time, or cancelled with its
    worker gone), so no teardown ran: what it provisioned on a remote service (a fireworks trainer
    job and deployment, billed while they exist) is deleted here, through its backend's
    ``release_abandoned``, from the ids recorded on the run and its folder's ledger. The outcome is
    added to the run's error and log. What could not be deleted keeps the run's
    ``remote_release_pending`` and is tried again by a later sweep (``retry_remote_releases``,
    with backoff) until the service says it is gone. A re-queued run needs none of this: its next
    attempt deletes what the lost one left before it provisions its own."""
    def done() -> None:
        Run.objects.filter(pk=run.pk).update(remote_release_pending=False, remote_release_at=None)

    try:
        release = getattr(get_processor_class(run.backend.processor), "release_abandoned", None)
    except Exception as exc:  # a plugin backend that does not import here has nothing to release from here
        logger.warning("Run %s: backend %s does not load here (%s); nothing released.", run.pk, run.backend.processor, exc)
        return done()
    if release is None:
        return done()
    remote_ids, tries = Run.objects.filter(pk=run.pk).values_list("remote_ids", "remote_release_attempts").first() or ({}, 0)
    remote = (run.final_config or {}).get("remote") or {}
    base_url = remote.get("base_url") or (run.backend.default_config or {}).get("remote.base_url")
    try:
        released, left = release(remote_ids or {}, str(run.folder()), base_url)
    except Exception as exc:  # never let one run's service stop the sweep
        released, left = [], [f"whatever is recorded on the run ({exc.__class__.__name__}: {exc})"]
    tries += 1
    service = run.backend.processor
    if not left:
        done()
    else:
        delay = min(settings.RUN_RELEASE_BACKOFF_SECONDS * 2 ** (tries - 1), settings.RUN_RELEASE_BACKOFF_MAX_SECONDS)
        Run.objects.filter(pk=run.pk).update(remote_release_attempts=tries, remote_release_at=Now() + timedelta(seconds=delay))
    notes = []
    if released:
        later = f" (try {tries})" if tries > 1 else ""
        notes.append(f"Its {service} resources were deleted{later}: {', '.join(released)}.")
        RunLog.objects.create(run=run, level="WARNING", message=notes[-1])
    if left:
        message = (f"Its {service} resources could not be deleted and may still be billing: {', '.join(left)}; "
                   f"trying again in {delay} s (try {tries}), or delete them in the {service} console.")
        RunLog.objects.create(run=run, level="ERROR", message=message)
        logger.error("Run %s: %s", run.pk, message)
        if tries == 1:  # the error names it once; each later try is in the log
            notes.append(f"Its {service} resources could not be deleted and may still be billing: {', '.join(left)}; "
                         f"the liveness sweep keeps trying (see the log), or delete them in the {service} console.")
    if notes:
        error = Run.objects.filter(pk=run.pk).values_list("error", flat=True).first() or ""
        Run.objects.filter(pk=run.pk).update(error=" ".join([error, *notes]).strip())
