from django.contrib import admin

from webapp.playground.models import PlaygroundRequest


@admin.register(PlaygroundRequest)
class PlaygroundRequestAdmin(admin.ModelAdmin):
    """Read only: requests are written by people asking and by the workers answering."""

    list_display = ("id", "run", "user", "kind", "model_name", "status", "queue", "worker", "device", "created_at")
    list_filter = ("status", "kind", "queue")
    search_fields = ("run__name", "user__username", "worker")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
