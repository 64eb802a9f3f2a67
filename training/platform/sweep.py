"""Hyperparameter sweeps over config keys, with Optuna as the sampler and the pruner.

A search space maps dotted config keys to ranges::

    {"actor_rollout_ref.actor.optim.lr": "float 1e-4..1e-2 log",
     "data.train_batch_size": "choice 2, 4, 8",
     "actor_rollout_ref.rollout.n": "int 2..8"}

(or the same as dicts: ``{"type": "float", "low": 1e-4, "high": 1e-2, "log": true}``). Samplers:
``grid`` (every combination of choices), ``random``, ``tpe`` (Bayesian, Optuna's TPESampler).
Pruning: Optuna's ``MedianPruner`` on the objective as each step reports it: a trial whose
objective is below the median of completed trials at the same step stops early.

``sweep(...)`` runs trials one after another in this process (the library). The platform keeps
trials in its database and asks Optuna for the next one with ``ask_next`` / ``should_prune``,
rebuilding an in-memory study from what its trials recorded: the database stays the one truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.config import close_key, parse_overrides, valid_keys

from training.errors import ConfigError, Problems
from training.trainer import AgentTrainer

SAMPLERS = ("grid", "random", "tpe")
DIRECTIONS = ("maximize", "minimize")


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


# -- the search space ---------------------------------------------------------------------------

def parse_space(space: dict[str, Any] | str) -> dict[str, Any]:
    """Config keys to Optuna distributions. ``space`` is a dict, or text with one ``key: range`` a line.
    Raises ``ConfigError`` naming the key at fault (``Problems``, one per key, when several are)."""
    if isinstance(space, str):
        entries = {}
        for line in space.splitlines():
            if line.strip() and not line.strip().startswith("#"):
                key, sep, spec = line.partition(":")
                if not sep:
                    raise ConfigError("space", f"line {line.strip()!r}: expected 'key: choice a, b' or 'key: float low..high [log]'.")
                entries[key.strip()] = spec.strip()
        space = entries
    if not space:
        raise ConfigError("space", "name at least one config key to search over.")
    keys = valid_keys()
    distributions, problems = {}, []
    for key, spec in space.items():  # every key's problem, not only the first one's
        try:
            if key not in keys:
                close = close_key(key, keys)
                hint = f" Did you mean '{close}'?" if close else ""
                raise ConfigError(key, f"not a config key a sweep can set (dotted keys of training/config/schema.py).{hint}")
            distributions[key] = _distribution(key, _spec_dict(key, spec))
        except ConfigError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise Problems(problems)
    return distributions


def _distribution(key: str, spec: dict[str, Any]) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    kind = spec.get("type")
    try:
        if kind == "choice":
            values = list(spec["values"])
            if not values:
                raise ValueError("give at least one value")
            return CategoricalDistribution(values)
        if kind not in ("float", "int"):
            raise ValueError(f"unknown type {kind!r}; use choice, float or int")
        cast = float if kind == "float" else int
        low, high = cast(spec["low"]), cast(spec["high"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(key, f"bad range {spec}: {exc}.") from None
    if low > high:
        raise ConfigError(key, f"the range {kind} {spec['low']}..{spec['high']} is reversed (low above high); "
                               f"write {kind} {spec['high']}..{spec['low']}.")
    return (FloatDistribution if kind == "float" else IntDistribution)(low, high, log=bool(spec.get("log", False)))


def _spec_dict(key: str, spec: Any) -> dict[str, Any]:
    if isinstance(spec, dict):
        return spec
    if isinstance(spec, list):
        return {"type": "choice", "values": spec}
    import yaml

    text = str(spec).strip()
    kind, _, rest = text.partition(" ")
    if kind == "choice":
        return {"type": "choice", "values": [yaml.safe_load(v.strip()) for v in rest.split(",") if v.strip()]}
    if kind in ("float", "int"):
        words = rest.split()
        low, sep, high = (words[0] if words else "").partition("..")
        if not sep:
            raise ConfigError(key, f"{text!r}: expected '{kind} low..high' (add 'log' for a log scale).")
        return {"type": kind, "low": yaml.safe_load(low), "high": yaml.safe_load(high), "log": "log" in words[1:]}
    raise ConfigError(key, f"{text!r}: expected 'choice a, b, c', 'float low..high [log]' or 'int low..high'.")


def grid_size(space: dict[str, Any]) -> int | None:
    """Combinations of a grid (None when a key is a continuous range, which a grid cannot take)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    size = 1
    for distribution in space.values():
        if isinstance(distribution, CategoricalDistribution):
            size *= len(distribution.choices)
        elif isinstance(distribution, IntDistribution) and not distribution.log:
            size *= distribution.high - distribution.low + 1
        else:
            return None
    return size


def make_sampler(name: str, space: dict[str, Any], seed: int = 0):
    optuna = _optuna()
    if name == "grid":
        if grid_size(space) is None:
            raise ConfigError("sampler", "a grid needs 'choice' or 'int' ranges; use random or tpe for float ranges.")
        grid = {key: list(d.choices) if hasattr(d, "choices") else list(range(d.low, d.high + 1)) for key, d in space.items()}
        return optuna.samplers.GridSampler(grid, seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    raise ConfigError("sampler", f"{name!r}: choose {', '.join(SAMPLERS)}.")


def make_pruner():
    """Optuna's median rule: stop a trial whose objective is below the median of completed trials
    at the same step, once two trials have completed and after its first step."""
    return _optuna().pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2)


# -- the platform's side: trials recorded elsewhere -------------------------------------------

@dataclass
class TrialRecord:
    """What the platform stores of one trial. ``state``: running, complete, pruned or failed."""

    params: dict[str, Any]
    state: str = "running"
    value: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)


def _study(space: dict[str, Any], direction: str, trials: list[TrialRecord], sampler=None):
    optuna = _optuna()
    from optuna.trial import TrialState, create_trial

    states = {"running": TrialState.RUNNING, "complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
    study = optuna.create_study(direction=direction, sampler=sampler or optuna.samplers.RandomSampler())
    for record in trials:
        state = states[record.state]
        if state == TrialState.COMPLETE and (record.value is None or not math.isfinite(record.value)):
            state = TrialState.FAIL  # a run that ended without the objective teaches the sampler nothing
        study.add_trial(create_trial(
            state=state, params={k: v for k, v in record.params.items() if k in space},
            distributions={k: space[k] for k in record.params if k in space},
            value=record.value if state == TrialState.COMPLETE else None,
            intermediate_values={int(k): v for k, v in record.intermediate.items() if math.isfinite(v)},
            system_attrs=record.system_attrs,
        ))
    return study


def ask_next(space: dict[str, Any], sampler: str, seed: int, direction: str, trials: list[TrialRecord]) -> TrialRecord:
    """The next trial's parameters, given every trial so far (running ones included, so a grid
    never hands out one point twice)."""
    # A grid keeps one seed (its shuffled order must not change between asks); random and TPE
    # samplers are rebuilt each time, so each ask gets its own seed or every trial would be the same.
    study = _study(space, direction, trials, make_sampler(sampler, space, seed if sampler == "grid" else seed + len(trials)))
    trial = study.ask(fixed_distributions=space)
    attrs = study._storage.get_trial(trial._trial_id).system_attrs  # the grid's point id and space
    return TrialRecord(params=dict(trial.params), system_attrs=dict(attrs))


def should_prune(space: dict[str, Any], direction: str, finished: list[TrialRecord], current: TrialRecord) -> bool:
    """Whether Optuna's pruner stops ``current`` given its objective so far and the finished trials'."""
    from optuna.trial import TrialState, create_trial

    if not current.intermediate:
        return False
    study = _study(space, direction, [t for t in finished if t.state != "running"])
    frozen = create_trial(state=TrialState.RUNNING, params={k: v for k, v in current.params.items() if k in space},
                          distributions={k: space[k] for k in current.params if k in space},
                          intermediate_values={int(k): v for k, v in current.intermediate.items() if math.isfinite(v)})
    return bool(make_pruner().prune(study, frozen))


# -- the library's side: trials in this process ------------------------------------------------

class _PruningSink:
    """Reports the objective to the Optuna trial each step; asks the trainer to stop when pruned."""

    def __init__(self, trial, objective: str) -> None:
        self.trial, self.objective = trial, objective
        self.last: float | None = None
        self.pruned = False

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if self.objective in metrics and math.isfinite(metrics[self.objective]):
            self.last = metrics[self.objective]
            self.trial.report(self.last, step)
            self.pruned = self.pruned or self.trial.should_prune()

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


def _suggest(trial, key: str, distribution) -> Any:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(key, distribution.choices)
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(key, distribution.low, distribution.high, log=distribution.log)
    return trial.suggest_float(key, distribution.low, distribution.high, log=distribution.log)


def sweep(
    trainer_kwargs: dict[str, Any],
    space: dict[str, Any] | str,
    n_trials: int,
    objective: str = "reward",
    direction: str = "maximize",
    sampler: str = "tpe",
    prune: bool = True,
    seed: int = 0,
):
    """Train ``n_trials`` runs of ``AgentTrainer(**trainer_kwargs)``, each with the base config plus
    one point of ``space``, in ``<run_path>/trial-N``; returns the Optuna study (``best_params``,
    ``trials_dataframe()``). The objective is the last logged value of ``objective``."""
    optuna = _optuna()

    if direction not in DIRECTIONS:
        raise ConfigError("direction", f"{direction!r}: choose maximize or minimize.")
    distributions = parse_space(space)
    base_path = Path(trainer_kwargs.get("run_path", "runs/sweep"))
    study = optuna.create_study(direction=direction, sampler=make_sampler(sampler, distributions, seed),
                                pruner=make_pruner() if prune else optuna.pruners.NopPruner())

    def run_trial(trial) -> float:
        params = {key: _suggest(trial, key, distribution) for key, distribution in distributions.items()}
        sink = _PruningSink(trial, objective)
        base = trainer_kwargs.get("config") or {}

        kwargs = {**trainer_kwargs, "config": {**parse_overrides(base), **params},
                  "run_path": str(base_path / f"trial-{trial.number}"),
                  "sinks": [*(trainer_kwargs.get("sinks") or []), sink], "should_stop": lambda: sink.pruned}
        AgentTrainer(**kwargs).train()
        if sink.pruned:
            raise optuna.TrialPruned()
        if sink.last is None:
            raise ValueError(f"trial {trial.number} never logged {objective!r}; name a metric the run reports.")
        return sink.last

    limit = grid_size(distributions) if sampler == "grid" else None
    study.optimize(run_trial, n_trials=min(n_trials, limit) if limit else n_trials, catch=(Exception,))
    return study
