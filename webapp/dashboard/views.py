"""JSON for the charts (downsampled series, zoomed ranges, compare), episodes, and the pages."""

from __future__ import annotations

import functools
from pathlib import Path

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from webapp.dashboard import series
from webapp.dashboard.models import EpisodeSample
from webapp.runs.access import get_run_for_user
from webapp.runs.models import Run

# The charts a run page opens with; every other key is one search away.
HEADLINE_KEYS = ("reward", "reward_std", "loss", "kl", "entropy", "response_length", "turns", "step_time")
# The charts the compare page opens with.
COMPARE_KEYS = ("reward", "loss", "kl", "response_length")
# Points per run per compare chart: a hundred runs share a ~450 px wide chart, so ~100 min/max
# buckets per run lose nothing visible (spikes survive: each bucket keeps its min and its max).
COMPARE_POINTS = 200
TERMINATION_PREFIX = "termination/"
VALIDATION_PREFIX = "val/"  # test-set scores on schedule: val/<data_source>/reward, pass@k
MAX_COMPARE_RUNS = 500
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


@login_or_share_link_required
@require_GET
def run_series(request: HttpRequest, pk: int) -> JsonResponse:
    """``?keys=a,b`` (default: the headline charts) ``&start=&end=`` (a zoomed range) ``&points=``."""
    run = get_run_for_user(request.user, pk, "view", share_token=_share_token(request))
    all_keys = series.keys_of(run.pk)
    wanted = _list(request.GET.get("keys")) or [
        k for k in all_keys if k in HEADLINE_KEYS or k.startswith((TERMINATION_PREFIX, VALIDATION_PREFIX))
    ]
    start, end = _optional_int(request.GET.get("start")), _optional_int(request.GET.get("end"))
    points = _optional_int(request.GET.get("points")) or series.DEFAULT_POINTS
    return JsonResponse({
        "run": run.pk, "status": run.status, "keys": all_keys, "last_step": series.last_step_of(run.pk),
        "series": {key: series.downsample(run.pk, key, start, end, points) for key in wanted[:MAX_KEYS_PER_REQUEST]},
    })


@login_or_share_link_required
@require_GET
def run_episodes(request: HttpRequest, pk: int) -> JsonResponse:
    """Steps that have sampled episodes, and the samples of ``?step=`` (default: the latest)."""
    run = get_run_for_user(request.user, pk, "view", share_token=_share_token(request))
    samples = EpisodeSample.objects.filter(run=run)
    steps = sorted(set(samples.values_list("step", flat=True)))
    step = _optional_int(request.GET.get("step"))
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
    runs = list(Run.objects.visible_to(request.user).filter(pk__in=_ints(",".join(request.GET.getlist("runs"))))
                .select_related("agent", "dataset").order_by("pk")[:MAX_COMPARE_RUNS])
    return render(request, "dashboard/compare.html", {
        "runs": runs, "run_ids": ",".join(str(r.pk) for r in runs), "headline_keys": HEADLINE_KEYS,
        "compare_keys": COMPARE_KEYS,
    })


@login_required
@require_GET
def compare_series(request: HttpRequest) -> JsonResponse:
    """``?runs=1,2,..&key=reward&points=&start=&end=``: one downsampled series per visible run."""
    key = request.GET.get("key") or "reward"
    runs = {r.pk: r for r in Run.objects.visible_to(request.user).filter(pk__in=_ints(",".join(request.GET.getlist("runs"))))[:MAX_COMPARE_RUNS]}
    points = _optional_int(request.GET.get("points")) or COMPARE_POINTS
    start, end = _optional_int(request.GET.get("start")), _optional_int(request.GET.get("end"))
    by_run = series.downsample_many(sorted(runs), key, start, end, points) if runs else {}
    return JsonResponse({
        "key": key,
        "runs": [{"id": pk, "name": str(runs[pk]), "status": runs[pk].status, **by_run[pk]} for pk in sorted(runs)],
    })


@login_required
def dashboard_page(request: HttpRequest, pk: int):
    """The dashboard panel on a page of its own (the run page embeds the same panel)."""
    run = get_run_for_user(request.user, pk, "view")
    return render(request, "dashboard/run_page.html", {"run": run})


@require_GET
@cache_control(max_age=86400, public=True)
def plotly_js(request: HttpRequest) -> FileResponse:
    """plotly.min.js from the installed ``plotly`` package: no CDN, no copy in the repository."""
    path = _plotly_path()
    if path is None:
        raise Http404("The plotly package is not installed.")
    return FileResponse(open(path, "rb"), content_type="application/javascript")


@functools.cache
def _plotly_path() -> Path | None:
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path if path.exists() else None


def _list(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _ints(value: str | None) -> list[int]:
    return [int(item) for item in _list(value) if item.isdigit()]


def _optional_int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "") else None
    except ValueError:
        return None
