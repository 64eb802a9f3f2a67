from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "webapp.sweeps"
    label = "sweeps"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.runs.models import run_status_changed
        from webapp.sweeps import engine

        run_status_changed.connect(engine.on_status_changed, dispatch_uid="sweeps.trial_ended")
