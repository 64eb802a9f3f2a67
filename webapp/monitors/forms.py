"""The integrations page's form for a project's monitor rule (the API's serializer checks the same)."""

from __future__ import annotations

from django import forms

from webapp.monitors.health import ABOUT, DEFAULT_WINDOW
from webapp.monitors.models import MAX_WINDOW, Monitor, MonitorRule, check_threshold


class MonitorRuleForm(forms.Form):
    monitor = forms.ChoiceField(choices=Monitor.choices)
    threshold = forms.FloatField(validators=[check_threshold], help_text="The rule fires where the monitor is above it.")
    window = forms.IntegerField(min_value=1, max_value=MAX_WINDOW, initial=DEFAULT_WINDOW, help_text="Steps the monitor averages over.")

    def save(self, project, creator) -> MonitorRule:
        """The project's rule for this monitor, made or changed (one per monitor), turned on."""
        rule, _ = MonitorRule.objects.update_or_create(
            project=project, monitor=self.cleaned_data["monitor"],
            defaults={"threshold": self.cleaned_data["threshold"], "window": self.cleaned_data["window"], "enabled": True},
            create_defaults={"threshold": self.cleaned_data["threshold"], "window": self.cleaned_data["window"],
                             "created_by": creator})
        return rule


def suggested_thresholds() -> list[tuple[str, str, float]]:
    """(label, what it reads, a threshold to start from) of each monitor, for the page."""
    return [(monitor.label, ABOUT[monitor][0], ABOUT[monitor][1]) for monitor in Monitor]
