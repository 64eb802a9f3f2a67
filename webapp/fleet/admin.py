from django.contrib import admin

from webapp.fleet.models import WorkerState


@admin.register(WorkerState)
class WorkerStateAdmin(admin.ModelAdmin):
    list_display = ("name", "drained", "queues", "changed_at", "changed_by")
    readonly_fields = ("changed_at", "changed_by")
