"""JSON for the charts (downsampled series, zoomed ranges, compare), episodes, a run's metrics as CSV,
and the compare page. The run pages themselves are in ``webapp.dashboard.pages``."""

from __future__ import annotations

import csv
import functools
import io
import re
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import orjson
from asgiref.sync import sync_to_async
from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from webapp.dashboard import consumers, series
from webapp.dashboard.compare import fork_offsets, lineage_context, parameter_context
from webapp.dashboard.models import EpisodeSample
from webapp.runs.access import get_run_for_user
from webapp.runs.models import MAX_STEP, Run, last_step_of

# The charts a run page opens with; every other key is one search away.
HEADLINE_KEYS = ("reward", "reward_std", "loss", "kl", "entropy", "response_length", "turns", "step_time")
# The charts the compare page opens with.
COMPARE_KEYS = ("reward", "loss", "kl", "response_length")
# Points per run per compare chart when the page does not say its charts' width in pixels (it
# does: one min/max bucket per two pixels loses nothing visible, spikes included).
COMPARE_POINTS = 200
TERMINATION_PREFIX = "termination/"
VALIDATION_PREFIX = "val/"  # test-set scores on schedule: val/<data_source>/reward, pass@k
# Run ids read from one compare request at most (the runs drawn are capped by COMPARE_MAX_RUNS).
MAX_COMPARE_IDS = 20_000
MAX_KEYS_PER_REQUEST = 40


def login_or_share_link_required(view):
    """``login_required``, except for a request carrying a share link's token (``?share=``): the
    read-only page a link opens fetches its charts and episodes with it. Whether the token opens
    this run is for ``get_run_for_user`` to say (404 otherwise)."""
    protected = login_required(view)

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        return (view if request.GET.get("share") else protected)(request, *args, **kwargs)

    return wrapper


def _share_token(request: HttpRequest) -> str | None:
    return request.GET.get("share") or None


class RangeQuery(forms.Form):
    """The numbers a chart request may carry: whole numbers in range, or a 400 naming the parameter
    (``inf``, ``nan``, ``1e999`` and ``1.5`` are not whole numbers). Zooming left of step 0 asks
    for a negative ``start``, so steps may be negative here."""

    start = forms.IntegerField(required=False, min_value=-MAX_STEP, max_value=MAX_STEP)
    end = forms.IntegerField(required=False, min_value=-MAX_STEP, max_value=MAX_STEP)
    step = forms.IntegerField(required=False, min_value=-MAX_STEP, max_value=MAX_STEP)
    points = forms.IntegerField(required=False, min_value=1, max_value=series.MAX_POINTS)


class BadQuery(Exception):
    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors


def _range_query(request: HttpRequest) -> dict[str, int | None]:
    query = RangeQuery(request.GET)
    if not query.is_valid():
        raise BadQuery({name: list(messages) for name, messages in query.errors.items()})
    return query.cleaned_data


def bad_query_is_400(view):
    """A ``BadQuery`` raised by ``view`` answers 400 with each parameter's error."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except BadQuery as exc:
            text = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in exc.errors.items())
            return JsonResponse({"error": text, "errors": exc.errors}, status=400)

    return wrapper


class AfterQuery(forms.Form):
    """The run page's read of the points it missed live: every point after step ``after``."""

    after = forms.IntegerField(required=False, min_value=-MAX_STEP, max_value=MAX_STEP)


@login_or_share_link_required
@require_GET
@bad_query_is_400
def run_series(request: HttpRequest, pk: int) -> JsonResponse:
    """``?keys=a,b`` (default: the headline charts) ``&start=&end=`` (a zoomed range) ``&points=``;
    or ``?after=<step>[&keys=a,b]``: the raw points after that step (``_points_after``)."""
    run = get_run_for_user(request.user, pk, "view", share_token=_share_token(request))
    after = _after_query(request)
    if after is not None:
        return _points_after(run, after, _list(request.GET.get("keys"))[:MAX_KEYS_PER_REQUEST] or None)
    all_keys = series.keys_of(run.pk)
    wanted = _list(request.GET.get("keys")) or [
        k for k in all_keys if k in HEADLINE_KEYS or k.startswith((TERMINATION_PREFIX, VALIDATION_PREFIX))
    ]
    query = _range_query(request)
    start, end, points = query["start"], query["end"], query["points"] or series.DEFAULT_POINTS
    return JsonResponse({
        "run": run.pk, "status": run.status, "keys": all_keys, "last_step": last_step_of(run.pk),
        "series": {key: series.downsample(run.pk, key, start, end, points) for key in wanted[:MAX_KEYS_PER_REQUEST]},
    })


def _after_query(request: HttpRequest) -> int | None:
    query = AfterQuery(request.GET)
    if not query.is_valid():
        raise BadQuery({name: list(messages) for name, messages in query.errors.items()})
    return query.cleaned_data["after"]


def _points_after(run: Run, after: int, keys: list[str] | None) -> JsonResponse:
    """Every stored point of ``keys`` (default: every key, as a lost live message may have brought
    the run's first point of any) with a step above ``after``, for the run page to fill a gap in
    what it got live. Bounded like the websocket's backlog: past ``BACKLOG_LIMIT`` points the
    answer says ``too_many`` and carries none, and the page reloads its downsampled series.
    ``last_step`` is the highest step stored, which tells the page whether the store has caught
    up with the steps it saw live."""
    last_step = last_step_of(run.pk)  # before the points: whatever it counts, they include
    points = series.points_after_at_most(run.pk, after, consumers.BACKLOG_LIMIT, keys)
    return JsonResponse({
        "run": run.pk, "status": run.status, "after": after, "last_step": last_step,
        "too_many": points is None, "limit": consumers.BACKLOG_LIMIT,
        "series": {key: {"x": [step for step, _ in pairs], "y": [value for _, value in pairs]}
                   for key, pairs in (points or {}).items()},
    })


@login_or_share_link_required
@require_GET
@bad_query_is_400
def run_episodes(request: HttpRequest, pk: int) -> JsonResponse:
    """Steps that have sampled episodes, and the samples of ``?step=`` (default: the latest)."""
    run = get_run_for_user(request.user, pk, "view", share_token=_share_token(request))
    samples = EpisodeSample.objects.filter(run=run)
    steps = sorted(set(samples.values_list("step", flat=True)))
    step = _range_query(request)["step"]
    if step is None and steps:
        step = steps[-1]
    episodes = [
        {"position": e.position, "reward": e.reward, "num_turns": e.num_turns,
         "termination_reason": e.termination_reason, "episode": e.data}
        for e in samples.filter(step=step).order_by("position")
    ] if step is not None else []
    return JsonResponse({"run": run.pk, "steps": steps, "step": step, "episodes": episodes})


@login_required
@require_GET
def compare(request: HttpRequest):
    cap = settings.COMPARE_MAX_RUNS
    # One query when the runs chosen fit on the page (a thousand ids take Django a while to compile
    # into each query's SQL); a second for the ids of the rest when they do not.
    visible = Run.objects.visible_to(request.user).filter(pk__in=_ints(",".join(request.GET.getlist("runs")))).order_by("pk")
    runs = list(visible.select_related("agent", "dataset", "reward", "backend")[:cap])
    chosen = list(visible.values_list("pk", flat=True)) if len(runs) == cap else [r.pk for r in runs]
    # More runs than one page draws: say so, and link to pages of the rest (never drop them silently).
    rest = [{"first": page[0], "last": page[-1], "count": len(page), "query": urlencode({"runs": ",".join(map(str, page))})}
            for page in (chosen[i:i + cap] for i in range(cap, len(chosen), cap))]
    # Open with the compare charts some chosen run has data for (no always-empty chart); offer every key they have.
    keys = sorted({key for run in runs for key in run.latest_values or {}})
    return render(request, "dashboard/compare.html", {
        "runs": runs, "run_ids": ",".join(str(r.pk) for r in runs), "all_keys": keys,
        "chosen_count": len(chosen), "cap": cap, "rest_pages": rest,
        "compare_keys": [key for key in COMPARE_KEYS if key in keys],
        **parameter_context(runs),  # the config keys that differ, a metric against one of them
        **lineage_context(runs, _aligned(request)),  # forks drawn from their parent's step
    })


@login_required
@require_GET
@bad_query_is_400
def compare_series(request: HttpRequest) -> JsonResponse:
    """``?runs=1,2,..&key=reward&points=&start=&end=``: one downsampled series per visible run."""
    key, runs, by_run = _compare_query(request)
    # orjson: a thousand runs' series are about a million numbers, which the json module takes a
    # good part of a second to write; orjson a few milliseconds.
    return HttpResponse(orjson.dumps({
        "key": key,
        "runs": [{"id": pk, "name": runs[pk]["name"] or f"run {pk}", "status": runs[pk]["status"],
                  "offset": runs[pk]["offset"], **series.as_lists(by_run[pk])} for pk in sorted(runs)],
    }), content_type="application/json")


@login_required
@require_GET
@bad_query_is_400
def compare_series_packed(request: HttpRequest) -> HttpResponse:
    """``compare_series`` packed for the compare page: the series' numbers as little-endian typed
    arrays rather than JSON text. A thousand runs' charts are half a million points a key: 12 MB of
    JSON that the browser downloads and parses, 4 MB packed that it reads in place.

    Layout: a uint32 header length, the header (UTF-8 JSON: the key, ``x_type`` "int32" or
    "float64", and per run its id, name, status, raw, count, last_step and ``points``), zero bytes
    up to a multiple of 8, every run's steps one after another (``x_type``), then every run's
    values (float32: seven significant digits, the precision TensorBoard keeps; NaN where not
    finite)."""
    key, runs, by_run = _compare_query(request)
    ids = sorted(runs)
    steps = np.concatenate([by_run[pk]["x"] for pk in ids]) if ids else np.zeros(0, dtype=np.int64)
    values = np.concatenate([by_run[pk]["y"] for pk in ids]) if ids else np.zeros(0)
    x_type = "int32" if not len(steps) or (steps.min() >= -2**31 and steps.max() < 2**31) else "float64"
    header = orjson.dumps({"key": key, "x_type": x_type, "runs": [
        {"id": pk, "name": runs[pk]["name"] or f"run {pk}", "status": runs[pk]["status"], "points": len(by_run[pk]["x"]),
         "offset": runs[pk]["offset"],
         **{field: by_run[pk][field] for field in ("raw", "count", "last_step")}} for pk in ids]})
    padding = -(4 + len(header)) % 8
    body = b"".join([np.uint32(len(header)).astype("<u4").tobytes(), header, bytes(padding),
                     steps.astype("<i4" if x_type == "int32" else "<f8").tobytes(), values.astype("<f4").tobytes()])
    return HttpResponse(body, content_type="application/octet-stream")


def _compare_query(request: HttpRequest) -> tuple[str, dict[int, dict], dict[int, dict]]:
    """The key, the visible chosen runs (capped) and their downsampled series (numpy arrays) of a
    compare request."""
    key = request.GET.get("key") or "reward"
    ids = _ints(",".join(request.GET.getlist("runs")))[:settings.COMPARE_MAX_RUNS]
    runs = {r["pk"]: r for r in Run.objects.visible_to(request.user).filter(pk__in=ids)
            .values("pk", "uid", "name", "status", "metrics_at", "parent_id", "parent_step")}
    query = _range_query(request)
    start, end, points = query["start"], query["end"], query["points"] or COMPARE_POINTS
    offsets = fork_offsets({pk: (r["parent_id"], r["parent_step"]) for pk, r in runs.items()}) if _aligned(request) else {}
    for pk, run in runs.items():
        run["offset"] = offsets.get(pk, 0)
    by_run = {}
    for offset in sorted({offsets.get(pk, 0) for pk in runs}):
        group = [runs[pk] for pk in sorted(runs) if offsets.get(pk, 0) == offset]
        # The window in these runs' own steps (a window ending before a fork's first step: none of its points).
        shifted = series.downsample_ended(group, key, None if start is None else max(start - offset, 0),
                                          None if end is None else max(end - offset, 0), points)
        by_run.update({pk: _shifted(found, offset) for pk, found in shifted.items()})
    return key, runs, by_run


def _aligned(request: HttpRequest) -> bool:
    """Whether forks are drawn from the step of their parent they started at (``?align=fork``, the
    default) rather than at their own steps (``?align=steps``)."""
    return request.GET.get("align", "fork") != "steps"


def _shifted(found: dict, offset: int) -> dict:
    """A downsampled series (``series.downsample_many(..., arrays=True)``) with its steps moved by ``offset``:
    a copy, the cached one is left as it is."""
    if not offset:
        return found
    last = found.get("last_step")
    return {**found, "x": found["x"] + offset, **({"last_step": last + offset} if isinstance(last, int) and last >= 0 else {})}


@login_required
def dashboard_page(request: HttpRequest, pk: int):
    """The dashboard's old page of its own: the run page has everything now."""
    run = get_run_for_user(request.user, pk, "view")
    return redirect(run, permanent=True)


@require_GET
@cache_control(max_age=86400, public=True)
def plotly_js(request: HttpRequest) -> HttpResponse:
    """plotly.min.js from the installed ``plotly`` package: no CDN, no copy in the repository.
    Read once and kept (3.5 MB): a file streamed from a synchronous iterator makes the ASGI server warn."""
    script = _plotly_script()
    if script is None:
        raise Http404("The plotly package is not installed.")
    return HttpResponse(script, content_type="application/javascript")


@functools.cache
def _plotly_script() -> bytes | None:
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path.read_bytes() if path.exists() else None


def _list(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _ints(value: str | None) -> list[int]:
    """Run ids: ASCII digits that fit a bigint (``str.isdigit`` also takes '²'), at most ``MAX_COMPARE_IDS``."""
    return [int(item) for item in _list(value)[:MAX_COMPARE_IDS] if _RUN_ID.fullmatch(item)]


_RUN_ID = re.compile(r"[0-9]{1,18}")


# Steps of the metrics CSV read from the metric store at a time.
CSV_STEPS = 2000
# A cell starting with one of these is a formula to a spreadsheet (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(cell: str) -> str:
    """A text cell of a CSV export, which a spreadsheet shows as text, never runs: metric names are
    whatever a run's code (or an external run's reporter) chose, ``=HYPERLINK(...)`` included."""
    return "'" + cell if cell.startswith(FORMULA_STARTS) else cell


@login_required
@require_GET
def metrics_csv(request, pk: int) -> StreamingHttpResponse:
    """One row per step, one column per metric key (empty where a step did not log that key). The
    keys are text (``csv_text``); the rest are numbers: steps, and values as Python writes floats."""
    run = get_run_for_user(request.user, pk, "view")
    keys = sorted(run.latest_values or {})
    pages = series.windows(run.pk, CSV_STEPS)

    def page() -> list[list]:
        """The rows of the next window of steps ([] at the end)."""
        window = next(pages, None)
        if window is None:
            return []
        by_step: dict[int, dict[str, str]] = {}
        for key, (steps, values) in window.items():
            for step, value in zip(steps.tolist(), values.tolist()):
                by_step.setdefault(step, {})[key] = repr(value) if value == value else ""
        return [[step, *(by_step[step].get(k, "") for k in keys)] for step in sorted(by_step)]

    async def lines():  # an async iterator: the ASGI server streams it without a thread per response
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["step", *map(csv_text, keys)])
        while rows := await sync_to_async(page, thread_sensitive=True)():
            writer.writerows(rows)
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
    return response
