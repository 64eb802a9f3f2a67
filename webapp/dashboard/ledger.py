"""A run's ledger: what it planned and did, step by step, attempt by attempt.

* **Steps**: planned (the resolved ``trainer.total_training_steps``, ``downloads.total_steps``) and
  done (the run's stored ``steps``).
* **Per step**, from the episode store's training episodes (``StoredEpisode``, split ``train``): how
  many episodes it kept, how many were scored (a reward), failed (an error), timed out, were cut by
  length (prompt or response) or by turns, and the share of its groups whose rewards were all equal
  (a group that teaches nothing: its advantages are zero). One aggregate query over a bounded step
  window (at most ``MAX_LEDGER_STEPS`` steps, read through the ``(run, step, ...)`` index).
* **Attempts**: each attempt's number, worker and host, start and end (time and the run's last
  stored step then) and the cause of its end, from its ``RunAttempt`` row (written with the run's
  row changes: ``Run.claim``, ``finish``, ``requeue``, ``recover``). An attempt started before
  attempts had rows is listed by its number alone.
* **Ignored settings**: what the user set that the backend accepts without effect, as the trainer
  recorded it under ``ignored_keys`` in the run's final config (``workers.execute.recorded_config``).
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from training.types import TerminationReason
from webapp.dashboard.models import StoredEpisode
from webapp.runs.downloads import total_steps
from webapp.runs.models import Run, RunAttempt

# The widest step window one ledger reads (its query's bound).
MAX_LEDGER_STEPS = 500
# The most attempts one ledger lists (the latest); a backend allows far fewer.
MAX_ATTEMPTS = 100
CUT_BY_LENGTH = (TerminationReason.MAX_PROMPT_LENGTH.value, TerminationReason.MAX_RESPONSE_LENGTH.value)

# Per (step, group) first, then per step: the groups' counts summed and the all-equal groups counted.
# A group is all equal when its lowest and highest reward are the same (unscored episodes aside);
# a group without a scored episode is not counted among the groups the share is of. SQL because the
# ORM cannot aggregate over a grouped subquery: per-group rows would otherwise come back to Python.
# Written for PostgreSQL and SQLite alike (the embedded platform): FILTER, no arrays.
_STEP_QUERY = f"""
SELECT step, SUM(episodes), SUM(scored), SUM(failed), SUM(timed_out), SUM(cut_by_length), SUM(cut_by_turns),
       COUNT(*) FILTER (WHERE scored > 0), COUNT(*) FILTER (WHERE scored > 0 AND low = high)
FROM (
    SELECT step, "group", COUNT(*) AS episodes, COUNT(reward) AS scored,
           COUNT(*) FILTER (WHERE error <> '' OR termination_reason = %(error)s) AS failed,
           COUNT(*) FILTER (WHERE termination_reason = %(timeout)s) AS timed_out,
           COUNT(*) FILTER (WHERE termination_reason IN ({", ".join(f"%(cut{i})s" for i in range(len(CUT_BY_LENGTH)))})) AS cut_by_length,
           COUNT(*) FILTER (WHERE termination_reason = %(max_turns)s) AS cut_by_turns,
           MIN(reward) AS low, MAX(reward) AS high
    FROM {StoredEpisode._meta.db_table}
    WHERE run_id = %(run)s AND split = %(split)s AND step BETWEEN %(low)s AND %(high)s
    GROUP BY step, "group"
) AS groups
GROUP BY step
ORDER BY step
"""
_STEP_FIELDS = ("step", "episodes", "scored", "failed", "timed_out", "cut_by_length", "cut_by_turns", "groups",
                "all_equal_groups")


def step_window(run: Run, step_min: int | None, step_max: int | None) -> tuple[int, int] | None:
    """The steps a ledger reads: those asked for, cut to ``MAX_LEDGER_STEPS`` from ``step_min``, else
    the last ``MAX_LEDGER_STEPS`` up to ``step_max`` or the run's highest stored step. None: no
    training episode is stored."""
    if step_min is not None:
        high = step_min + MAX_LEDGER_STEPS - 1
        return step_min, min(high, step_max) if step_max is not None else high
    if step_max is None:
        # The unique (run, step, split, position) index's last entry of the run.
        step_max = (StoredEpisode.objects.filter(run=run, split=StoredEpisode.Split.TRAIN)
                    .order_by("-step").values_list("step", flat=True).first())
        if step_max is None:
            return None
    return max(0, step_max - MAX_LEDGER_STEPS + 1), step_max


def step_rows(run: Run, low: int, high: int) -> list[dict[str, Any]]:
    """Each step of ``low..high`` with training episodes stored: its counts and all-equal share."""
    with connection.cursor() as cursor:
        cursor.execute(_STEP_QUERY, {
            "run": run.pk, "split": StoredEpisode.Split.TRAIN.value, "low": low, "high": high,
            "error": TerminationReason.ERROR.value, "timeout": TerminationReason.TIMEOUT.value,
            "max_turns": TerminationReason.MAX_TURNS.value, **{f"cut{i}": reason for i, reason in enumerate(CUT_BY_LENGTH)},
        })
        rows = [dict(zip(_STEP_FIELDS, (int(value) for value in row))) for row in cursor.fetchall()]
    for row in rows:
        row["all_equal_share"] = row["all_equal_groups"] / row["groups"] if row["groups"] else None
        row["failed_share"] = row["failed"] / row["episodes"] if row["episodes"] else None
    return rows


def attempts(run: Run) -> list[dict[str, Any]]:
    """Attempt 1..``run.attempts``: ``worker``, ``host``, ``start``, ``start_step``, ``end``,
    ``end_step``, ``cause`` (a ``RunAttempt.Cause`` value, None while it runs), ``cause_label`` and
    ``detail``. A share link's reader reads them too: the run's live status tells them its worker
    already, and the sweep's reason for a lost attempt names it. At most ``MAX_ATTEMPTS`` rows (the latest), read by the (run, number) index."""
    rows = {row.number: row for row in RunAttempt.objects.filter(run=run, number__gt=run.attempts - MAX_ATTEMPTS)}
    found = []
    for number in range(max(1, run.attempts - MAX_ATTEMPTS + 1), run.attempts + 1):
        row = rows.get(number)
        found.append({
            "attempt": number, "worker": row.worker if row else "", "host": row.host if row else "",
            "start": row.started_at if row else None, "start_step": row.start_step if row else None,
            "end": row.ended_at if row else None, "end_step": row.end_step if row else None,
            "cause": row.cause or None if row else None,
            "cause_label": row.get_cause_display() if row and row.cause else None,
            "detail": row.detail if row else "",
        })
    return found


def ignored_settings(run: Run) -> list[dict[str, Any]]:
    """The settings the backend accepted without effect: ``[{"key", "value", "why"}]``, by key."""
    final = run.final_config if isinstance(run.final_config, dict) else {}
    ignored = final.get("ignored_keys") or {}
    if not isinstance(ignored, dict):
        return []
    return [{"key": key, "value": entry.get("value") if isinstance(entry, dict) else entry,
             "why": entry.get("why", "") if isinstance(entry, dict) else ""}
            for key, entry in sorted(ignored.items())]


def ledger(run: Run, step_min: int | None = None, step_max: int | None = None, with_config: bool = True) -> dict[str, Any]:
    """The whole ledger of ``run`` (the API's body, the run page's section). ``with_config`` False
    (a share link's reader): ``ignored_settings`` is None, since they are part of the run's config."""
    window = step_window(run, step_min, step_max)
    return {
        "run": run.pk,
        "steps_planned": total_steps(run),
        "steps_done": run.steps,
        "attempts_started": run.attempts,
        "attempts_lost": run.lost_attempts,
        "step_window": {"step_min": window[0], "step_max": window[1]} if window else None,
        "steps": step_rows(run, *window) if window else [],
        "attempts": attempts(run),
        "ignored_settings": ignored_settings(run) if with_config else None,
    }
