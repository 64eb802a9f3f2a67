from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction, Tool


class AgentAdminForm(forms.ModelForm):
    class Meta:
        model = Agent
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if data.get("tools") and any(data.get(name) for name in ("workflow_class", "agent_class", "env_class")):
            raise ValidationError("Tools belong to a chat agent, which has no workflow or agent class.")
        return data


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentAdminForm
    list_display = ("name", "kind", "workflow_class", "agent_class", "env_class")
    search_fields = ("name", "workflow_class", "agent_class", "env_class", "system_prompt")
    filter_horizontal = ("tools",)
    fieldsets = (
        (None, {"fields": ("name", "description", "project")}),
        ("Chat agent, written without code (AWorld's agent YAML fields)", {"fields": ("system_prompt", "llm_config", "tools")}),
        ("Agent as code (import paths)", {"fields": ("workflow_class", "workflow_args", "agent_class", "env_class", "agent_args", "env_args")}),
        ("Defaults of its runs", {"fields": ("default_config",)}),
    )


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ("name", "path", "description")
    search_fields = ("name", "path", "description")


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "source", "identifier", "train_split", "val_split")
    list_filter = ("source",)
    search_fields = ("name", "identifier")


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ("name", "source", "identifier", "tokenizer", "trust_remote_code", "project")
    list_filter = ("source", "trust_remote_code")
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


def _status(problem: str | None) -> str:
    return "ok" if problem is None else f"missing: {problem}"


@admin.register(Backend)
class BackendAdmin(admin.ModelAdmin):
    list_display = ("name", "processor", "enabled", "queue", "needs_gpu", "max_concurrent_runs", "environment", "credentials")
    readonly_fields = ("environment", "credentials")

    # Credentials, and the environment of backends that train in the worker's process, are checked in
    # the web server's process (workers are configured alike: same image, same variables); a backend
    # with an interpreter of its own (python) is checked in that interpreter (Backend.environment_status).
    @admin.display(description="Environment imports")
    def environment(self, backend: Backend) -> str:
        return _status(backend.environment_status()["environment"])

    @admin.display(description="Credentials set")
    def credentials(self, backend: Backend) -> str:
        return _status(backend.environment_status()["credentials"])
    list_editable = ("enabled", "queue", "max_concurrent_runs")
    list_filter = ("enabled", "queue", "needs_gpu")
    actions = [enable_backends, disable_backends]
