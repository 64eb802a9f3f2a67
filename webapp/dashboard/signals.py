"""What the dashboard does when rows below it change: push a run's status and log lines to its live
viewers, fold an ended run's metric tail, and make open websockets re-check their access when it
may have shrunk. ``connect()`` is called once the apps are loaded (``DashboardConfig.ready``)."""

from __future__ import annotations

import logging

from django.db.models.signals import post_delete, post_save

from webapp.dashboard import live
from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run, run_logs_written, run_status_changed
from webapp.teams.models import Membership, ShareLink, share_link_revoked

logger = logging.getLogger(__name__)


def connect() -> None:
    run_status_changed.connect(_push_status, dispatch_uid="dashboard-run-status")
    run_status_changed.connect(_fold_ended_run, dispatch_uid="dashboard-run-fold")
    run_logs_written.connect(_push_logs, dispatch_uid="dashboard-run-logs")
    # Open websockets re-check their access when it may have shrunk.
    for signal in (post_save, post_delete):
        signal.connect(_membership_changed, sender=Membership, dispatch_uid=f"dashboard-membership-{signal is post_save}")
    post_delete.connect(_share_link_ended, sender=ShareLink, dispatch_uid="dashboard-share-link-deleted")
    post_save.connect(_share_link_saved, sender=ShareLink, dispatch_uid="dashboard-share-link-saved")
    share_link_revoked.connect(_share_link_ended, sender=ShareLink, dispatch_uid="dashboard-share-link-revoked")
    # Runs are saved only when edited (visibility, project, tags, notes); workers use update().
    post_save.connect(_run_changed, sender=Run, dispatch_uid="dashboard-run-saved")
    post_delete.connect(_run_changed, sender=Run, dispatch_uid="dashboard-run-deleted")


def _push_status(sender, run, **kwargs) -> None:
    live.publish_status(run)


def _push_logs(sender, run_id: int, lines: list[dict], **kwargs) -> None:
    live.publish_logs(run_id, lines)


def _fold_ended_run(sender, run, **kwargs) -> None:
    """An ended run's metric tail becomes blocks, so pages that read many ended runs (compare) read
    block summaries only. A point stored after this stays in the tail, where reads find it too."""
    if run.status not in run.FINAL:
        return
    try:
        SeriesWriter(run.pk).fold()
    except Exception:  # noqa: BLE001 (the run's end is recorded; folding waits for the next write)
        logger.exception("Folding the metric tail of run %s failed.", run.pk)


def _membership_changed(sender, instance, **kwargs) -> None:
    live.recheck_access(live.user_group(instance.user_id))


def _share_link_saved(sender, instance, created=False, **kwargs) -> None:
    if instance.revoked_at is not None:
        _share_link_ended(sender, instance)


def _share_link_ended(sender, instance, **kwargs) -> None:
    live.recheck_access(live.share_link_group(instance.pk))


def _run_changed(sender, instance, created=False, **kwargs) -> None:
    if not created:
        live.recheck_access(live.group_name(instance.pk))
