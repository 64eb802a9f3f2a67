"""The compare page's parameter view: the config keys on which the selected runs differ (and only
those), and each run's final metrics, for a scatter of a metric against one hyperparameter."""

from __future__ import annotations

from typing import Any

from webapp.runs.table import run_config

_MISSING = object()
# The registry choices and the model, before the dotted config keys: what a person tells runs apart by.
CHOICES = ("agent", "dataset", "reward", "model", "backend")


def _choices(run) -> dict[str, str]:
    """A run's registry choices by name (empty where it names none, as an external run may)."""
    return {"agent": run.agent.name if run.agent_id else "", "dataset": run.dataset.name if run.dataset_id else "",
            "reward": run.reward.name if run.reward_id else "", "model": run.model,
            "backend": run.backend.name if run.backend_id else ""}


def differing_config(runs: list) -> list[dict[str, Any]]:
    """Rows ``{"key", "values"}`` (one value per run, None where a run lacks the key) for the keys whose
    values are not all equal: the agent, dataset, reward, model and backend first, then the config keys."""
    configs = [{**run_config(run), **_choices(run)} for run in runs]
    keys = [*CHOICES, *sorted(set().union(*configs) - set(CHOICES))] if configs else []
    rows = []
    for key in keys:
        values = [config.get(key, _MISSING) for config in configs]
        if len({repr(v) for v in values}) > 1:
            rows.append({"key": key, "values": [None if v is _MISSING or v == "" else v for v in values]})
    return rows


def parameter_points(runs: list, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the scatter needs: per run, its final metrics and its differing config values."""
    return {
        "runs": [{"id": run.pk, "name": str(run), "metrics": run.latest_metrics()} for run in runs],
        "params": {row["key"]: row["values"] for row in rows},
    }


def parameter_context(runs: list) -> dict[str, Any]:
    """The compare page's template context for ``dashboard/compare_params.html``."""
    rows = differing_config(runs) if len(runs) > 1 else []
    return {"param_rows": rows, "param_points": parameter_points(runs, rows)}
