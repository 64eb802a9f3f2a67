"""The checkpoints' REST API: a run's stored checkpoints with their metrics and aliases, a
project's aliases (list, set or move, delete) and evaluations (start one, read the table). Every
endpoint asks the runs' and projects' access checks (``webapp.checkpoints.logic``): a run or
project the caller may not see is a 404, a viewer's write a 403."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.checkpoints import logic
from webapp.checkpoints.models import ALIAS_PATTERN, CheckpointAlias, Evaluation
from webapp.runs.access import get_run_for_user

MAX_ID = 10**18


class CheckpointSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    name = serializers.CharField()
    metrics = serializers.DictField(child=serializers.FloatField(allow_null=True))
    aliases = serializers.ListField(child=serializers.CharField())


class RunCheckpointsSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    checkpoints = CheckpointSerializer(many=True)


class AliasSerializer(serializers.Serializer):
    name = serializers.RegexField(ALIAS_PATTERN, max_length=64)
    run = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    step = serializers.IntegerField(min_value=0, max_value=2**31 - 1)
    set_by = serializers.CharField(read_only=True, allow_null=True)
    updated_at = serializers.DateTimeField(read_only=True)


class EvaluationCreateSerializer(serializers.Serializer):
    run = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)
    step = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False)
    alias = serializers.RegexField(ALIAS_PATTERN, max_length=64, required=False, help_text="Instead of run and step.")
    dataset = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    episodes_per_task = serializers.IntegerField(min_value=1, max_value=logic.MAX_EPISODES_PER_TASK, default=1)
    max_tasks = serializers.IntegerField(min_value=1, max_value=10**9, required=False)

    def validate(self, data):
        by_alias, by_step = "alias" in data, "run" in data and "step" in data
        if by_alias == by_step or (by_alias and ("run" in data or "step" in data)):
            raise serializers.ValidationError("Give the checkpoint as run and step, or as alias (not both).")
        return data


class EvaluationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Evaluation
        fields = ["id", "run", "step", "dataset", "split", "episodes_per_task", "max_tasks", "status", "queue", "worker",
                  "tasks", "error", "created_at", "started_at", "finished_at"]


class TableRowSerializer(serializers.Serializer):
    evaluation = serializers.IntegerField()
    run = serializers.IntegerField()
    run_name = serializers.CharField()
    step = serializers.IntegerField()
    checkpoint = serializers.CharField()
    dataset = serializers.CharField()
    split = serializers.CharField()
    data_source = serializers.CharField()
    tasks = serializers.IntegerField()
    reward = serializers.FloatField()
    pass_at_1 = serializers.FloatField()
    k = serializers.IntegerField()
    pass_at_k = serializers.FloatField()


class TableSerializer(serializers.Serializer):
    rows = TableRowSerializer(many=True)
    evaluations = EvaluationSerializer(many=True)


class TableQuerySerializer(serializers.Serializer):
    sort = serializers.ChoiceField(choices=list(logic.SORTS), default="run")
    descending = serializers.BooleanField(default=False)


def _project(request, pk: int, action: str = "view"):
    try:
        return logic.project_for_user(request.user, pk, action)
    except logic.Refused as exc:
        raise PermissionDenied(str(exc)) from exc


def _alias_json(alias: CheckpointAlias) -> dict:
    return {"name": alias.name, "run": alias.run_id, "step": alias.step,
            "set_by": alias.set_by.username if alias.set_by else None, "updated_at": alias.updated_at}


class RunCheckpointsView(APIView):
    @extend_schema(responses={200: RunCheckpointsSerializer}, operation_id="runs_checkpoints_list")
    def get(self, request, pk: int):
        """The run's stored checkpoints by step: the metrics logged at each one's step and its aliases."""
        run = get_run_for_user(request.user, pk, "view")
        return Response({"run": run.pk, "checkpoints": logic.checkpoint_listing(run)})


class AliasesView(APIView):
    @extend_schema(responses={200: AliasSerializer(many=True)}, operation_id="projects_aliases_list")
    def get(self, request, pk: int):
        """The project's aliases (of checkpoints of runs you may see)."""
        project = _project(request, pk)
        return Response([_alias_json(a) for a in logic.aliases_of(request.user, project)])

    @extend_schema(request=AliasSerializer, responses={200: AliasSerializer}, operation_id="projects_aliases_set")
    def post(self, request, pk: int):
        """Point an alias at a stored checkpoint of a run of the project: created, or moved there."""
        project = _project(request, pk, "run")
        body = AliasSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            alias = logic.set_alias(request.user, project, data["name"], data["run"], data["step"])
        except logic.Refused as exc:
            raise ValidationError({"detail": str(exc)}) from exc
        return Response(_alias_json(alias))


class AliasView(APIView):
    @extend_schema(responses={204: None}, operation_id="projects_aliases_delete")
    def delete(self, request, pk: int, name: str):
        """Remove the alias (the checkpoint stays)."""
        project = _project(request, pk, "run")
        alias = logic.resolve_alias_row(request.user, project, name)
        alias.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class EvaluationsView(APIView):
    @extend_schema(parameters=[TableQuerySerializer], responses={200: TableSerializer}, operation_id="projects_evaluations_table")
    def get(self, request, pk: int):
        """The evaluation table: one row per (run, checkpoint, data source) of the project's finished
        evaluations, sorted by ``?sort=`` (``descending=true``: largest first), and every evaluation's state."""
        project = _project(request, pk)
        query = TableQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = logic.evaluation_table(request.user, project, query.validated_data["sort"], query.validated_data["descending"])
        evaluations = EvaluationSerializer(logic.visible_evaluations(request.user, project), many=True).data
        return Response({"rows": rows, "evaluations": evaluations})

    @extend_schema(request=EvaluationCreateSerializer, responses={201: EvaluationSerializer}, operation_id="projects_evaluations_create")
    def post(self, request, pk: int):
        """Evaluate a stored checkpoint (run and step, or an alias) on a dataset of the project, on a worker."""
        project = _project(request, pk, "run")
        body = EvaluationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            if "alias" in data:
                alias = logic.resolve_alias(request.user, project, data["alias"])
                run_id, step = alias.run_id, alias.step
            else:
                run_id, step = data["run"], data["step"]
            evaluation = logic.submit_evaluation(request.user, project, logic.EvaluationRequest(
                run_id=run_id, step=step, dataset_id=data["dataset"], episodes_per_task=data["episodes_per_task"],
                max_tasks=data.get("max_tasks")))
        except logic.Refused as exc:
            raise ValidationError({"detail": str(exc)}) from exc
        except Http404 as exc:
            raise ValidationError({"detail": str(exc)}) from exc
        return Response(EvaluationSerializer(evaluation).data, status=status.HTTP_201_CREATED)

