"""Forms for tracking targets and alert rules. Secrets are write-only: left empty, a secret stays."""

from __future__ import annotations

from django import forms

from webapp.integrations.alerts import check_target
from webapp.integrations.models import AlertRule, TrackingTarget


class TrackingTargetForm(forms.ModelForm):
    wandb_api_key = forms.CharField(
        label="W&B API key", required=False, widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: never shown again. Empty keeps the stored key.",
    )
    clear_wandb_api_key = forms.BooleanField(label="Remove the stored W&B API key", required=False)
    mlflow_password = forms.CharField(
        label="MLflow password", required=False, widget=forms.PasswordInput(render_value=False),
        help_text="Write-only. Empty keeps the stored password.",
    )

    class Meta:
        model = TrackingTarget
        fields = ["wandb_project", "wandb_entity", "wandb_base_url", "mlflow_tracking_uri", "mlflow_username"]

    def clean_mlflow_tracking_uri(self) -> str:
        uri = self.cleaned_data["mlflow_tracking_uri"]
        if uri and not uri.startswith(("http://", "https://")):
            raise forms.ValidationError("An MLflow tracking server's http(s) URL; runs keep a local store in their folder otherwise.")
        return uri

    def save(self, user, commit: bool = True) -> TrackingTarget:
        target = super().save(commit=False)
        if self.cleaned_data.get("clear_wandb_api_key"):
            target.wandb_api_key = ""
        elif self.cleaned_data.get("wandb_api_key"):
            target.wandb_api_key = self.cleaned_data["wandb_api_key"]
        if self.cleaned_data.get("mlflow_password"):
            target.mlflow_password = self.cleaned_data["mlflow_password"]
        target.updated_by = user
        if commit:
            target.save()
        return target


class AlertRuleForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)
    target = forms.CharField(
        max_length=1000, help_text="An email address, or a webhook: json://host/path (generic JSON), "
        "slack://TokenA/TokenB/TokenC, discord://WebhookID/WebhookToken.",
    )
    events = forms.MultipleChoiceField(choices=AlertRule.Event.choices, widget=forms.CheckboxSelectMultiple)
    quiet_minutes = forms.IntegerField(min_value=1, max_value=7 * 24 * 60, required=False, help_text="For 'goes quiet'.")
    metric = forms.CharField(max_length=200, required=False, help_text="For the threshold, e.g. reward or loss.")
    op = forms.ChoiceField(choices=[("", "—"), *AlertRule.Op.choices], required=False)
    threshold = forms.FloatField(required=False)
    after_step = forms.IntegerField(min_value=0, max_value=10**9, required=False, initial=0)

    def clean_target(self) -> str:
        try:
            return check_target(self.cleaned_data["target"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict:
        data = super().clean()
        events = data.get("events") or []
        if "quiet" in events and not data.get("quiet_minutes"):
            self.add_error("quiet_minutes", "Say after how many minutes without a step a run counts as quiet.")
        if "threshold" in events:
            if not data.get("metric") or not data.get("op"):
                self.add_error("metric", "A threshold alert needs a metric and a comparison.")
            elif data["op"] != AlertRule.Op.NAN and data.get("threshold") is None:
                self.add_error("threshold", "Give the value the metric is compared with.")
        return data

    def save(self, *, creator, project=None, user=None) -> AlertRule:
        data = self.cleaned_data
        rule = AlertRule(
            project=project, user=user, created_by=creator, name=data.get("name") or "", events=list(data["events"]),
            quiet_minutes=data.get("quiet_minutes"), metric=data.get("metric") or "", op=data.get("op") or "",
            threshold=data.get("threshold"), after_step=data.get("after_step") or 0,
        )
        rule.target = data["target"]
        rule.save()
        return rule
