"""Reward-health monitors: what a run's stored metrics and episodes say about how it learns, step by
step, and the alerts a project's rules (``MonitorRule``) raise from them, each with its evidence.

A monitor is a value per step, computed when it is read from what the run stored (never from the
live stream), over its last ``MAX_MONITOR_STEPS`` steps. It audits a run: it tells where something
moved and shows the episodes behind it; it makes no promise to warn before a run goes wrong.

- ``response_length_drift``: the mean response length of the last ``window`` steps against that of
  the first ``window``, as ``|now / then - 1|`` (the ``response_length`` metric every backend reports;
  the episode store's mean where the metric is missing).
- ``all_equal_groups``: the share of groups whose rewards were all equal (they teach nothing: their
  advantages are zero), the mean of the last ``window`` steps (the ledger's per-step share).
- ``entropy_collapse``: ``1 - entropy now / entropy then`` (the means of the last and the first
  ``window`` steps' ``entropy``); where the backend reports entropy.
- ``kl_spike`` and ``clip_fraction_spike``: a step's value over the mean of the ``window`` steps before
  it (``kl``; ``clip_fraction``, verl's ``actor/pg_clipfrac`` or TRL's ``clip_ratio/region_mean``);
  where the backend reports them.
- ``component_dominance``: the largest reward component's share of the components' total (their
  absolute values), the mean of the last ``window`` steps (``reward_components/<name>``, which the
  episode runner's backends report where a reward returns components).
- ``validation_divergence``: at each validation step, the mean training ``reward`` of the last
  ``window`` steps minus the validation reward (the mean of the ``val/<source>/reward`` keys).

A rule fires at the first step of each stretch where its monitor is above its threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.db.models import Avg, Q

from webapp.dashboard import episodes as episode_store
from webapp.dashboard import ledger, series
from webapp.dashboard.models import StoredEpisode
from webapp.monitors.models import Monitor, MonitorRule
from webapp.runs.models import Run

# The steps a monitor reads: the run's last ones (the ledger's bound, one aggregate query).
MAX_MONITOR_STEPS = ledger.MAX_LEDGER_STEPS
DEFAULT_WINDOW = 5
# Alerts one rule raises at most (the first steps of its stretches above the threshold).
MAX_ALERTS_PER_RULE = 20
# Episodes an alert's evidence shows at most: those of its step, then as many of the same prompts earlier.
MAX_EVIDENCE_EPISODES = 200
CLIP_FRACTION_KEYS = ("clip_fraction", "actor/pg_clipfrac", "clip_ratio/region_mean")
COMPONENT_PREFIX = "reward_components/"

# What each monitor reads, in words (shown beside it), and a threshold to start from.
ABOUT = {
    Monitor.RESPONSE_LENGTH_DRIFT: ("|mean response length of the last steps / of the first steps - 1|", 0.5),
    Monitor.ALL_EQUAL_GROUPS: ("share of groups whose rewards were all equal", 0.5),
    Monitor.ENTROPY_COLLAPSE: ("1 - entropy of the last steps / of the first steps", 0.5),
    Monitor.KL_SPIKE: ("KL at a step / mean KL of the steps before it", 5.0),
    Monitor.CLIP_FRACTION_SPIKE: ("clip fraction at a step / mean of the steps before it", 3.0),
    Monitor.COMPONENT_DOMINANCE: ("largest reward component's share of all components", 0.9),
    Monitor.VALIDATION_DIVERGENCE: ("training reward - validation reward", 0.2),
}

Series = list[tuple[int, float]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _trailing(points: Series, window: int) -> Series:
    """Each step's mean of the last ``window`` points up to it."""
    return [(step, _mean([v for _, v in points[max(0, i - window + 1):i + 1]])) for i, (step, _) in enumerate(points)]


def _against_start(points: Series, window: int, measure: Callable[[float, float], float]) -> Series:
    """``measure(now, then)`` from the ``window``-th point on: the trailing mean against the mean of
    the first ``window`` points (a start of zero measures nothing)."""
    if len(points) < window:
        return []
    then = _mean([v for _, v in points[:window]])
    if then == 0:
        return []
    return [(step, measure(now, then)) for step, now in _trailing(points, window)[window - 1:]]


def _spikes(points: Series, window: int) -> Series:
    """Each step's absolute value over the mean absolute value of the ``window`` points before it."""
    found = []
    for i in range(window, len(points)):
        before = _mean([abs(v) for _, v in points[i - window:i]])
        if before > 0:
            found.append((points[i][0], abs(points[i][1]) / before))
    return found


class RunData:
    """What the monitors of one run read, each fetched once: its metrics over the last
    ``MAX_MONITOR_STEPS`` steps, and the episode store's per-step aggregates."""

    def __init__(self, run: Run) -> None:
        self.run = run
        # The run's last step: its metrics' (kept on its row) or its stored episodes', the later.
        episodes_through = (StoredEpisode.objects.filter(run=run, split=StoredEpisode.Split.TRAIN)
                            .order_by("-step").values_list("step", flat=True).first())
        self.high = max(run.steps, episodes_through or 0)
        self.low = max(0, self.high - MAX_MONITOR_STEPS + 1)
        logged = series.keys_of(run.pk)
        wanted = [key for key in logged if key in ("reward", "kl", "entropy", "response_length", *CLIP_FRACTION_KEYS)
                  or key.startswith(COMPONENT_PREFIX) or (key.startswith("val/") and key.endswith("/reward"))]
        arrays = series.arrays_after(run.pk, self.low - 1, self.high, wanted) if wanted else {}
        self.metrics: dict[str, Series] = {
            key: [(int(s), float(v)) for s, v in zip(steps, values) if math.isfinite(v)] for key, (steps, values) in arrays.items()}
        self._steps: list[dict[str, Any]] | None = None

    def metric(self, key: str) -> Series:
        return self.metrics.get(key, [])

    def ledger_steps(self) -> list[dict[str, Any]]:
        if self._steps is None:
            self._steps = ledger.step_rows(self.run, self.low, self.high)
        return self._steps

    def response_lengths(self) -> tuple[Series, str]:
        if self.metric("response_length"):
            return self.metric("response_length"), "metric response_length"
        rows = (StoredEpisode.objects.filter(run=self.run, split=StoredEpisode.Split.TRAIN, step__range=(self.low, self.high))
                .values("step").annotate(mean=Avg("response_length")).order_by("step"))
        return [(row["step"], float(row["mean"])) for row in rows if row["mean"] is not None], "stored episodes"


def compute(data: RunData, monitor: str, window: int) -> tuple[Series, str]:
    """``monitor``'s value per step over ``window`` steps, and where it was read from ('' and no
    points: the run has nothing it could be read from)."""
    if monitor == Monitor.RESPONSE_LENGTH_DRIFT:
        points, source = data.response_lengths()
        return _against_start(points, window, lambda now, then: abs(now / then - 1)), source if points else ""
    if monitor == Monitor.ALL_EQUAL_GROUPS:
        shares = [(row["step"], row["all_equal_share"]) for row in data.ledger_steps() if row["all_equal_share"] is not None]
        return _trailing(shares, window), "stored episodes" if shares else ""
    if monitor == Monitor.ENTROPY_COLLAPSE:
        points = data.metric("entropy")
        return _against_start(points, window, lambda now, then: 1 - now / then), "metric entropy" if points else ""
    if monitor == Monitor.KL_SPIKE:
        points = data.metric("kl")
        return _spikes(points, window), "metric kl" if points else ""
    if monitor == Monitor.CLIP_FRACTION_SPIKE:
        key = next((k for k in CLIP_FRACTION_KEYS if data.metric(k)), "")
        return (_spikes(data.metric(key), window), f"metric {key}") if key else ([], "")
    if monitor == Monitor.COMPONENT_DOMINANCE:
        return _dominance(data, window)
    if monitor == Monitor.VALIDATION_DIVERGENCE:
        return _divergence(data, window)
    raise ValueError(f"unknown monitor {monitor!r}")


def _dominance(data: RunData, window: int) -> tuple[Series, str]:
    keys = [key for key in data.metrics if key.startswith(COMPONENT_PREFIX)]
    per_step: dict[int, list[float]] = {}
    for key in keys:
        for step, value in data.metric(key):
            per_step.setdefault(step, []).append(abs(value))
    shares = [(step, max(values) / sum(values)) for step, values in sorted(per_step.items())
              if len(values) > 1 and sum(values) > 0]
    return _trailing(shares, window), f"metrics {COMPONENT_PREFIX}*" if shares else ""


def _divergence(data: RunData, window: int) -> tuple[Series, str]:
    per_step: dict[int, list[float]] = {}
    for key in data.metrics:
        if key.startswith("val/"):
            for step, value in data.metric(key):
                per_step.setdefault(step, []).append(value)
    train = data.metric("reward")
    if not per_step or not train:
        return [], ""
    found = []
    for step, values in sorted(per_step.items()):
        recent = [v for s, v in train if s <= step][-window:]
        if recent:
            found.append((step, _mean(recent) - _mean(values)))
    return found, "metrics reward and val/*/reward"


def _stretches(points: Series, threshold: float, began_before: bool = False) -> Series:
    """The first point of each stretch of points above ``threshold`` (``began_before``: one already
    above at the first point began before the points, and is left out)."""
    found, above = [], began_before and bool(points) and points[0][1] > threshold
    for step, value in points:
        if value > threshold and not above:
            found.append((step, value))
        above = value > threshold
    return found[:MAX_ALERTS_PER_RULE]


def crossings(data: RunData, rule: MonitorRule) -> tuple[Series, str]:
    """The (step, value) where ``rule``'s monitor went above its threshold (the first step of each
    stretch), and where the monitor was read from. Where the run has more steps than are read
    (``MAX_MONITOR_STEPS``), a stretch already above at the first point read began earlier: not one."""
    points, source = compute(data, rule.monitor, rule.window)
    return _stretches(points, rule.threshold, began_before=data.low > 1), source


def report(run: Run) -> dict[str, Any]:
    """Every monitor of ``run`` (its values per step over the default window, or why it has none)
    and the alerts of its project's enabled rules, each naming the step whose evidence to open."""
    data = RunData(run)
    monitors = []
    for monitor in Monitor:
        points, source = compute(data, monitor, DEFAULT_WINDOW)
        monitors.append({
            "monitor": monitor.value, "label": monitor.label, "what": ABOUT[monitor][0], "source": source or None,
            "default_threshold": ABOUT[monitor][1], "window": DEFAULT_WINDOW,
            "steps": [s for s, _ in points], "values": [v for _, v in points],
            "latest": points[-1][1] if points else None,
        })
    rules = list(MonitorRule.objects.filter(project_id=run.project_id, enabled=True)) if run.project_id else []
    alerts = []
    for rule in rules:
        crossed, source = crossings(data, rule)
        for step, value in crossed:
            alerts.append({"rule": rule.pk, "monitor": rule.monitor, "label": rule.get_monitor_display(), "step": step,
                           "value": value, "threshold": rule.threshold, "window": rule.window, "source": source})
    alerts.sort(key=lambda alert: (alert["step"], alert["monitor"]))
    return {"run": run.pk, "step_min": data.low, "step_max": data.high, "monitors": monitors, "alerts": alerts,
            "rules": [rule_body(rule) for rule in rules]}


def rule_body(rule: MonitorRule) -> dict[str, Any]:
    return {"id": rule.pk, "project": rule.project_id, "monitor": rule.monitor, "label": rule.get_monitor_display(),
            "threshold": rule.threshold, "window": rule.window, "enabled": rule.enabled,
            "delivered": rule.alert_id is not None}


def _prompt_of(row: StoredEpisode) -> tuple:
    """What makes two episodes the same prompt: its dataset row where the run says it, else the
    conversation's first characters (which hold the prompt)."""
    return ("row", row.data_source, row.row_index) if row.row_index is not None else ("text", row.text)


def evidence(run: Run, step: int, window: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """The training episodes of ``step`` beside the same prompts' episodes some steps earlier: for
    each prompt, the latest earlier step at least ``window`` steps back that trained it (else the
    latest earlier step at all). At most ``MAX_EVIDENCE_EPISODES`` episodes of each side."""
    fields = ("pk", "run_id", "split", "step", "position", "group", "group_position", "data_source", "row_index", "reward",
              "advantage", "is_correct", "termination_reason", "num_turns", "prompt_length", "response_length", "error", "text")
    train = StoredEpisode.objects.filter(run=run, split=StoredEpisode.Split.TRAIN).only(*fields)
    now = list(train.filter(step=step).order_by("position")[:MAX_EVIDENCE_EPISODES])
    prompts: dict[tuple, dict[str, Any]] = {}
    for row in now:
        prompts.setdefault(_prompt_of(row), {"now": [], "earlier": [], "earlier_step": None})["now"].append(row)
    rows = [key[2] for key in prompts if key[0] == "row"]
    texts = [key[1] for key in prompts if key[0] == "text"]
    earlier = train.filter(step__lt=step, step__gte=step - MAX_MONITOR_STEPS)
    candidates = earlier.filter(Q(row_index__in=rows) | Q(row_index__isnull=True, text__in=texts))
    taken = 0
    # Newest first: a prompt's first step met at least ``window`` back is its comparison; until one
    # is met, the newest earlier step holds it.
    for row in candidates.order_by("-step", "position")[:MAX_EVIDENCE_EPISODES * 10]:
        entry = prompts.get(_prompt_of(row))
        if entry is None or taken >= MAX_EVIDENCE_EPISODES:
            continue
        far_enough = row.step <= step - window
        if entry["earlier_step"] is None or (far_enough and entry["earlier_step"] > step - window):
            taken -= len(entry["earlier"])
            entry.update(earlier=[], earlier_step=row.step)
        if row.step == entry["earlier_step"]:
            entry["earlier"].append(row)
            taken += 1
    return {
        "run": run.pk, "step": step, "window": window,
        "prompts": [{"prompt": _label(key), "step": step, "episodes": [_listed(r) for r in entry["now"]],
                     "earlier_step": entry["earlier_step"], "earlier": [_listed(r) for r in entry["earlier"]]}
                    for key, entry in prompts.items()],
    }


def _label(key: tuple) -> str:
    if key[0] == "row":
        return f"{key[1] or 'dataset'} row {key[2]}"
    return key[1][:80]


def _listed(row: StoredEpisode) -> dict[str, Any]:
    return episode_store.listed(row)
