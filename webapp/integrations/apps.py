from django.apps import AppConfig


class IntegrationsConfig(AppConfig):
    name = "webapp.integrations"
    label = "integrations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.integrations import alerts  # imports models: only once the apps are loaded

        alerts.connect()
