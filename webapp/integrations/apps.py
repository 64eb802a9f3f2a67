from django.apps import AppConfig


class IntegrationsConfig(AppConfig):
    name = "webapp.integrations"
    label = "integrations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.integrations import alerts

        alerts.connect()
