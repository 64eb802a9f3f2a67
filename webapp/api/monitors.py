"""The API of the reward-health monitors: a run's monitors and alerts, an alert's evidence, and a
project's alert rules (read by its members, changed by its team's owners and admins)."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import PermissionDenied

from webapp.monitors.health import DEFAULT_WINDOW
from django.core.exceptions import ValidationError as DjangoValidationError

from webapp.monitors.models import MAX_WINDOW, Monitor, MonitorRule, check_threshold
from webapp.runs.models import MAX_STEP
from webapp.teams import roster
from webapp.teams.access import can_in_project, projects_for
from webapp.teams.models import Project

class EvidenceQuerySerializer(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP, help_text="The step whose episodes moved the monitor.")
    window = serializers.IntegerField(required=False, min_value=1, max_value=MAX_WINDOW, default=DEFAULT_WINDOW,
                                      help_text="How many steps back at least the same prompts are compared.")
    share = serializers.CharField(required=False, max_length=100, help_text="A share link's token (read-only access).")


class MonitorsQuerySerializer(serializers.Serializer):
    share = serializers.CharField(required=False, max_length=100, help_text="A share link's token (read-only access).")


class MonitorRuleSerializer(serializers.ModelSerializer):
    project = serializers.PrimaryKeyRelatedField(queryset=Project.objects.all())
    monitor = serializers.ChoiceField(choices=Monitor.choices)
    window = serializers.IntegerField(min_value=1, max_value=MAX_WINDOW, default=DEFAULT_WINDOW)

    class Meta:
        model = MonitorRule
        fields = ["id", "project", "monitor", "threshold", "window", "enabled", "alert"]
        extra_kwargs = {"alert": {
            "error_messages": {"does_not_exist": "No such alert rule in this project."},
            "help_text": "One of the project's alert rules, whose target is told the first time a run crosses "
                         "this rule; null: shown on the run page only."}}

    def validate_threshold(self, value: float) -> float:
        try:
            check_threshold(value)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.messages) from exc
        return value

    def validate_project(self, project: Project) -> Project:
        user = self.context["request"].user
        if not can_in_project(user, project, "view"):
            raise serializers.ValidationError("No such project.")  # as for one that does not exist
        if not (user.is_superuser or roster.may_manage(user, project.team)):
            raise PermissionDenied("Only the team's owners and admins change its monitor rules.")
        return project

    def validate(self, data):
        if self.instance is not None and "project" in data and data["project"].pk != self.instance.project_id:
            raise serializers.ValidationError({"project": ["A rule stays in its project; make a new one."]})
        project = data.get("project") or (self.instance.project if self.instance else None)
        monitor = data.get("monitor") or (self.instance.monitor if self.instance else None)
        others = MonitorRule.objects.filter(project=project, monitor=monitor)
        if self.instance is not None:
            others = others.exclude(pk=self.instance.pk)
        if others.exists():
            raise serializers.ValidationError({"monitor": ["This project has a rule for this monitor already; change that one."]})
        alert = data.get("alert")
        if alert is not None and alert.project_id != project.pk:
            # As for one that does not exist: another project's alert rules are not named here.
            raise serializers.ValidationError({"alert": ["No such alert rule in this project."]})
        return data


@extend_schema(tags=["monitors"])
class MonitorRuleViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                         mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """A project's reward-health alert rules: listed for its members (``?project=`` narrows), made,
    changed and deleted by its team's owners and admins."""

    serializer_class = MonitorRuleSerializer
    lookup_value_regex = r"[0-9]{1,18}"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        rules = MonitorRule.objects.filter(project__in=projects_for(self.request.user, "view")).select_related("project__team")
        project = self.request.query_params.get("project")
        if project is not None:
            if not project.isdigit() or len(project) > 18:
                raise Http404("No such project.")
            rules = rules.filter(project_id=int(project))
        return rules.order_by("project_id", "monitor")

    def _may_change(self, rule: MonitorRule) -> None:
        user = self.request.user
        if not (user.is_superuser or roster.may_manage(user, rule.project.team)):
            raise PermissionDenied("Only the team's owners and admins change its monitor rules.")

    def perform_create(self, serializer):
        serializer.save(created_by=self.request.user)

    def perform_update(self, serializer):
        self._may_change(serializer.instance)
        serializer.save()

    def perform_destroy(self, instance):
        self._may_change(instance)
        instance.delete()


MONITORS_SCHEMA = extend_schema(parameters=[MonitorsQuerySerializer], responses={200: OpenApiTypes.OBJECT})
EVIDENCE_SCHEMA = extend_schema(parameters=[EvidenceQuerySerializer], responses={200: OpenApiTypes.OBJECT})
