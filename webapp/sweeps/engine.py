"""Running a sweep on the platform: trials are ordinary runs; Optuna picks each next point and
decides pruning from what the trials recorded (``training.sweep``).

- ``launch(sweep)`` starts trials until ``parallel`` run at once or ``max_trials`` exist; the
  sweep row is locked meanwhile, so two callers never start the same trial twice.
- A trial's run ending (``run_status_changed``) records its objective and launches the next.
- In the trial's training process, ``PruningSink`` reports the objective each step and, when
  Optuna's median pruner says so, marks the trial pruned and asks the run to stop.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.db import transaction

from training.sweep import TrialRecord, ask_next, grid_size, parse_space, should_prune
from webapp.runs.models import Run
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
        from webapp.dashboard.series import all_points

        for run_id, (steps, values) in all_points([t.run_id for t in trials], sweep.objective).items():
            series[run_id] = {int(s): float(v) for s, v in zip(steps, values) if math.isfinite(v)}
    return [TrialRecord(params=t.params, state=t.state, value=t.value, intermediate=series.get(t.run_id, {}),
                        system_attrs=t.system_attrs) for t in trials]


def launch(sweep_id: int) -> list[Run]:
    """Start as many trials as the sweep allows now. Returns the new runs (queued)."""
    started: list[Run] = []
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().select_related("base_run").get(pk=sweep_id)
        if sweep.status != Sweep.Status.RUNNING:
            return started
        space = parse_space(sweep.space)
        limit = trial_limit(sweep)
        trials = _records(sweep)
        running = sum(1 for t in trials if t.state == Trial.State.RUNNING)
        while running < sweep.parallel and len(trials) < limit:
            record = ask_next(space, sweep.sampler, sweep.seed, sweep.direction, trials)
            run = _trial_run(sweep, len(trials), record.params)
            Trial.objects.create(sweep=sweep, number=len(trials), run=run, params=record.params, system_attrs=record.system_attrs)
            trials.append(record)
            running += 1
            started.append(run)
        if running == 0 and len(trials) >= limit:
            Sweep.objects.filter(pk=sweep.pk).update(status=Sweep.Status.FINISHED)
    for run in started:
        run.enqueue()
    return started


def _trial_run(sweep: Sweep, number: int, params: dict[str, Any]) -> Run:
    base = sweep.base_run
    return Run.objects.create(
        owner=sweep.owner, name=f"{sweep.name} #{number}", project=base.project, visibility=base.visibility,
        agent=base.agent, dataset=base.dataset, reward=base.reward, backend=base.backend, model=base.model,
        config_overrides={**base.config_overrides, **params}, tags=[f"sweep-{sweep.pk}"],
        notes=f"Trial {number} of sweep {sweep.name!r}: " + ", ".join(f"{k}={v}" for k, v in params.items()),
        status=Run.Status.QUEUED,
    )


def objective_value(run: Run, key: str) -> float | None:
    value = (run.final_metrics or {}).get(key)
    if value is None:
        value = (Run.objects.filter(pk=run.pk).values_list("latest_values", flat=True).first() or {}).get(key)
    return value if value is not None and math.isfinite(value) else None


def on_status_changed(sender, run: Run, **kwargs) -> None:
    """A trial's run ended: record the objective (or why not), then start the next trials."""
    if run.status not in Run.FINAL:
        return
    trial = Trial.objects.filter(run_id=run.pk).select_related("sweep").first()
    if trial is None:
        return
    value = objective_value(run, trial.sweep.objective)
    if run.status == Run.Status.SUCCEEDED and value is not None:
        state = Trial.State.COMPLETE
    elif trial.state == Trial.State.PRUNED or run.status == Run.Status.PRUNED:
        state = Trial.State.PRUNED
    else:
        state = Trial.State.FAILED
    Trial.objects.filter(pk=trial.pk).update(state=state, value=value)
    sweep_id = trial.sweep_id
    transaction.on_commit(lambda: launch(sweep_id))


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
