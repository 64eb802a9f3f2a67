from django.contrib import admin

from webapp.sweeps.models import Sweep, Trial


class TrialInline(admin.TabularInline):
    model = Trial
    extra = 0
    readonly_fields = ["number", "run", "params", "state", "value"]


@admin.register(Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "sampler", "objective", "direction", "max_trials", "parallel", "status"]
    inlines = [TrialInline]
