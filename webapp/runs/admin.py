from django.contrib import admin

from webapp.runs.models import Checkpoint, Run, RunLog


class CheckpointInline(admin.TabularInline):
    model = Checkpoint
    extra = 0


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "agent", "dataset", "backend", "status", "worker", "remote_release_pending", "created_at", "finished_at")
    list_filter = ("status", "backend", "remote_release_pending")
    search_fields = ("name", "owner__username", "worker", "error")
    readonly_fields = ("created_at", "started_at", "heartbeat_at", "finished_at", "cancel_requested_at", "task_id",
                       "remote_release_attempts", "remote_release_at")
    inlines = [CheckpointInline]


@admin.register(RunLog)
class RunLogAdmin(admin.ModelAdmin):
    list_display = ("run", "time", "level", "message")
    list_filter = ("level",)
    raw_id_fields = ("run",)


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "path", "created_at")
    raw_id_fields = ("run",)
