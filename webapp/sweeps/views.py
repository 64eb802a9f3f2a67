"""Sweeps in the browser: start one from a run, follow its trials, chart the objective per key."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.runs.access import can, get_run_for_user
from webapp.sweeps import engine
from webapp.sweeps.forms import SweepForm
from webapp.sweeps.models import Sweep


def sweep_for_user(user, pk: int, action: str = "view") -> Sweep:
    """The sweep if ``user`` may ``action`` it: its owner, or (to view) whoever may view its base run."""
    sweep = Sweep.objects.select_related("base_run", "owner").filter(pk=pk).first()
    if sweep is None or not (sweep.owner_id == user.pk or user.is_superuser or (action == "view" and can(user, sweep.base_run, "view"))):
        raise Http404("No such sweep.")
    return sweep


@login_required
def sweep_list(request):
    return render(request, "sweeps/sweep_list.html", {"sweeps": Sweep.objects.filter(owner=request.user).select_related("base_run")})


@login_required
def sweep_create(request):
    try:
        base_id = int(request.GET.get("base") or request.POST.get("base") or 0)
    except ValueError:
        base_id = 0
    base = get_run_for_user(request.user, base_id, "run") if base_id else None
    if base is None:
        raise Http404("Start a sweep from a run: its page has a Sweep button.")
    form = SweepForm(request.POST or None, base_run=base, initial={"name": f"{base.name or f'run {base.pk}'} sweep"})
    if request.method == "POST" and form.is_valid():
        try:
            sweep = form.save(request.user)
        except engine.TrialRefused as exc:
            form.add_error(None, f"No trial could start, so the sweep was not created: {exc}")
        else:
            messages.success(request, f"Sweep started: {sweep.parallel} trial(s) at a time, {engine.trial_limit(sweep)} at most.")
            return redirect(sweep)
    return render(request, "sweeps/sweep_form.html", {"form": form, "base": base})


@login_required
def sweep_detail(request, pk: int):
    sweep = sweep_for_user(request.user, pk)
    trials = list(sweep.trials.select_related("run"))
    keys = list(sweep.space)
    for trial in trials:
        trial.values = [trial.params.get(key) for key in keys]
    points = [{"number": t.number, "run": t.run_id, "state": t.state, "value": t.value, "params": t.params} for t in trials]
    scored = [t for t in trials if t.value is not None]
    best = (max if sweep.direction == Sweep.Direction.MAXIMIZE else min)(scored, key=lambda t: t.value) if scored else None
    return render(request, "sweeps/sweep_detail.html", {
        "sweep": sweep, "trials": trials, "keys": keys, "best": best, "points": points,
        "may_cancel": sweep.owner_id == request.user.pk and sweep.status == Sweep.Status.RUNNING,
    })


@login_required
@require_POST
def sweep_cancel(request, pk: int):
    sweep = sweep_for_user(request.user, pk, "cancel")
    stopped = engine.cancel(sweep)
    messages.info(request, f"Sweep cancelled; {stopped} running trial(s) asked to stop.")
    return redirect(sweep)
