from django.contrib import admin

from webapp.checkpoints.models import CheckpointAlias, Evaluation, EvaluationScore


@admin.register(CheckpointAlias)
class CheckpointAliasAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "run", "step", "set_by", "updated_at")
    list_filter = ("project",)
    raw_id_fields = ("run", "set_by")


class EvaluationScoreInline(admin.TabularInline):
    model = EvaluationScore
    extra = 0


@admin.register(Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ("pk", "project", "run", "step", "dataset", "status", "worker", "created_at")
    list_filter = ("status", "project")
    raw_id_fields = ("run", "created_by")
    inlines = [EvaluationScoreInline]
