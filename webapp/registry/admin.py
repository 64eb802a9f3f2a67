from django.contrib import admin

from webapp.registry.models import Agent, Backend, Dataset, RewardFunction


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "workflow_class", "agent_class", "env_class")
    search_fields = ("name", "workflow_class", "agent_class", "env_class")


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "source", "identifier", "train_split", "val_split")
    list_filter = ("source",)
    search_fields = ("name", "identifier")


@admin.register(RewardFunction)
class RewardFunctionAdmin(admin.ModelAdmin):
    list_display = ("name", "path")
    search_fields = ("name", "path")


@admin.action(description="Enable selected backends")
def enable_backends(modeladmin, request, queryset):
    queryset.update(enabled=True)


@admin.action(description="Disable selected backends")
def disable_backends(modeladmin, request, queryset):
    queryset.update(enabled=False)


@admin.register(Backend)
class BackendAdmin(admin.ModelAdmin):
    list_display = ("name", "processor", "enabled", "queue", "needs_gpu", "max_concurrent_runs")
    list_editable = ("enabled", "queue", "max_concurrent_runs")
    list_filter = ("enabled", "queue", "needs_gpu")
    actions = [enable_backends, disable_backends]
