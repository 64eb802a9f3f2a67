"""``/api/sweeps/``: start a sweep from a run, list and read sweeps with their trials, cancel one.
Input goes through the same ``check_space`` as the browser form, so both refuse the same things."""

from __future__ import annotations

from django import forms
from django.db.models import Q
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from webapp.api.views import QuotaFull
from webapp.runs.access import get_run_for_user
from webapp.sweeps import engine
from webapp.sweeps.engine import MAX_PARALLEL, MAX_TRIALS
from webapp.sweeps.forms import check_objective, check_space
from webapp.sweeps.models import Sweep, Trial
from webapp.sweeps.views import sweep_for_user


class TrialSerializer(serializers.ModelSerializer):
    class Meta:
        model = Trial
        fields = ["number", "run", "state", "params", "value"]


class SweepSerializer(serializers.ModelSerializer):
    trials = TrialSerializer(many=True, read_only=True)
    space = serializers.JSONField(help_text='Config key to range: {"data.train_batch_size": "choice 2, 4", '
                                            '"actor_rollout_ref.actor.optim.lr": "float 1e-4..1e-2 log"}.')
    base_run = serializers.IntegerField(source="base_run_id", min_value=1, max_value=2**62)

    class Meta:
        model = Sweep
        fields = ["id", "name", "base_run", "space", "sampler", "objective", "objective_summary", "objective_steps", "direction",
                  "max_trials", "parallel", "prune", "seed", "status", "stop_reason", "created_at", "trials"]
        read_only_fields = ["status", "stop_reason", "created_at"]
        extra_kwargs = {"max_trials": {"min_value": 1, "max_value": MAX_TRIALS}, "parallel": {"min_value": 1, "max_value": MAX_PARALLEL},
                        "seed": {"min_value": 0, "max_value": 2**31 - 1}}

    def validate_space(self, value):
        if not isinstance(value, dict) or not value or not all(isinstance(k, str) for k in value):
            raise ValidationError('An object of config key to range, e.g. {"data.train_batch_size": "choice 2, 4"}.')
        return value

    def create(self, validated_data):
        request = self.context["request"]
        base = get_run_for_user(request.user, validated_data.pop("base_run_id"), "run")
        problems = {}
        try:
            validated_data["space"] = check_space(validated_data["space"], validated_data.get("sampler", "tpe"), base.config_overrides, base.backend)
        except forms.ValidationError as exc:
            problems["space"] = exc.messages
        try:
            check_objective(validated_data.get("objective", "reward"), base)
        except forms.ValidationError as exc:
            problems["objective"] = exc.messages
        if problems:
            raise ValidationError(problems)
        try:
            return engine.create(owner=request.user, base_run=base, **validated_data)
        except engine.TrialRefused as exc:
            message = f"No trial could start, so the sweep was not created: {exc}"
            raise QuotaFull(message) if exc.quota else ValidationError({"non_field_errors": [message]}) from None


class SweepViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = SweepSerializer
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self):
        return Sweep.objects.filter(Q(owner=self.request.user)).prefetch_related("trials")

    def get_object(self) -> Sweep:
        return sweep_for_user(self.request.user, int(self.kwargs["pk"]), "cancel" if self.action == "cancel" else "view")

    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the sweep: no new trials, running trials cancelled."""
        sweep = self.get_object()
        engine.cancel(sweep)
        sweep.refresh_from_db()
        return Response(SweepSerializer(sweep, context={"request": request}).data)
