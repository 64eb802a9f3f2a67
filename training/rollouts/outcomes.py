"""Whether a run did what it claims: the checks every backend applies, the same way.

A run is not a success when too many of one step's episodes ended with an error, when it trained
no step, or when none of its episodes was ever scored; a reward function that raises during
training stops the run. Each of these is a ``TrainingFailed`` whose message names the cause (the
count, the reward, the row, the step) and carries the traceback of the user's code, so the
library, the command line, the run page and the API all say the same thing.

A backend keeps one ``OutcomeMonitor`` per run::

    monitor = OutcomeMonitor(config.trainer.max_episode_error_rate, tasks)
    reward_fn = monitor.watch_reward(reward_fn, required=...)  # give this to the rollouts instead
    monitor.step = step                           # the step whose episodes are being made
    monitor.check_episodes(episodes)              # after each step's rollouts
    monitor.check_finished(steps, stopped)        # after training

Episodes may be ``training.types.Episode`` objects or their ``to_dict()`` form.

A run that trained but had nothing to learn from is not a failure: it ends with warnings. Every
processor keeps a ``RewardTrace`` among its sinks, so it sees the per-step reward metrics any
backend logs; ``learning_warnings`` reads it at the end and names the likely cause (a column the
reward looked for and the rows lack: ``ColumnReads``, filled by the reward's probe before training).
"""

from __future__ import annotations

import inspect
import math
import traceback as traceback_module
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Sequence

from training.log import logger
from training.types import RewardOutput, TerminationReason
from training.errors import TooManyEpisodeErrors, TrainingFailed

# Ends after which the episode's reward was computed (by the env, the workflow or the reward
# function). error, timeout and max_prompt_length episodes get reward 0 without being scored.
_UNSCORED = {TerminationReason.ERROR.value, TerminationReason.TIMEOUT.value, TerminationReason.MAX_PROMPT_LENGTH.value}


class RewardFailed(TrainingFailed):
    """The reward function raised (or returned something unusable) during training."""


class NoStepsTrained(TrainingFailed):
    """Training ended without a single optimizer step."""


class RewardNeverRan(TrainingFailed):
    """Steps were trained, but no episode of the run was ever scored."""


class OutcomeMonitor:
    """Per-run bookkeeping that decides whether the run may end as a success.

    ``tasks`` (the training rows in dataset order, or a mapping of row index to row) lets a
    failing reward name the row's index; rows are recognised by identity, so hand the rollouts
    these same dicts.
    """

    def __init__(self, max_episode_error_rate: float, tasks: Iterable[dict] | Mapping[int, dict] = ()) -> None:
        self.max_episode_error_rate = max_episode_error_rate
        self.step: int | None = None
        self.terminations: Counter[str] = Counter()
        self.scored = 0
        self.reward: WatchedReward | None = None
        self._reward_required = False
        indexed = tasks.items() if isinstance(tasks, Mapping) else enumerate(tasks)
        self._row_of = {id(task): index for index, task in indexed}

    # -- during training ---------------------------------------------------------------------
    def watch_reward(self, reward_fn: Callable[..., RewardOutput] | None, required: bool = True) -> "WatchedReward | None":
        """``reward_fn`` counted, and stopping the run with ``RewardFailed`` when it raises.

        ``required``: the run's only reward (single-turn tasks), so a run that never called it
        fails; otherwise (a fallback for workflows that score themselves) never calling it is
        only logged.
        """
        if reward_fn is None:
            return None
        self.reward, self._reward_required = WatchedReward(reward_fn, self), required
        return self.reward

    def row_index(self, task: Any) -> int | None:
        return self._row_of.get(id(task))

    def check_episodes(self, episodes: list[Any], step: int | None = None) -> None:
        """Record one step's episodes; raise ``TooManyEpisodeErrors`` past the allowed error rate."""
        step = self.step if step is None else step
        ends = [termination_of(episode) for episode in episodes]
        self.terminations.update(end or "unknown" for end in ends)
        self.scored += sum(end not in _UNSCORED for end in ends)
        failed = [episode for episode, end in zip(episodes, ends) if end == TerminationReason.ERROR.value]
        if failed and len(failed) > self.max_episode_error_rate * len(episodes):
            first = failed[0]
            raise TooManyEpisodeErrors(
                f"{len(failed)} of {len(episodes)} episodes{_in_step(step)} ended with an error (more than "
                f"trainer.max_episode_error_rate={self.max_episode_error_rate:g} of them). "
                f"The first failed episode raised {_field(first, 'error') or 'an exception'}.",
                _info(first).get("traceback", ""),
            )

    # -- at the end ----------------------------------------------------------------------------
    def check_finished(self, steps: int, stopped: bool = False, hint: str = "") -> None:
        """Raise unless the run trained at least one step and scored at least one episode.

        A run stopped on request is not judged here: it ends as cancelled, not as a success.
        ``hint`` is added to the zero-steps message (e.g. how many batches the dataset holds).
        """
        if stopped:
            return
        if steps <= 0:
            raise NoStepsTrained(
                "training ended after 0 steps, so nothing was learned and the run is not a success."
                + (f" {hint}" if hint else "")
            )
        if self.terminations and self.scored == 0:
            ends = ", ".join(f"{end} {count}" for end, count in self.terminations.most_common())
            raise RewardNeverRan(
                f"the reward never ran: none of the episodes of {steps} step(s) was scored (their ends: {ends}), "
                f"so every reward was 0 and nothing was learned. Check data.max_prompt_length, "
                f"rllm.agent.trajectory_timeout and the episodes' errors."
            )
        if self.reward is not None and self.reward.calls == 0:
            message = f"reward function {self.reward.name} was never called in {steps} step(s)"
            if self._reward_required:
                raise RewardNeverRan(f"{message}, so the run learned from no reward at all.")
            logger.warning("%s: every episode brought its own reward.", message)


class WatchedReward:
    """A reward function behind the monitor: counts calls that scored, and turns a raise into
    ``RewardFailed`` naming the reward, the row and the step. Other attributes pass through."""

    def __init__(self, reward_fn: Callable[..., RewardOutput], monitor: OutcomeMonitor) -> None:
        self.inner = reward_fn
        self.monitor = monitor
        self.name = getattr(reward_fn, "name", None) or getattr(reward_fn, "__name__", type(reward_fn).__name__)
        self.calls = 0

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)

    def __call__(self, task: dict, response: str, row: int | None = None) -> RewardOutput:
        try:
            output = self.inner(task, response)
        except Exception as exc:  # user code can raise anything; stop the run naming where
            row = self.monitor.row_index(task) if row is None else row
            where = f"row {row} of train_dataset" if row is not None else "the row"
            raise self._failed(exc, f"{where} {_short(task)}", f"the response {_short(response)}") from exc
        self.calls += 1
        self.monitor.scored += 1
        return output

    def score_batch(self, tasks: list[dict], responses: list[str], rows: list[int | None] | None = None) -> list[RewardOutput]:
        """Score a batch: one call of a batch-form reward (TRL's ``fn(completions, prompts, **kwargs)``),
        watched as one; any other reward row by row, each watched as ``__call__`` is."""
        rows = rows or [None] * len(tasks)
        if getattr(self.inner, "style", None) != "trl":
            return [self(task, response, row) for task, response, row in zip(tasks, responses, rows)]
        try:
            outputs = self.inner.score_batch(tasks, responses)
        except Exception as exc:  # user code can raise anything; stop the run naming the batch
            indices = [self.monitor.row_index(task) if row is None else row for task, row in zip(tasks, rows)]
            where = f"the batch of rows {sorted({i for i in indices if i is not None})} of train_dataset"
            raise self._failed(exc, where, f"{len(responses)} responses") from exc
        self.calls += 1
        self.monitor.scored += len(outputs)
        return outputs

    def _failed(self, exc: Exception, where: str, scoring: str) -> RewardFailed:
        return RewardFailed(
            f"reward function {self.name} raised {_one_line(exc)} on {where}{_in_step(self.monitor.step)}, "
            f"scoring {scoring}. Fix the function so that it handles every row and any response (an untrained "
            f"model writes anything).",
            "".join(traceback_module.format_exception(exc)),
        )


def termination_of(episode: Any) -> str | None:
    """An episode's termination reason as its string value (None when it has none)."""
    reason = _field(episode, "termination_reason")
    return reason.value if isinstance(reason, TerminationReason) else reason


def _field(episode: Any, name: str) -> Any:
    return episode.get(name) if isinstance(episode, dict) else getattr(episode, name, None)


def _info(episode: Any) -> dict:
    return _field(episode, "info") or {}


def _in_step(step: int | None) -> str:
    return f" in step {step}" if step is not None else ""


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:500]


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- runs that trained but learnt nothing ------------------------------------------------------------

# Two rewards closer than this are the same reward (means of equal floats may differ in the last bits).
_SAME = 1e-6
# Step metrics that, at (nearly) 1 on every step, explain a reward that never moved.
_ALWAYS_CAUSES = {
    "clipped_ratio": "every response was cut at data.max_response_length before it ended",
    "termination/max_response_length": "every episode was cut at data.max_response_length",
    "termination/max_turns": "every episode ran out of turns (rllm.agent.max_steps)",
    "termination/timeout": "every episode timed out (rllm.agent.trajectory_timeout)",
}
# What TRL passes a batch reward beside the dataset's columns.
_TRL_ARGUMENTS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}


class RewardTrace:
    """A ``MetricSink`` that keeps each training step's reward: its mean (``reward``), its spread
    between episodes (``reward_std``, or verl's ``critic/score/max`` - ``critic/score/min``; None
    when the backend logged neither) and the rates in ``_ALWAYS_CAUSES``. Steps without ``reward``
    (validation scores alone) are not training steps and are left out."""

    def __init__(self) -> None:
        self.steps: dict[int, tuple[float, float | None]] = {}
        self.always: dict[str, bool] = {}

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if "reward" not in metrics:
            return
        spread = metrics.get("reward_std")
        if spread is None and "critic/score/max" in metrics and "critic/score/min" in metrics:
            spread = metrics["critic/score/max"] - metrics["critic/score/min"]
        self.steps[step] = (float(metrics["reward"]), None if spread is None else float(spread))
        for key in _ALWAYS_CAUSES:
            if key in metrics:
                self.always[key] = self.always.get(key, True) and metrics[key] >= 1 - _SAME

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass

    def constant_reward(self) -> float | None:
        """The reward every episode of every logged step got, when they all got the same one; None
        when the reward moved (or no step was logged). A step whose spread was not logged is judged
        by its mean alone."""
        if not self.steps:
            return None
        means = [mean for mean, _ in self.steps.values()]
        if max(means) - min(means) > _SAME or any(spread is not None and spread > _SAME for _, spread in self.steps.values()):
            return None
        return means[0]


class ColumnReads(dict):
    """A dataset row that notes the keys asked of it that it lacks (by ``[]``, ``get`` or ``in``):
    handed to a reward function's probe, it shows which columns the function looked for."""

    def __init__(self, row: dict) -> None:
        super().__init__(row)
        self.missing: list[str] = []

    def _note(self, key: Any) -> None:
        if not dict.__contains__(self, key) and isinstance(key, str) and key not in self.missing:
            self.missing.append(key)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self._note(key)
        return super().__contains__(key)


def columns_the_reward_lacks(reward_fn: Any, reads: ColumnReads) -> list[str]:
    """The columns ``reward_fn`` (a ``training.rewards.RewardFunction``) looked for in a row and did
    not find, once its probe has run on ``reads``. Only the forms that read the row themselves are
    told: rLLM's ``fn(task, response)`` by its lookups, TRL's batch form by the keyword parameters
    it names (given a default, a missing one would pass silently). verl's form is handed the
    ground truth (``data.answer_key``, checked before training) and the data source itself."""
    style = getattr(reward_fn, "style", None)
    if style == "rllm":
        return list(reads.missing)
    if style == "trl":
        parameters = inspect.signature(reward_fn.fn).parameters.values()
        named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return [name for name in named if name not in _TRL_ARGUMENTS and not dict.__contains__(reads, name)]
    return []


def learning_warnings(
    trace: RewardTrace, reward_name: str | None = None, missing_columns: Sequence[str] = (), columns: Sequence[str] = (),
    answer_key: str = "ground_truth",
) -> list[str]:
    """What ``trace`` says about a run that trained: one warning, naming the likely cause, when the
    reward was the same (0, or any one value) for every episode at every step, so the run had no
    learning signal; none otherwise. ``reward_name``, ``missing_columns`` (``columns_the_reward_lacks``),
    ``columns`` (the training rows' columns) and ``answer_key`` (``data.answer_key``) name the cause."""
    value = trace.constant_reward()
    if value is None:
        return []
    steps = sorted(trace.steps)
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} to {steps[-1]}"
    if abs(value) <= _SAME:
        headline = (f"reward was 0 at every step ({span}): no episode earned any reward, so the run had no learning "
                    "signal and learnt nothing from its reward.")
    else:
        headline = (f"reward was {value:.4g} at every step ({span}), the same for every episode: with no difference "
                    "between episodes the run had no learning signal and learnt nothing from its reward.")
    reward = f"reward function {reward_name}" if reward_name else "the reward"
    if missing_columns:
        looked = ", ".join(repr(c) for c in missing_columns)
        shown = ", ".join(map(str, columns[:20])) + (f" and {len(columns) - 20} more" if len(columns) > 20 else "")
        cause = (f"Likely cause: {reward} looked for column(s) {looked}, which train_dataset does not have "
                 f"(its columns: {shown or 'none'}).")
        if answer_key in columns:  # the dataset names its ground truth: say where that goes, and where not
            cause += (f" A reward that reads the row itself (fn(task, response), or TRL's fn(completions, **columns)) "
                      f"gets each row under the dataset's own column names: "
                      f"data.answer_key={answer_key} (the dataset's ground truth column) is handed as ground_truth only "
                      f"to the form fn(data_source, solution_str, ground_truth, extra_info). Have the reward read "
                      f"task[{answer_key!r}], or rename the column {answer_key!r} to {missing_columns[0]!r}.")
        else:
            cause += " Add the column to the dataset, or have the reward read a column it has."
    else:
        causes = [text for key, text in _ALWAYS_CAUSES.items() if trace.always.get(key)]
        if abs(value) <= _SAME:
            causes.append(f"{reward} gave 0 to every response (does it read the answer the way the model writes it? "
                          "can the model solve any of the tasks?)")
        else:
            causes.append(f"{reward} gives every response the same score (does it read the response at all?)")
        cause = "Possible causes: " + "; ".join(causes) + "."
    return [f"{headline} {cause}"]


def reward_component_means(components: list[Any]) -> dict[str, float]:
    """``reward_components/<name>``: the mean of each numeric reward component over the episodes
    that have it (what a reward returned beside its total, ``RewardOutput.metadata``). The
    platform's reward-health monitor reads them to tell one component dominating the total."""
    sums: dict[str, list[float]] = {}
    for found in components:
        if not isinstance(found, dict):
            continue
        for name, value in found.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                sums.setdefault(str(name), []).append(float(value))
    return {f"reward_components/{name}": sum(values) / len(values) for name, values in sorted(sums.items())}
