from django.contrib import admin

from webapp.integrations.models import AlertDelivery, AlertRule, TrackingTarget


@admin.register(TrackingTarget)
class TrackingTargetAdmin(admin.ModelAdmin):
    list_display = ["project", "wandb_project", "wandb_entity", "mlflow_server", "updated_at"]
    exclude = ["wandb_api_key_sealed", "mlflow_password_sealed"]  # secrets are set on the project page


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ["__str__", "project", "user", "target_label", "events", "enabled"]
    readonly_fields = ["target_label"]


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(admin.ModelAdmin):
    list_display = ["run", "event", "rule", "status", "attempts", "next_attempt_at", "sent_at"]
    list_filter = ["status", "event"]
    readonly_fields = ["rule", "run", "event", "title", "body", "attempts", "last_error", "sent_at"]
