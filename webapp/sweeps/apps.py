from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "webapp.sweeps"
    label = "sweeps"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.sweeps import engine  # imports models: only once the apps are loaded

        engine.connect()
