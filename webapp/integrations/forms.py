"""Forms for tracking targets and alert rules. Secrets are write-only: left empty, a secret stays."""

from __future__ import annotations

from urllib.parse import urlsplit

from django import forms
from django.conf import settings

from training.isolation.egress import EgressRefused, Guard
from webapp.integrations.targets import check_target
from webapp.integrations.models import AlertRule, TrackingTarget, without_credentials


class TrackingTargetForm(forms.ModelForm):
    """A project's tracking targets. A secret is bound to its destination: changing the W&B server
    clears the stored W&B key, changing the MLflow server or user clears the stored password,
    unless the secret is entered again in the same submission. Servers are judged by the egress
    guard; credentials in a URL are refused (they have their own fields and are never shown)."""

    wandb_api_key = forms.CharField(
        label="W&B API key", required=False, widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: never shown again. Empty keeps the stored key, unless the W&B server "
        "changes: then the stored key is removed (enter it again here to keep using it).",
    )
    clear_wandb_api_key = forms.BooleanField(label="Remove the stored W&B API key", required=False)
    mlflow_password = forms.CharField(
        label="MLflow password", required=False, widget=forms.PasswordInput(render_value=False),
        help_text="Write-only. Empty keeps the stored password, unless the MLflow server or user "
        "changes: then the stored password is removed (enter it again here to keep using it).",
    )

    class Meta:
        model = TrackingTarget
        fields = ["wandb_project", "wandb_entity", "wandb_base_url", "mlflow_tracking_uri", "mlflow_username"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cleared: list[str] = []  # which stored secrets this save removed, for the page to say
        for field in ("wandb_base_url", "mlflow_tracking_uri"):  # a URL stored with credentials is never shown with them
            self.initial[field] = without_credentials(self.initial.get(field) or "")

    def _server(self, field: str, what: str) -> str:
        url = self.cleaned_data[field].strip()
        if not url:
            return url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise forms.ValidationError(f"{what} is an http(s) URL.")
        if parts.username is not None or parts.password is not None:
            raise forms.ValidationError(
                "Remove the user name and password from the URL: they would be shown to every member. "
                "Use the user and password fields (MLflow) or the API key field (W&B).")
        try:
            Guard(allowed=tuple(settings.EGRESS_ALLOWED_HOSTS)).check_url(url, unresolved_ok=True)
        except EgressRefused as exc:
            raise forms.ValidationError(f"{exc}") from None
        return url

    def clean_wandb_base_url(self) -> str:
        return self._server("wandb_base_url", "A W&B server")

    def clean_mlflow_tracking_uri(self) -> str:
        uri = self.cleaned_data["mlflow_tracking_uri"]
        if uri and not uri.startswith(("http://", "https://")):
            raise forms.ValidationError("An MLflow tracking server's http(s) URL; runs keep a local store in their folder otherwise.")
        return self._server("mlflow_tracking_uri", "An MLflow tracking server")

    def _changed(self, *fields: str) -> bool:
        return self.instance.pk is not None and any(
            (self.initial.get(name) or "") != (self.cleaned_data.get(name) or "") for name in fields)

    def save(self, user, commit: bool = True) -> TrackingTarget:
        target = super().save(commit=False)
        if self.cleaned_data.get("clear_wandb_api_key"):
            target.wandb_api_key = ""
        elif self.cleaned_data.get("wandb_api_key"):
            target.wandb_api_key = self.cleaned_data["wandb_api_key"]
        elif target.wandb_api_key_sealed and self._changed("wandb_base_url"):
            target.wandb_api_key = ""
            self.cleared.append("W&B API key (the W&B server changed)")
        if self.cleaned_data.get("mlflow_password"):
            target.mlflow_password = self.cleaned_data["mlflow_password"]
        elif target.mlflow_password_sealed and self._changed("mlflow_tracking_uri", "mlflow_username"):
            target.mlflow_password = ""
            self.cleared.append("MLflow password (the MLflow server or user changed)")
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
