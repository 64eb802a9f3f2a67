from django.apps import AppConfig


class PlaygroundConfig(AppConfig):
    name = "webapp.playground"
    label = "playground"
    default_auto_field = "django.db.models.BigAutoField"
