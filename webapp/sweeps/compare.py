"""The compare page's parameter view: the config keys on which the selected runs differ (and only
those), and each run's final metrics, for a scatter of a metric against one hyperparameter."""

from __future__ import annotations

from typing import Any

from training.config import flatten

_MISSING = object()


def run_config(run) -> dict[str, Any]:
    """A run's flat config: the final config when it started, else its overrides."""
    if run.final_config:
        return flatten(run.final_config)
    return dict(run.config_overrides or {})


def differing_config(runs: list) -> list[dict[str, Any]]:
    """Rows ``{"key", "values"}`` (one value per run, None where a run lacks the key) for the keys whose
    values are not all equal, plus the model and backend when those differ."""
    configs = [{"model": run.model, "backend": run.backend.name if run.backend_id else "", **run_config(run)} for run in runs]
    keys = sorted(set().union(*configs)) if configs else []
    rows = []
    for key in keys:
        values = [config.get(key, _MISSING) for config in configs]
        if len({repr(v) for v in values}) > 1:
            rows.append({"key": key, "values": [None if v is _MISSING else v for v in values]})
    return rows


def parameter_points(runs: list, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the scatter needs: per run, its final metrics and its differing config values."""
    return {
        "runs": [{"id": run.pk, "name": str(run), "metrics": run.latest_metrics()} for run in runs],
        "params": {row["key"]: row["values"] for row in rows},
    }


def parameter_context(runs: list) -> dict[str, Any]:
    """The compare page's template context for ``sweeps/compare_params.html``."""
    rows = differing_config(runs) if len(runs) > 1 else []
    return {"param_rows": rows, "param_points": parameter_points(runs, rows)}
