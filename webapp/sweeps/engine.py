"""Running a sweep on the platform: trials are ordinary runs; Optuna picks each next point and
decides pruning from what the trials recorded (``training.platform.sweep``).

- ``create(...)`` makes a sweep and starts its first trials, or refuses it (nothing kept) when
  they cannot start.
- ``launch(sweep)`` starts trials until ``parallel`` run at once or ``max_trials`` exist; the
  sweep row is locked meanwhile, so two callers never start the same trial twice. Each trial is
  submitted as the run form submits a run (``submit_trial``: the same checks, the owner's and the
  project's quota). A sweep whose owner may no longer start runs from its base run (they left the
  team), or whose next trial is refused, is stopped with the reason; a full quota only waits while
  the sweep's own trials run (the next trial's end tries again).
- A trial's run ending (``run_status_changed``) records its objective and launches the next.
- In the trial's training process, ``PruningSink`` reports the objective each step and, when
  Optuna's median pruner says so, marks the trial pruned and asks the run to stop.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from django.core.exceptions import NON_FIELD_ERRORS
from django.db import transaction

from training.platform.sweep import TrialRecord, ask_next, grid_size, parse_space, should_prune
from webapp.dashboard.series import all_points
from webapp.runs.access import can
from webapp.runs.forms import RunForm, overrides_text
from webapp.policy.limits import MAX_NOTES_CHARS
from webapp.runs.models import Run, run_status_changed
from webapp.runs.submission import QuotaExceeded
from webapp.runs.trainer_args import clone_overrides
from webapp.sweeps.models import Sweep, Trial

logger = logging.getLogger(__name__)

MAX_TRIALS = 100
MAX_PARALLEL = 8


def trial_limit(sweep: Sweep) -> int:
    size = grid_size(parse_space(sweep.space)) if sweep.sampler == Sweep.Sampler.GRID else None
    return min(sweep.max_trials, size) if size else sweep.max_trials


def _records(sweep: Sweep, with_intermediate: bool = False) -> list[TrialRecord]:
    trials = list(sweep.trials.all())
    series: dict[int, dict[int, float]] = {}
    if with_intermediate:
        for run_id, (steps, values) in all_points([t.run_id for t in trials], sweep.objective).items():
            series[run_id] = {int(s): float(v) for s, v in zip(steps, values) if math.isfinite(v)}
    return [TrialRecord(params=t.params, state=t.state, value=t.value, intermediate=series.get(t.run_id, {}),
                        system_attrs=t.system_attrs) for t in trials]


class TrialRefused(Exception):
    """A trial's run was not created: the message says why. ``quota``: only because the owner's or
    the project's quota is full, which frees up as runs end."""

    def __init__(self, message: str, quota: bool = False) -> None:
        super().__init__(message)
        self.quota = quota


def create(owner, **fields: Any) -> Sweep:
    """A new sweep with its first trials queued. Raises ``TrialRefused`` (nothing is kept: no
    sweep, no run) when they cannot start: the quota is full, or the first trial fails the run's checks."""
    with transaction.atomic():
        sweep = Sweep.objects.create(owner=owner, **fields)
        _launch(sweep.pk, refuse=True)
    return sweep


def launch(sweep_id: int) -> list[Run]:
    """Start as many trials as the sweep allows now. Returns the new runs (queued)."""
    return _launch(sweep_id, refuse=False)


def _launch(sweep_id: int, refuse: bool) -> list[Run]:
    started: list[Run] = []
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update(of=("self",)).select_related("base_run__project", "owner").get(pk=sweep_id)
        if sweep.status != Sweep.Status.RUNNING:
            return started
        space = parse_space(sweep.space)
        limit = trial_limit(sweep)
        trials = _records(sweep)
        running = sum(1 for t in trials if t.state == Trial.State.RUNNING)
        while running < sweep.parallel and len(trials) < limit:
            if not can(sweep.owner, sweep.base_run, "run"):
                base = sweep.base_run
                where = f" in project {base.project.name}" if base.project_id else ""
                _stop(sweep, f"Stopped before trial {len(trials)}: {sweep.owner} may no longer start runs from run "
                             f"{base.pk}{where} (they left its team, or their role there changed).")
                break
            record = ask_next(space, sweep.sampler, sweep.seed, sweep.direction, trials)
            try:
                run = submit_trial(sweep, len(trials), record.params)
            except TrialRefused as exc:
                if refuse and not (exc.quota and started):
                    raise
                if exc.quota and running:
                    break  # a trial's end launches again
                _stop(sweep, f"Stopped: trial {len(trials)} ({_params_text(record.params)}) could not start. {exc}")
                break
            Trial.objects.create(sweep=sweep, number=len(trials), run=run, params=record.params, system_attrs=record.system_attrs)
            trials.append(record)
            running += 1
            started.append(run)
        if running == 0 and len(trials) >= limit:
            Sweep.objects.filter(pk=sweep.pk).update(status=Sweep.Status.FINISHED)
    return started


def _stop(sweep: Sweep, reason: str) -> None:
    Sweep.objects.filter(pk=sweep.pk, status=Sweep.Status.RUNNING).update(status=Sweep.Status.STOPPED, stop_reason=reason)
    logger.info("sweep %s: %s", sweep.pk, reason)


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in params.items())


def submit_trial(sweep: Sweep, number: int, params: dict[str, Any]) -> Run:
    """The trial's run, submitted through the run form as its owner would submit it (the same
    checks of the choices and overrides, the run's sandboxed check, the quota): the base run's
    choices and the config it was validated with (``clone_overrides``), with ``params`` over them.
    Raises ``TrialRefused`` saying why not."""
    base = sweep.base_run
    form = RunForm({
        "name": f"{sweep.name[:180]} #{number}", "project": base.project_id or "", "visibility": base.visibility,
        "agent": base.agent_id or "", "dataset": base.dataset_id or "", "reward": base.reward_id or "",
        "backend": base.backend_id or "", "model": base.model,
        "overrides": overrides_text({**clone_overrides(base), **params}), "tags": f"sweep-{sweep.pk}",
        "notes": f"Trial {number} of sweep {sweep.name!r}: {_params_text(params)}"[:MAX_NOTES_CHARS],
    }, user=sweep.owner)
    if not form.is_valid():
        raise TrialRefused(" ".join(f"{'' if field == NON_FIELD_ERRORS else field + ': '}{' '.join(errors)}"
                                    for field, errors in form.errors.items()), quota=form.quota_full is not None)
    try:
        return form.save(owner=sweep.owner)
    except QuotaExceeded as exc:
        raise TrialRefused(str(exc), quota=True) from None


def objective_value(run: Run, sweep: Sweep) -> float | None:
    """A trial's score: the objective's last value (the run's final metrics, else its latest), or,
    over the run's stored steps with a finite value, the highest, the lowest or the mean of the last N."""
    key = sweep.objective
    if sweep.objective_summary == Sweep.Summary.LAST:
        value = (run.final_metrics or {}).get(key)
        if value is None:
            value = (Run.objects.filter(pk=run.pk).values_list("latest_values", flat=True).first() or {}).get(key)
        return value if value is not None and math.isfinite(value) else None
    _, values = all_points([run.pk], key)[run.pk]
    values = values[np.isfinite(values)]
    if sweep.objective_summary == Sweep.Summary.MEAN_LAST:
        values = values[-sweep.objective_steps:]
    if not values.size:
        return None
    summarise = {Sweep.Summary.MAX: np.max, Sweep.Summary.MIN: np.min, Sweep.Summary.MEAN_LAST: np.mean}[sweep.objective_summary]
    return float(summarise(values))


def connect() -> None:
    run_status_changed.connect(on_status_changed, dispatch_uid="sweeps.trial_ended")


def on_status_changed(sender, run: Run, **kwargs) -> None:
    """A trial's run ended: record the objective (or why not), then start the next trials."""
    if run.status not in Run.FINAL:
        return
    trial = Trial.objects.filter(run_id=run.pk).select_related("sweep").first()
    if trial is None:
        return
    value = objective_value(run, trial.sweep)
    if run.status == Run.Status.SUCCEEDED and value is not None:
        state = Trial.State.COMPLETE
    elif trial.state == Trial.State.PRUNED or run.status == Run.Status.PRUNED:
        state = Trial.State.PRUNED
    else:
        state = Trial.State.FAILED
    Trial.objects.filter(pk=trial.pk).update(state=state, value=value)
    sweep_id = trial.sweep_id
    # Robust: the next trial's checks (a child process) failing must not undo recording this one's end.
    transaction.on_commit(lambda: launch(sweep_id), robust=True)


def cancel(sweep: Sweep) -> int:
    """Stop the sweep: no new trials; running ones are cancelled. Returns how many were asked to stop."""
    Sweep.objects.filter(pk=sweep.pk, status=Sweep.Status.RUNNING).update(status=Sweep.Status.CANCELLED)
    stopped = 0
    for trial in sweep.trials.filter(state=Trial.State.RUNNING).select_related("run"):
        stopped += trial.run.request_cancel()
    return stopped


class PruningSink:
    """In a trial's training process: each step's objective goes to Optuna's pruner with the other
    trials' recorded series; a hopeless trial is marked pruned and its run asked to stop."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.trial = Trial.objects.filter(run_id=run.pk).select_related("sweep").first()
        self.intermediate: dict[int, float] = {}
        self.done = self.trial is None or not self.trial.sweep.prune

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if self.done or self.trial.sweep.objective not in metrics:
            return
        self.intermediate[step] = metrics[self.trial.sweep.objective]
        sweep = self.trial.sweep
        space = parse_space(sweep.space)
        others = [t for t in _records(sweep, with_intermediate=True) if t.state in (Trial.State.COMPLETE,)]
        current = TrialRecord(params=self.trial.params, intermediate=dict(self.intermediate))
        if should_prune(space, sweep.direction, others, current):
            self.done = True
            Trial.objects.filter(pk=self.trial.pk, state=Trial.State.RUNNING).update(state=Trial.State.PRUNED)
            logging.getLogger("training").info(
                "sweep %s: trial %d pruned at step %d (%s=%.4g is behind the median of completed trials)",
                sweep.name, self.trial.number, step, sweep.objective, metrics[sweep.objective])
            self.run.request_cancel(reason="pruned")

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass
