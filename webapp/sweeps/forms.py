"""Turning a sweep request (form or API) into a validated ``Sweep``: the space parses and is small,
every key may be set by a run's owner (the same rule as the run form's, ``refused_overrides``, on
the base run's overrides too), and each value of each key passes the config's own checks on top of
the base run's overrides, before any trial is queued. Each trial is then checked again as a run
(``engine.submit_trial``)."""

from __future__ import annotations

import difflib
from typing import Any

from django import forms

from training.config import Config

from training.errors import ConfigError
from training.platform.sweep import SAMPLERS, grid_size, parse_space
from webapp.policy import limits
from webapp.policy.keys import refused_overrides
from webapp.sweeps import engine
from webapp.sweeps.engine import MAX_PARALLEL, MAX_TRIALS
from webapp.sweeps.models import MAX_OBJECTIVE_STEPS, Sweep

# Each value of a space is checked by building a config (a few milliseconds): a space of 1,500
# choices held the web process for seconds. A hundred trials at most draw from it anyway.
MAX_SPACE_KEYS = 10
MAX_SPACE_VALUES = 100


def check_space(space: Any, sampler: str, base_overrides: dict[str, Any], backend=None) -> dict[str, Any]:
    """The space as stored (key -> spec). Raises ``forms.ValidationError`` with every problem at
    once, each with its line (a space given as text) or its key (a mapping)."""
    entries, lines, problems = space, {}, []
    if isinstance(space, str):
        entries = {}
        for number, line in enumerate(space.splitlines(), 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            key, sep, spec = text.partition(":")
            if not sep:
                problems.append(f"line {number}: {text!r}: expected 'key: choice a, b', 'key: float low..high [log]' or 'key: int low..high'.")
                continue
            entries[key.strip()], lines[key.strip()] = spec.strip(), number
    _check_size(entries)
    refused = refused_overrides(base_overrides)
    if refused:
        raise forms.ValidationError(["The base run's overrides cannot be run again: " + message for message in refused.values()])
    if not entries and not problems:
        raise forms.ValidationError("Name at least one config key to search over, one a line: 'key: choice a, b'.")
    distributions = {}
    for key, spec in entries.items():
        where = f"line {lines[key]}: " if key in lines else ""
        try:
            distributions[key] = parse_space({key: spec})[key]
        except ConfigError as exc:
            problems.append(where + str(exc))
            continue
        problems += [where + problem for problem in _value_problems(key, distributions[key], base_overrides, backend)]
    if not problems and sampler == "grid" and grid_size(distributions) is None:
        problems.append("A grid needs 'choice' or 'int' ranges; use random or Bayesian for float ranges.")
    if problems:
        raise forms.ValidationError(problems)
    return dict(entries)


def _value_problems(key: str, distribution: Any, base_overrides: dict[str, Any], backend) -> list[str]:
    """Why a trial drawing a value of ``key`` would be refused, one message per such value (a range: its two ends)."""
    values = list(distribution.choices) if hasattr(distribution, "choices") else [distribution.low, distribution.high]
    refused = refused_overrides({key: values[0]})
    if refused:
        return list(refused.values())
    problems = []
    for value in values:
        try:
            limits.check_config_bounds({**base_overrides, key: value}, backend)
            Config.build({**base_overrides, key: value})
        except (ConfigError, forms.ValidationError) as exc:
            message = exc.messages[0] if isinstance(exc, forms.ValidationError) else str(exc)
            problems.append(f"{key}={value!r} would fail every trial that draws it: {message}")
    return problems


def check_objective(objective: str, base_run) -> None:
    """Refuse an objective the ended base run never reported (a misspelling would score no trial),
    naming the nearest metric it did. A base run still going may not have reported every metric yet."""
    reported = sorted(base_run.latest_metrics()) if base_run.is_final else []
    if not reported or objective in reported:
        return
    close = difflib.get_close_matches(objective, reported, n=1, cutoff=0.6)
    hint = f"Did you mean '{close[0]}'? " if close else ""
    listed = ", ".join(reported[:15]) + (", …" if len(reported) > 15 else "")
    raise forms.ValidationError(
        f"'{objective}' is not a metric run #{base_run.pk} reported, so no trial could be scored on it. {hint}Its metrics: {listed}."
    )


def _check_size(space: Any) -> None:
    """Refuse a space with too many keys or values before anything in it is parsed."""
    if not isinstance(space, dict):
        return  # parse_space says what a space is
    if len(space) > MAX_SPACE_KEYS:
        raise forms.ValidationError(f"A sweep searches at most {MAX_SPACE_KEYS} config keys (got {len(space)}).")
    total = 0
    for spec in space.values():
        if isinstance(spec, list):
            total += len(spec)
        elif isinstance(spec, dict):
            values = spec.get("values")
            total += len(values) if isinstance(values, (list, tuple)) else 2
        else:
            text = str(spec).strip()
            total += text.count(",") + 1 if text.startswith("choice") else 2
    if total > MAX_SPACE_VALUES:
        raise forms.ValidationError(
            f"A sweep's space holds at most {MAX_SPACE_VALUES} values in all (each choice, and each range's two ends; "
            f"got {total}); a sweep runs at most {MAX_TRIALS} trials."
        )


class SweepForm(forms.Form):
    name = forms.CharField(max_length=200)
    space = forms.CharField(
        max_length=limits.MAX_OVERRIDES_CHARS, widget=forms.Textarea(attrs={"rows": 5, "placeholder": "actor_rollout_ref.actor.optim.lr: float 1e-4..1e-2 log\ndata.train_batch_size: choice 2, 4"}),
        help_text="One config key a line: 'choice a, b, c', 'float low..high [log]' or 'int low..high'.",
    )
    sampler = forms.ChoiceField(choices=Sweep.Sampler.choices, initial=Sweep.Sampler.TPE)
    objective = forms.CharField(max_length=200, initial="reward", help_text="The metric each trial is scored on.")
    # Left out of a post, these two take the model's defaults (the last value).
    objective_summary = forms.ChoiceField(label="Score", choices=Sweep.Summary.choices, initial=Sweep.Summary.LAST, required=False,
                                          help_text="Which of the metric's values is a trial's score.")
    objective_steps = forms.IntegerField(label="N", min_value=1, max_value=MAX_OBJECTIVE_STEPS, initial=10, required=False,
                                         help_text="For the mean of the last N steps.")
    direction = forms.ChoiceField(choices=Sweep.Direction.choices, initial=Sweep.Direction.MAXIMIZE)
    max_trials = forms.IntegerField(min_value=1, max_value=MAX_TRIALS, initial=8)
    parallel = forms.IntegerField(min_value=1, max_value=MAX_PARALLEL, initial=2, help_text="Trials running at once.")
    prune = forms.BooleanField(required=False, initial=True, help_text="Stop hopeless trials early (Optuna's median pruner).")
    seed = forms.IntegerField(initial=0, min_value=0, max_value=2**31 - 1, required=False)

    def __init__(self, *args, base_run=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.base_run = base_run

    def clean_objective(self) -> str:
        objective = self.cleaned_data["objective"].strip()
        check_objective(objective, self.base_run)
        return objective

    def clean(self) -> dict:
        data = super().clean()
        if "space" in data and data.get("sampler") in SAMPLERS:
            try:
                data["space"] = check_space(data["space"], data["sampler"], self.base_run.config_overrides, self.base_run.backend)
            except forms.ValidationError as exc:
                self.add_error("space", exc)
        return data

    def save(self, owner) -> Sweep:
        """The sweep with its first trials queued (``engine.create``): ``TrialRefused`` when they cannot start."""
        data = self.cleaned_data
        summary = {name: data[name] for name in ("objective_summary", "objective_steps") if data.get(name)}
        return engine.create(
            owner=owner, name=data["name"], base_run=self.base_run, space=data["space"], sampler=data["sampler"],
            objective=data["objective"], direction=data["direction"], max_trials=data["max_trials"],
            parallel=data["parallel"], prune=data["prune"], seed=data.get("seed") or 0, **summary,
        )
