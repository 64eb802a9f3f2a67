"""The compare page's parameter view: the config keys on which the selected runs differ (and only
those), and each run's final metrics, for a scatter of a metric against one hyperparameter; and
where its forks are drawn: from the step of their parent they started at."""

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


def fork_offsets(links: dict[int, tuple[int | None, int | None]]) -> dict[int, int]:
    """How far each compared fork's steps move (``links``: each compared run's parent and parent step)
    so that it is drawn from the step of its parent it started at: a fork's step k at
    ``parent_step + k``, a fork of a fork further on by its parent's own offset, as far up as the
    compared runs go. Runs whose parent is not compared keep their steps (left out)."""
    offsets: dict[int, int] = {}

    def offset(pk: int, seen: frozenset = frozenset()) -> int:
        parent, step = links[pk]
        if parent not in links or step is None or pk in seen:
            return 0
        if pk not in offsets:
            offsets[pk] = step + offset(parent, seen | {pk})
        return offsets[pk]

    for pk in links:
        offset(pk)
    return {pk: value for pk, value in offsets.items() if value}


def lineage_context(runs: list, aligned: bool) -> dict[str, Any]:
    """The compare page's note on its forks: each fork whose parent is compared too, and by how much
    its steps are moved (``aligned``) or that they are not."""
    offsets = fork_offsets({run.pk: (run.parent_id, run.parent_step) for run in runs})
    by_pk = {run.pk: run for run in runs}
    forks = [{"run": run, "parent": by_pk[run.parent_id], "offset": offsets[run.pk]} for run in runs if run.pk in offsets]
    return {"compared_forks": forks, "align": "fork" if aligned else "steps"}
