"""The REST API: registry (read), projects, runs (create, fork, list, filter, cancel, edit, delete),
metrics (downsampled series, raw points) and logs, and the endpoints an external run reports
through. Every run endpoint asks ``webapp.runs.access`` (a run the user may not see is a 404)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.http import Http404, StreamingHttpResponse
from django.db.models import Q
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotAuthenticated, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response

from training.config import flatten
from training.errors import ArtifactStoreError
from webapp.api import ingest
from webapp.api.monitors import EVIDENCE_SCHEMA, MONITORS_SCHEMA, EvidenceQuerySerializer, MonitorsQuerySerializer
from webapp.api.serializers import (
    AfterQuerySerializer, AgentSerializer, BackendSerializer, DatasetSerializer, EpisodeQuerySerializer, FinishSerializer,
    HistogramQuerySerializer,
    HeartbeatSerializer, LedgerQuerySerializer, LogLineSerializer, LogsIngestSerializer, MetricsIngestSerializer, ProjectSerializer,
    ModelSerializer, RewardFunctionSerializer, RunCreateSerializer, RunForkSerializer, RunListQuerySerializer, RunSerializer, RunUpdateSerializer,
    SeriesQuerySerializer,
)
from webapp.dashboard import episodes as episode_store
from webapp.dashboard import ledger as run_ledger
from webapp.dashboard import series
from webapp.dashboard.models import StoredEpisode
from webapp.monitors import health
from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction
from webapp.runs import table
from webapp.runs.access import can, get_run_for_user, usable_entries
from webapp.runs.forks import fork_choice, step_problem
from webapp.runs.forms import RunForm, overrides_text
from webapp.runs.models import Run, last_step_of
from webapp.runs.submission import QuotaExceeded
from webapp.runs.trainer_args import clone_overrides
from webapp.teams.access import can_in_project, projects_for

logger = logging.getLogger(__name__)


# Ids in paths are numbers: anything else is a 404 from the router, never a lookup.
ID_PATTERN = r"[0-9]{1,18}"
MAX_LISTED_NAMES = 30  # in a refusal that lists the valid names


class ProjectViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = ProjectSerializer
    lookup_value_regex = ID_PATTERN

    def get_queryset(self):
        return projects_for(self.request.user, "view").order_by("pk")


class _RegistryViewSet(viewsets.ReadOnlyModelViewSet):
    model = None
    lookup_value_regex = ID_PATTERN

    def get_queryset(self):
        return self.model.objects.visible_to(self.request.user).order_by("pk")


class AgentViewSet(_RegistryViewSet):
    model, serializer_class = Agent, AgentSerializer


class DatasetViewSet(_RegistryViewSet):
    model, serializer_class = Dataset, DatasetSerializer


class ModelViewSet(_RegistryViewSet):
    model, serializer_class = Model, ModelSerializer


class RewardFunctionViewSet(_RegistryViewSet):
    model, serializer_class = RewardFunction, RewardFunctionSerializer


class BackendViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = BackendSerializer
    queryset = Backend.objects.order_by("pk")
    lookup_value_regex = ID_PATTERN


class _JsonlRenderer(BaseRenderer):
    """Lets ``?format=jsonl`` through DRF's content negotiation; the view streams the body itself."""

    media_type, format = "application/jsonl", "jsonl"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return JSONRenderer().render(data)  # an error's body


class _ParquetRenderer(_JsonlRenderer):
    media_type, format = "application/vnd.apache.parquet", "parquet"


def _with_query(request, **changes) -> str:
    """The request's address with ``changes`` to its query (None: the parameter left out)."""
    query = request.GET.copy()
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = str(value)
    return f"{request.path}?{query.urlencode()}"


# The access action each endpoint needs on its run.
_ACTION_OF = {
    "retrieve": "view", "partial_update": "edit", "destroy": "delete", "cancel": "cancel",
    "fork": "view",  # whoever may see a run may fork it (logged in: a share link does not); the project decides the rest
    "series": "view", "metrics": "view", "logs": "view", "episodes": "view", "episode": "view", "ledger": "view",
    "episode_histogram": "view",
    "monitors": "view", "monitor_evidence": "view",
    "ingest_metrics": "edit", "ingest_logs": "edit", "heartbeat": "edit", "finish": "edit",
}


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                 mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = RunSerializer
    lookup_value_regex = ID_PATTERN
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return Run.objects.visible_to(self.request.user).select_related("owner", "agent", "dataset", "reward", "backend")

    def get_object(self) -> Run:
        run = get_run_for_user(self.request.user, self.kwargs["pk"], _ACTION_OF[self.action])
        self.check_object_permissions(self.request, run)
        return run

    def perform_content_negotiation(self, request, force=False):
        # The episode store's ``format`` is its query's to judge (a 400 naming it), not DRF's 404.
        return super().perform_content_negotiation(request, force=force or self.action == "episodes")

    def get_serializer_class(self):
        return RunUpdateSerializer if self.action == "partial_update" else RunSerializer

    @extend_schema(parameters=[RunListQuerySerializer])
    def list(self, request, *args, **kwargs):
        """Runs you may see, newest first; ``?status=&kind=&project=&tag=&q=`` filter; ``?ordering=`` sorts
        as the runs table does (``-metric:reward:max``: the best reward first)."""
        query = RunListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        runs = self.get_queryset()
        filters = query.validated_data
        for field in ("status", "kind"):
            if field in filters:
                runs = runs.filter(**{field: filters[field]})
        if "project" in filters:
            runs = runs.filter(project_id=filters["project"])
        if "parent" in filters:
            runs = runs.filter(parent_id=filters["parent"])
        if filters.get("tag"):
            runs = runs.with_tag(filters["tag"])
        if filters.get("q"):
            text = filters["q"]
            runs = runs.filter(Q(name__icontains=text) | Q(notes__icontains=text) | Q(model__icontains=text))
        if filters.get("ordering"):
            runs = runs.order_by(*table.parse_sort(filters["ordering"]).order_by())
        page = self.paginate_queryset(runs)
        return self.get_paginated_response(RunSerializer(page, many=True, context=self.get_serializer_context()).data)

    @extend_schema(request=RunCreateSerializer, responses={201: RunSerializer})
    def create(self, request, *args, **kwargs):
        """Create a run. ``kind=platform`` (default) validates like the run form and queues it;
        ``kind=external`` records a run trained elsewhere, running from now, reported through
        ``metrics/``, ``logs/``, ``heartbeat/`` and ``finish/``."""
        payload = RunCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        if data["kind"] == Run.Kind.EXTERNAL:
            run = _create_external(request.user, data)
        else:
            run = _create_platform(request.user, data)
        return Response(RunSerializer(run, context=self.get_serializer_context()).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=RunForkSerializer, responses={201: RunSerializer})
    @action(detail=True, methods=["post"])
    def fork(self, request, pk=None):
        """Start a new run from the weights of this run's stored checkpoint of ``step``, its choices and
        config changed where given (``overrides`` over its config keys; ``agent``, ``dataset``,
        ``reward``, ``project``). Validated and queued like ``POST /api/runs/``; the fork records
        ``parent`` and ``parent_step``. A step without a stored checkpoint is a 400, nothing queued."""
        parent = self.get_object()
        payload = RunForkSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        problem = step_problem(parent, data["step"])
        if problem:
            raise ValidationError({"step": [problem]})
        run = _create_platform(request.user, _fork_data(parent, data))
        return Response(RunSerializer(run, context=self.get_serializer_context()).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, run: Run) -> None:
        if not run.is_final:
            raise ValidationError({"status": f"The run is {run.status}; cancel it first, only ended runs can be deleted."})
        run.delete()

    @extend_schema(request=None, responses={200: RunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel: a queued run ends now; a running one is asked to stop at its next step."""
        run = self.get_object()
        if not run.request_cancel():
            raise ValidationError({"status": f"The run has already ended ({run.status})."})
        return Response(RunSerializer(run, context=self.get_serializer_context()).data)

    @extend_schema(
        parameters=[SeriesQuerySerializer],
        responses={200: inline_serializer("Series", {
            "run": serializers.IntegerField(), "keys": serializers.ListField(child=serializers.CharField()),
            "last_step": serializers.IntegerField(), "series": serializers.DictField(child=serializers.JSONField()),
        })},
    )
    @action(detail=True, methods=["get"])
    def series(self, request, pk=None):
        """Downsampled series (each bucket keeps its min and max, spikes survive) of ``?keys=`` between ``start`` and ``end``."""
        run = self.get_object()
        query = SeriesQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        all_keys = series.keys_of(run.pk)
        wanted = [k for k in (q.get("keys") or "").split(",") if k] or all_keys
        return Response({
            "run": run.pk, "keys": all_keys, "last_step": last_step_of(run.pk),
            "series": {key: series.downsample(run.pk, key, q.get("start"), q.get("end"), q["points"]) for key in wanted[:40]},
        })

    @extend_schema(
        parameters=[AfterQuerySerializer],
        responses={200: inline_serializer("Points", {
            "last_step": serializers.IntegerField(), "points": serializers.DictField(child=serializers.JSONField()),
        })},
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """Every point after step ``?after=`` (-1: all): ``{"points": {key: [[step, value], ...]}}``."""
        run = self.get_object()
        query = AfterQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        after = query.validated_data["after"]
        points = series.points_after(run.pk, after)
        last = max([after] + [pairs[-1][0] for pairs in points.values()])
        return Response({"last_step": last, "points": points})

    @extend_schema(request=MetricsIngestSerializer, responses={200: inline_serializer("Ingested", {"points": serializers.IntegerField()})})
    @metrics.mapping.post
    def ingest_metrics(self, request, pk=None):
        """An external run reports steps: ``{"steps": [{"step": 1, "metrics": {"reward": 0.5}}]}``."""
        run = self._external_running()
        payload = MetricsIngestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        return Response({"points": ingest.record_metrics(run, payload.validated_data["steps"])})

    @extend_schema(parameters=[AfterQuerySerializer], responses={200: LogLineSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """Log lines with an id above ``?after=`` (at most 1000)."""
        run = self.get_object()
        query = AfterQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        lines = run.logs.filter(id__gt=query.validated_data["after"]).order_by("id")[:1000]
        return Response(LogLineSerializer(lines, many=True).data)

    @extend_schema(request=LogsIngestSerializer, responses={200: inline_serializer("LogsIngested", {"lines": serializers.IntegerField()})})
    @logs.mapping.post
    def ingest_logs(self, request, pk=None):
        """An external run reports log lines: ``{"lines": [{"level": "INFO", "message": "..."}]}``."""
        run = self._external_running()
        payload = LogsIngestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        return Response({"lines": ingest.record_logs(run, payload.validated_data["lines"])})

    @extend_schema(request=None, responses={200: HeartbeatSerializer})
    @action(detail=True, methods=["post"])
    def heartbeat(self, request, pk=None):
        """An external run is alive; the answer says whether someone asked it to stop."""
        run = self._external_running()
        run.heartbeat()
        return Response({"status": run.status, "cancel_requested": run.cancel_requested_at is not None})

    @extend_schema(request=FinishSerializer, responses={200: RunSerializer})
    @action(detail=True, methods=["post"])
    def finish(self, request, pk=None):
        """An external run ended: ``{"status": "succeeded" | "failed" | "cancelled", "error": ""}``."""
        run = self._external_running()
        payload = FinishSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        fields = {"final_metrics": data["final_metrics"]} if data["final_metrics"] else {}
        if not run.finish(data["status"], error=data["error"], **fields):
            raise ValidationError({"status": f"The run has already ended ({run.status})."})
        return Response(RunSerializer(run, context=self.get_serializer_context()).data)

    @extend_schema(parameters=[EpisodeQuerySerializer], responses={200: inline_serializer("EpisodePage", {
        "results": serializers.ListField(child=serializers.DictField()), "next": serializers.CharField(allow_null=True),
    })})
    @action(detail=True, methods=["get"], permission_classes=[AllowAny],
            renderer_classes=[JSONRenderer, BrowsableAPIRenderer, _JsonlRenderer, _ParquetRenderer])
    def episodes(self, request, pk=None):
        """The episode store: every episode of the run, filtered (``step_min``, ``step_max``,
        ``reward_min``, ``reward_max``, ``termination``, ``data_source``, ``group``, ``row_index``,
        ``drift``, ``q``, ``split``),
        a page at a time (``limit``; ``next`` goes on from the page's last episode, ``cursor``; ``offset``
        skips that many); ``format=jsonl`` or ``format=parquet`` streams the
        whole filtered set with each episode's body, for at most ``EPISODE_EXPORT_MAX_SECONDS``: a cut
        export ends with a note (``export_cut``) naming the id to go on from (``after_id``)."""
        run, query = self._episode_run(only=())  # the store reads nothing of the run but its id
        rows = episode_store.filtered(run, query)
        if query["format"] != "json":
            limit = settings.EPISODE_EXPORT_MAX_SECONDS
            stream = (episode_store.jsonl_stream if query["format"] == "jsonl" else episode_store.parquet_stream)(rows, limit)
            media = "application/jsonl" if query["format"] == "jsonl" else "application/vnd.apache.parquet"
            response = StreamingHttpResponse(stream, content_type=media)
            response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-episodes.{query["format"]}"'
            response["X-Export-Time-Limit"] = str(limit)  # past it the file ends with a note (export_cut)
            return response
        limit, offset = query["limit"], query["offset"]
        page = list(rows.values(*episode_store.LIST_FIELDS)[offset:offset + limit + 1])
        following = None
        if len(page) > limit:  # keyset: the next page starts after this one's last episode, not at an offset
            following = request.build_absolute_uri(
                _with_query(request, cursor=episode_store.cursor_of(page[limit - 1]), offset=None))
        return Response({"results": page[:limit], "next": following})

    @extend_schema(parameters=[HistogramQuerySerializer], responses={200: inline_serializer("EpisodeHistogram", {
        "split": serializers.CharField(), "step": serializers.IntegerField(allow_null=True),
        "first_step": serializers.IntegerField(allow_null=True), "last_step": serializers.IntegerField(allow_null=True),
        "count": serializers.IntegerField(), "no_reward": serializers.IntegerField(),
        "bins": serializers.ListField(child=serializers.DictField()),
    })})
    @action(detail=True, methods=["get"], url_path="episodes/histogram", permission_classes=[AllowAny])
    def episode_histogram(self, request, pk=None):
        """One step's rewards in ``bins`` equal bins (``step``: default the last stored; ``split``:
        default train): each bin's edges (``low``, ``high``), how many episodes it holds, and the least
        and greatest reward in it (``reward_min``, ``reward_max``: the listing's filters that open
        exactly its episodes); ``no_reward`` counts the step's episodes without a reward."""
        run, query = self._episode_run(HistogramQuerySerializer, only=())
        return Response(episode_store.reward_histogram(run, query["split"], query.get("step"), query["bins"]))

    @extend_schema(operation_id="runs_episode_retrieve", responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"], url_path=r"episodes/(?P<episode_id>[0-9]{1,18})", permission_classes=[AllowAny])
    def episode(self, request, pk=None, episode_id=None):
        """One episode whole: its turns, ``prompt_ids``, ``token_ids`` (and ``token_texts``, each decoded
        alone) with their ``mask`` (1: the model's, trained on; 0: the environment's) and sampling
        ``logprobs``, its ``advantage`` and reward components."""
        run, _ = self._episode_run(only=())
        row = StoredEpisode.objects.filter(run=run, pk=episode_id).first()
        if row is None:
            raise Http404("No such episode.")
        try:
            return Response(episode_store.detail(row))
        except ArtifactStoreError:
            logger.exception("episode %s of run %s: its body could not be read", row.pk, run.pk)  # the store's words, for admins
            return Response({"detail": "The episode's body could not be read: the artifact store did not answer "
                                       "(details in the server's log). Try again later."}, status=503)

    @extend_schema(parameters=[LedgerQuerySerializer], responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"], permission_classes=[AllowAny])
    def ledger(self, request, pk=None):
        """The run's ledger: steps planned and done; per step (``step_min``, ``step_max``: a window of
        at most 500, default the last) the training episodes stored, scored, failed, timed out, cut by
        length or turns, and the share of groups whose rewards were all equal; each attempt's start,
        end and cause; the settings its backend accepted without effect (null through a share link:
        a run's config is for those who may view it logged in, as its config.yaml is)."""
        run, query = self._episode_run(LedgerQuerySerializer)
        with_config = can(request.user, run, "view")  # without the share link's token
        return Response(run_ledger.ledger(run, query.get("step_min"), query.get("step_max"), with_config=with_config))

    @MONITORS_SCHEMA
    @action(detail=True, methods=["get"], permission_classes=[AllowAny])
    def monitors(self, request, pk=None):
        """The run's reward-health monitors over its last 500 steps (each one's value per step, or
        ``source`` null where the run stored nothing it is read from) and the alerts of its
        project's enabled rules, each at the first step of a stretch above the rule's threshold.
        They audit the run; they promise no early warning."""
        run, _ = self._episode_run(MonitorsQuerySerializer)
        return Response(health.report(run))

    @EVIDENCE_SCHEMA
    @action(detail=True, methods=["get"], url_path="monitors/evidence", permission_classes=[AllowAny])
    def monitor_evidence(self, request, pk=None):
        """An alert's evidence: the training episodes of ``step``, each prompt beside its episodes
        of an earlier step (at least ``window`` steps back where it was trained then)."""
        run, query = self._episode_run(EvidenceQuerySerializer)
        return Response(health.evidence(run, query["step"], query["window"]))

    def _episode_run(self, query_class=EpisodeQuerySerializer, only: tuple[str, ...] | None = None) -> tuple[Run, dict]:
        """The run (``only``: those of its fields, as ``get_run_for_user``) and the validated query;
        access as every run resource (a share link's token, ``?share=``, opens it read-only; a run
        one may not see is a 404)."""
        query = query_class(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        token = query.validated_data.get("share")
        if not token and not self.request.user.is_authenticated:
            raise NotAuthenticated()
        run = get_run_for_user(self.request.user, self.kwargs["pk"], "view", share_token=token, only=only)
        return run, query.validated_data

    def _external_running(self) -> Run:
        run = self.get_object()
        if run.kind != Run.Kind.EXTERNAL:
            raise PermissionDenied("Platform runs are reported by their worker, not over the API.")
        if run.is_final:
            raise ValidationError({"status": f"The run has already ended ({run.status})."})
        return run


class QuotaFull(APIException):
    """429: the owner's or the project's quota of queued and running runs is full (``webapp.runs.submission``)."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "quota"


def _create_platform(user, data: dict) -> Run:
    """Exactly the run form's validation (registry rows by name; an agent or a dataset also by id)."""
    form = RunForm({
        "name": data["name"], "project": data["project"] or "", "visibility": data["visibility"],
        "agent": _entry_pk(Agent, data["agent"], user, data["project"]),
        "dataset": _entry_pk(Dataset, data["dataset"], user, data["project"]),
        "reward": data["reward"], "backend": data["backend"],
        "model": data["model"], "overrides": overrides_text(data["overrides"]), "tags": ", ".join(data["tags"]),
        "notes": data["notes"],
    }, user=user)
    for name in ("reward", "backend"):  # names unique on the platform
        form.fields[name].to_field_name = "name"
    if not form.is_valid():
        if form.quota_full is not None:
            raise QuotaFull(form.quota_full)
        errors = {field: list(messages) for field, messages in form.errors.items()}
        for name in ("agent", "dataset", "reward", "backend"):
            if str(form.fields[name].error_messages["invalid_choice"]) in form.errors.get(name, []):
                errors[name] = [_no_such_choice(name, data[name], form.fields[name].queryset, data["project"])]
        raise ValidationError(errors)
    try:
        return form.save(owner=user)
    except QuotaExceeded as exc:
        raise QuotaFull(str(exc)) from None


def _fork_data(parent: Run, data: dict) -> dict:
    """What ``_create_platform`` takes for a fork of ``parent`` (``RunForkSerializer``'s ``data``): the
    parent's choices and the config it was validated with (``clone_overrides``), each changed where
    given; its model the parent's checkpoint of the step."""
    project = data["project"] if "project" in data else parent.project_id
    same_project = project is not None and project == parent.project_id
    return {
        "name": data["name"] or f"{parent.name or f'run {parent.pk}'} fork @{data['step']}",
        "project": project,
        "visibility": data.get("visibility") or (parent.visibility if same_project else Run.Visibility.PRIVATE),
        "agent": data["agent"] or (str(parent.agent_id) if parent.agent_id else ""),
        "dataset": data["dataset"] or (str(parent.dataset_id) if parent.dataset_id else ""),
        "reward": data["reward"] or (parent.reward.name if parent.reward_id else ""),
        "backend": parent.backend.name if parent.backend_id else "",
        "model": fork_choice(parent.pk, data["step"]),
        "overrides": {**clone_overrides(parent), **flatten(data["overrides"])},
        "tags": list(parent.tags or []), "notes": data["notes"],
    }


def _entry_pk(model, value: str, user, project: int | None) -> str:
    """The agent or dataset ``value`` names for a run in ``project``, as the form's choice (its id).

    A name means the run's project's entry or the shared one of that name (names are unique among
    those), else the one entry of that name in another project ``user`` may see (a viewer there uses
    it in their own runs: ``access.usable_entries``); a number is an entry's id (``GET /api/datasets/``),
    for a name that several such projects have. Anything else is left for the form to refuse."""
    usable = usable_entries(user, model)
    here = usable.usable_in(project).filter(name=value).first()
    if here is not None:
        return str(here.pk)
    elsewhere = list(usable.filter(name=value).select_related("project")[:MAX_LISTED_NAMES])
    if len(elsewhere) > 1:
        ids = ", ".join(f"{row.pk} (project {row.project})" for row in elsewhere)
        raise ValidationError({model._meta.model_name: [
            f"Several {model._meta.verbose_name_plural} named {value!r} are in projects you can see: {ids}; give its id instead."]})
    if elsewhere:
        return str(elsewhere[0].pk)
    return value  # not a name of an entry ``user`` may use: a number is judged as an id, the rest refused


def _no_such_choice(name: str, value: str, choices, project: int | None) -> str:
    """A name that is not among the rows the run may use, said with the names it may use (only
    those this person may see: the field's choices)."""
    rows = choices.filter(enabled=True) if name == "backend" else choices
    names = list(rows.order_by("name").values_list("name", flat=True).distinct()[:MAX_LISTED_NAMES + 1])
    listed = ", ".join(names[:MAX_LISTED_NAMES]) + (", ..." if len(names) > MAX_LISTED_NAMES else "")
    where = " in this project" if project else ""
    return f"No {name} named {value!r} among those you may use{where}; choose one of: {listed or 'none yet'}."


def _create_external(user, data: dict) -> Run:
    project = None
    if data["project"]:
        project = projects_for(user, "run").filter(pk=data["project"]).first()
        if project is None or not can_in_project(user, project, "run"):
            raise ValidationError({"project": "No such project, or you may not start runs in it."})
    if data["visibility"] == Run.Visibility.TEAM and project is None:
        raise ValidationError({"visibility": "A run without a project has no team to share it with; choose a project."})
    rows = {}
    for name, model in (("agent", Agent), ("dataset", Dataset)):
        if data[name]:
            pk = _entry_pk(model, data[name], user, project.pk if project else None)
            rows[name] = usable_entries(user, model).filter(pk=pk).first() if pk.isdigit() else None
            if rows[name] is None:
                raise ValidationError({name: f"No {name} named {data[name]!r}."})
    if data["reward"]:
        rows["reward"] = usable_entries(user, RewardFunction).filter(name=data["reward"]).first()
        if rows["reward"] is None:
            raise ValidationError({"reward": f"No reward named {data['reward']!r}."})
    if data["backend"]:
        rows["backend"] = Backend.objects.filter(name=data["backend"]).first()
        if rows["backend"] is None:
            raise ValidationError({"backend": f"No backend named {data['backend']!r}."})
    now = timezone.now()
    with transaction.atomic():
        return Run.objects.create(
            owner=user, kind=Run.Kind.EXTERNAL, name=data["name"], project=project, visibility=data["visibility"],
            model=data["model"], config_overrides=flatten(data["overrides"]), tags=list(dict.fromkeys(data["tags"])),
            notes=data["notes"], status=Run.Status.RUNNING, started_at=now, heartbeat_at=now, worker="external",
            **rows,
        )
