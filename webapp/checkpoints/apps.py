from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    name = "webapp.checkpoints"
    label = "checkpoints"
    default_auto_field = "django.db.models.BigAutoField"
