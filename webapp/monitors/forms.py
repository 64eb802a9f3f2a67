"""The integrations page's form for a project's monitor rule (the API's serializer checks the same)."""

from __future__ import annotations

from django import forms

from webapp.monitors.health import ABOUT, DEFAULT_WINDOW
from webapp.monitors.models import MAX_WINDOW, Monitor, MonitorRule, check_threshold


class MonitorRuleForm(forms.Form):
    monitor = forms.ChoiceField(choices=Monitor.choices)
    threshold = forms.FloatField(validators=[check_threshold], help_text="The rule fires where the monitor is above it.")
    window = forms.IntegerField(min_value=1, max_value=MAX_WINDOW, initial=DEFAULT_WINDOW, help_text="Steps the monitor averages over.")
    alert = forms.ModelChoiceField(
        queryset=None, required=False, label="Alert to",
        empty_label="nobody: shown on the run page only",
        help_text="One of this project's alert rules: its target is told the first time a run crosses this rule.")

    def __init__(self, *args, project, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Only this project's alert rules: a choice outside them is refused as not a valid choice.
        self.fields["alert"].queryset = project.alert_rules.all()

    def save(self, project, creator) -> MonitorRule:
        """The project's rule for this monitor, made or changed (one per monitor), turned on."""
        rule, _ = MonitorRule.objects.update_or_create(
            project=project, monitor=self.cleaned_data["monitor"],
            defaults={"threshold": self.cleaned_data["threshold"], "window": self.cleaned_data["window"],
                      "alert": self.cleaned_data["alert"], "enabled": True},
            create_defaults={"threshold": self.cleaned_data["threshold"], "window": self.cleaned_data["window"],
                             "alert": self.cleaned_data["alert"], "created_by": creator})
        return rule


def suggested_thresholds() -> list[tuple[str, str, float]]:
    """(label, what it reads, a threshold to start from) of each monitor, for the page."""
    return [(monitor.label, ABOUT[monitor][0], ABOUT[monitor][1]) for monitor in Monitor]
