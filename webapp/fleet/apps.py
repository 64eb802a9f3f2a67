from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "webapp.fleet"
    label = "fleet"
    verbose_name = "Fleet"

    def ready(self) -> None:
        from celery.signals import worker_ready

        worker_ready.connect(_keep_drained, dispatch_uid="fleet-keep-drained", weak=False)


def _keep_drained(sender=None, **kwargs) -> None:
    """A drained worker that restarts stays drained: it stops consuming its queues again."""
    from webapp.fleet.models import WorkerState  # apps.py loads before the models: read them when the signal comes

    state = WorkerState.objects.filter(name=getattr(sender, "hostname", ""), drained=True).first()
    for queue in state.queues if state else []:
        sender.cancel_task_queue(queue)
