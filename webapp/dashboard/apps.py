from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "webapp.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        from webapp.runs.models import run_status_changed

        run_status_changed.connect(_push_status, dispatch_uid="dashboard-run-status")


def _push_status(sender, run, **kwargs) -> None:
    from webapp.dashboard import live

    live.publish_status(run.pk, run.status, run.steps, run.error)
