from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "webapp.runs"
    label = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        from webapp.runs import artifacts  # noqa: F401  (imports models, once the apps are loaded: deleting a run removes its files)
