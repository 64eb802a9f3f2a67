from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "webapp.api"
    label = "api"
    verbose_name = "REST API"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from webapp.api.auth import end_tokens_at_logout  # imports models: only once the apps are loaded

        user_logged_out.connect(end_tokens_at_logout, dispatch_uid="api-end-tokens-at-logout")
