"""A run whose folder holds published checkpoints, as its attempts leave them (``<run>/checkpoints/
checkpoint-N``, tiny models saved whole) and, optionally, metric points at their steps in the store."""

from __future__ import annotations

from training.rollouts.tiny import save_tiny_model


def with_checkpoints(run, steps: list[int], metrics: dict[int, dict[str, float]] | None = None):
    """``run`` with a saved tiny model published at each of ``steps`` (a different seed each) and
    ``metrics`` ({step: {key: value}}) written to the metric store; its ``run_path`` set to its folder."""
    from webapp.dashboard.series import SeriesWriter
    from webapp.runs.models import Run

    folder = run.folder()
    for step in steps:
        save_tiny_model(folder / "checkpoints" / f"checkpoint-{step}", seed=step)
    Run.objects.filter(pk=run.pk).update(run_path=str(folder))
    if metrics:
        SeriesWriter(run.pk).write([(key, step, value) for step, values in metrics.items() for key, value in values.items()])
    run.refresh_from_db()
    return run
