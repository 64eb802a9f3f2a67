"""Episodes as the token sequences a trainer learns from ("rows"), with rLLM's rules.

An episode that is one conversation is one row: its first prompt, then every later token with
mask 1 where the model wrote it. An episode with several trajectories (rLLM's solver-judge: two
solvers and a judge), or with model calls that do not continue each other, is one row per
conversation ("segment"), each trained with its own trajectory's reward. With
``rllm.stepwise_advantage.enable`` every step is a row of its own, as rLLM does.

Advantages compare *units* within *groups*, as rLLM's trajectory and step ids do:

- one row per episode: the episodes of one task (TRL's contiguous groups of ``rollout.n``);
- one row per trajectory: unit = the trajectory, group = same task and trajectory name
  (the solvers of a task are compared with each other, the judges with each other);
- ``stepwise_advantage.mode=per_step``: unit = the step, group = same task, name and step index,
  reward = the step's reward;
- ``stepwise_advantage.mode=broadcast``: unit = the trajectory (its reward), every step's row gets
  the trajectory's advantage (divided by its number of steps with ``normalize_by_steps``).

Filters leave a row in the batch but mask all of its tokens (after advantages are computed, as
rLLM removes them after computing advantages): ``rllm.compact_filtering`` by termination reason,
``rllm.mask_truncated_samples`` / ``rllm.agent.overlong_filter`` for rows that reached
``data.max_response_length``, ``rllm.rejection_sample`` for tasks whose episodes were all correct
or all wrong.

``reward_model.overlong_buffer`` (DAPO's soft overlong punishment) is applied per row: each row's
penalty follows its own response length, and a unit with several rows (a trajectory of several
conversations, the steps of a broadcast trajectory) takes the penalty of its most punished row.

The trl backend lays out its multi-turn batches with ``episode_rows``; the tinker and fireworks
backends train every row as a ``Datum`` (``token_advantages``); the verl backend, whose agent loop
returns exactly one sample per episode, refuses an episode of several sequences by name
(``single_sequence``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from training.config import AlgorithmConfig, Config
from training.types import Episode, Step, TerminationReason
from training.errors import ConfigError, MultiSequenceEpisode
from training.algorithms.advantages import compute_advantages, equal_reward_groups as equal_groups
from training.algorithms.recipes import overlong_penalties

# rllm.compact_filtering.<flag> -> the termination reason it masks.
COMPACT_FILTERS = {
    "mask_max_prompt_length_exceeded": TerminationReason.MAX_PROMPT_LENGTH,
    "mask_max_response_length_exceeded": TerminationReason.MAX_RESPONSE_LENGTH,
    "mask_env_done": TerminationReason.ENV_DONE,
    "mask_max_turns_exceeded": TerminationReason.MAX_TURNS,
    "mask_timeout": TerminationReason.TIMEOUT,
    "mask_unknown": TerminationReason.UNKNOWN,
    "mask_error": TerminationReason.ERROR,
}


@dataclass
class Row:
    """One sequence to learn from. ``reward`` is None for padding rows (no episode behind them)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    reward: float | None
    unit: str
    group: str
    episode: int
    scale: float = 1.0
    trainable: bool = True
    penalty: float = 0.0  # reward_model.overlong_buffer's weighted penalty for this row's length (<= 0)

    @property
    def loss_mask(self) -> list[int]:
        return self.response_mask if self.trainable else [0] * len(self.response_mask)


@dataclass
class RowBatch:
    """The rows of one generation batch. ``expanded`` is False when there is exactly one row per
    episode, in the episodes' order (then the trainer's contiguous groups are the right ones)."""

    rows: list[Row]
    expanded: bool
    metrics: dict[str, float] = field(default_factory=dict)


def episode_rows(episodes: list[Episode], groups: list[str], config: Config) -> RowBatch:
    """Lay ``episodes`` out as rows; ``groups[i]`` names the task group of episode ``i``."""
    stepwise = config.rllm.stepwise_advantage
    limit = config.data.max_response_length
    segments = [_segments(episode, limit) for episode in episodes]
    expanded = stepwise.enable or any(len(found) > 1 for found in segments)
    rows: list[Row] = []
    for index, (episode, group, found) in enumerate(zip(episodes, groups, segments)):
        before = len(rows)
        if not expanded:
            rows.append(_episode_view_row(episode, index, unit=str(index), group=group, reward=episode.reward))
        elif stepwise.enable:
            rows.extend(_step_rows(episode, index, group, stepwise.mode, stepwise.normalize_by_steps))
        elif len(found) == 1 and episode.prompt_ids:
            owner, _ = found[0]
            trajectory = episode.trajectories[owner]
            rows.append(_episode_view_row(episode, index, f"{index}/{owner}", f"{group}/{trajectory.name}", trajectory.reward))
        else:
            for owner, (prompt, response, mask, logprobs) in found:
                trajectory = episode.trajectories[owner]
                rows.append(Row(prompt, response, mask, logprobs, trajectory.reward, f"{index}/{owner}", f"{group}/{trajectory.name}", index))
        if len(rows) == before:  # nothing to learn from: an empty, masked row
            rows.append(Row([], [], [], [], episode.reward, str(index), group, index, trainable=False))
    batch = RowBatch(rows, expanded=expanded)
    _apply_overlong_penalties(batch, config)
    batch.metrics = _apply_filters(batch, episodes, groups, config)
    if config.reward_model.overlong_buffer.enable:
        scored = [row.penalty for row in batch.rows if row.reward is not None]
        batch.metrics["overlong_penalty"] = sum(scored) / max(len(scored), 1)
    return batch


def pad_rows(batch: RowBatch, multiple: int) -> None:
    """Add masked padding rows until the row count is a multiple of ``multiple`` (the trainer
    splits batches into groups and optimizer steps of fixed size)."""
    missing = -len(batch.rows) % multiple
    for k in range(missing):
        batch.rows.append(Row([], [], [], [], None, f"pad{k}", f"pad{k}", -1, trainable=False))


def unit_rewards(batch: RowBatch) -> dict[str, tuple[str, float]]:
    """Each unit's (group, reward), the overlong penalty of its most punished row included.
    Padding rows (reward None) have no unit."""
    units: dict[str, tuple[str, float, float]] = {}
    for row in batch.rows:
        if row.reward is None:
            continue
        group, reward, penalty = units.get(row.unit, (row.group, row.reward, 0.0))
        units[row.unit] = (group, reward, min(penalty, row.penalty))
    return {unit: (group, reward + penalty) for unit, (group, reward, penalty) in units.items()}


def row_advantages(batch: RowBatch, algorithm: AlgorithmConfig) -> torch.Tensor:
    """One advantage per row: each unit's reward compared within its group by verl's estimator
    (``algorithm.adv_estimator``), then given to every row of the unit (times the row's ``scale``).
    Padding rows get 0."""
    units = unit_rewards(batch)
    advantage: dict[str, float] = {}
    if units:
        names = list(units)
        group_ids = {group: i for i, group in enumerate(dict.fromkeys(group for group, _ in units.values()))}
        rewards = torch.tensor([units[name][1] for name in names], dtype=torch.float32)
        index = np.array([group_ids[units[name][0]] for name in names])
        values = compute_advantages(rewards, torch.ones(len(names), 1), 1, algorithm, index=index)[:, 0]
        advantage = dict(zip(names, values.tolist()))
    return torch.tensor([advantage.get(row.unit, 0.0) * row.scale for row in batch.rows], dtype=torch.float32)


def equal_reward_groups(batch: RowBatch) -> set[str]:
    """The groups whose units all earned the same reward (they teach nothing; ``filter_groups``)."""
    rewards: dict[str, list[float]] = {}
    for group, reward in unit_rewards(batch).values():
        rewards.setdefault(group, []).append(reward)
    return {group for group, values in rewards.items() if max(values) - min(values) <= 1e-8}


def token_advantages(batch: RowBatch, algorithm: AlgorithmConfig, group_size: int) -> tuple[list[list[float]], float]:
    """Each row's advantage on each of its response tokens (0 on environment tokens and on rows
    that are not trained on), and the share of groups ``algorithm.filter_groups`` dropped.

    One row per episode (``expanded`` False): the episodes' rewards in groups of ``group_size``
    consecutive episodes, through verl's estimator on the token masks (as the trl backend's own
    batches). Otherwise each unit within its group (``row_advantages``) on every model token."""
    rows = batch.rows
    if not rows:
        return [], 0.0
    dropped = 0.0
    if batch.expanded:
        scalar = row_advantages(batch, algorithm).tolist()
        skipped: set[str] = set()
        if algorithm.filter_groups.enable:
            skipped = equal_reward_groups(batch)
            dropped = len(skipped) / max(len({row.group for row in rows if row.reward is not None}), 1)
        return [
            [0.0 if row.group in skipped else value * m for m in row.loss_mask] for row, value in zip(rows, scalar)
        ], dropped
    rewards = torch.tensor([(row.reward or 0.0) + row.penalty for row in rows], dtype=torch.float32)
    width = max([len(row.response_ids) for row in rows] + [1])
    model_tokens, sequence = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
    for index, row in enumerate(rows):
        sequence[index, : len(row.response_ids)] = 1.0
        model_tokens[index, : len(row.loss_mask)] = torch.tensor(row.loss_mask, dtype=torch.float32)
    advantages = compute_advantages(rewards, model_tokens, group_size, algorithm, sequence_mask=sequence)
    if algorithm.filter_groups.enable:
        equal = equal_groups(rewards, group_size)
        advantages = advantages * (~equal).repeat_interleave(group_size).float().unsqueeze(1)
        dropped = float(equal.float().mean())
    return [values[: len(row.response_ids)].tolist() for values, row in zip(advantages, rows)], dropped


def single_sequence(episode: Episode, config: Config, backend: str, source: str) -> None:
    """Refuse, naming ``backend`` and ``source`` (the workflow or function), an episode that lays
    out as more than one training sequence, for a backend that trains exactly one per episode."""
    found = _segments(episode, config.data.max_response_length)
    if len(found) <= 1:
        return
    names = ", ".join(episode.trajectories[owner].name or f"#{owner}" for owner, _ in found)
    raise MultiSequenceEpisode(
        f"backend {backend}: an episode of {source} has {len(found)} sequences to train (trajectories: {names}), "
        f"but the {backend} backend trains exactly one sequence per episode, so all but the first would be "
        f"silently dropped. Use backend=trl, tinker or fireworks, which train every trajectory, or make "
        f"{source} one conversation."
    )


# -- building rows ---------------------------------------------------------------------------------


Segment = tuple[list[int], list[int], list[int], list[float]]  # prompt, response, mask, logprobs


def _segments(episode: Episode, limit: int) -> list[tuple[int, Segment]]:
    """Each trajectory's steps chained into conversations: a step whose prompt continues the
    conversation so far extends it (the new prompt tokens with mask 0, the reply with mask 1);
    any other step starts a new one. Returned with the index of the trajectory they belong to."""
    found: list[tuple[int, Segment]] = []
    for owner, trajectory in enumerate(episode.trajectories):
        context: list[int] | None = None
        for step in trajectory.steps:
            if not step.response_ids:
                continue
            logprobs = _logprobs(step)
            if context is not None and step.prompt_ids[: len(context)] == context:
                _, response, mask, lps = found[-1][1]
                added = list(step.prompt_ids[len(context) :])
                response += added + list(step.response_ids)
                mask += [0] * len(added) + [1] * len(step.response_ids)
                lps += [0.0] * len(added) + logprobs
            else:
                found.append((owner, (list(step.prompt_ids), list(step.response_ids), [1] * len(step.response_ids), logprobs)))
            context = list(step.prompt_ids) + list(step.response_ids)
    for _, (_, response, mask, logprobs) in found:
        del response[limit:], mask[limit:], logprobs[limit:]
    return found


def _logprobs(step: Step) -> list[float]:
    return list(step.logprobs) if len(step.logprobs) == len(step.response_ids) else [0.0] * len(step.response_ids)


def _episode_view_row(episode: Episode, index: int, unit: str, group: str, reward: float) -> Row:
    return Row(
        list(episode.prompt_ids), list(episode.response_ids), list(episode.response_mask),
        list(episode.response_logprobs), reward, unit, group, index,
    )


def _step_rows(episode: Episode, index: int, group: str, mode: str, normalize_by_steps: bool) -> list[Row]:
    rows = []
    for owner, trajectory in enumerate(episode.trajectories):
        steps = [step for step in trajectory.steps if step.response_ids]
        for position, step in enumerate(steps):
            tokens = (list(step.prompt_ids), list(step.response_ids), [1] * len(step.response_ids), _logprobs(step))
            if mode == "per_step":
                unit, key, reward, scale = f"{index}/{owner}/{position}", f"{group}/{trajectory.name}/{position}", step.reward, 1.0
            else:  # broadcast: the trajectory's advantage on every step
                unit, key, reward = f"{index}/{owner}", f"{group}/{trajectory.name}", trajectory.reward
                scale = 1.0 / len(steps) if normalize_by_steps else 1.0
            rows.append(Row(*tokens, reward=reward, unit=unit, group=key, episode=index, scale=scale))
    return rows


def _apply_overlong_penalties(batch: RowBatch, config: Config) -> None:
    """``reward_model.overlong_buffer``: each row's penalty from its own response length."""
    if not config.reward_model.overlong_buffer.enable:
        return

    scored = [row for row in batch.rows if row.reward is not None]
    for row, penalty in zip(scored, overlong_penalties(config, [row.response_ids for row in scored])):
        row.penalty = penalty


def _apply_filters(batch: RowBatch, episodes: list[Episode], groups: list[str], config: Config) -> dict[str, float]:
    rllm = config.rllm
    masked_reasons = {
        reason for flag, reason in COMPACT_FILTERS.items() if rllm.compact_filtering.enable and getattr(rllm.compact_filtering, flag)
    }
    truncation = rllm.mask_truncated_samples or rllm.agent.overlong_filter
    rejected: set[str] = set()
    metrics: dict[str, float] = {}
    if rllm.rejection_sample.enable:
        verdicts: dict[str, list[bool]] = {}
        for episode, group in zip(episodes, groups):
            verdicts.setdefault(group, []).append(bool(episode.is_correct))
        solve_all = {g for g, v in verdicts.items() if all(v)}
        solve_none = {g for g, v in verdicts.items() if not any(v)}
        rejected = solve_all | solve_none
        count = max(len(verdicts), 1)
        metrics.update({
            "rejection/solve_all": len(solve_all) / count,
            "rejection/solve_none": len(solve_none) / count,
            "rejection/solve_partial": 1 - len(rejected) / count,
        })
    for row in batch.rows:
        if row.episode < 0:
            continue
        episode = episodes[row.episode]
        if (
            episode.termination_reason in masked_reasons
            or (truncation and len(row.response_ids) >= config.data.max_response_length)
            or groups[row.episode] in rejected
        ):
            row.trainable = False
    if batch.expanded:
        metrics["rows"] = float(len(batch.rows))
    if masked_reasons or truncation or rejected:
        metrics["masked_rows"] = sum(not row.trainable for row in batch.rows) / max(len(batch.rows), 1)
    return metrics


def refuse_row_options(config: Config, reason: str) -> None:
    """Where rows are not laid out by ``episode_rows`` (other backends, TRL's own single-turn
    generation): refuse, by name and with ``reason``, the rllm.* options that need it."""
    rllm = config.rllm
    given = {
        "rllm.stepwise_advantage.enable": rllm.stepwise_advantage.enable,
        "rllm.compact_filtering.enable": rllm.compact_filtering.enable,
        "rllm.rejection_sample.enable": rllm.rejection_sample.enable,
        "rllm.mask_truncated_samples": rllm.mask_truncated_samples,
        "rllm.agent.overlong_filter": rllm.agent.overlong_filter,
    }
    for key, on in given.items():
        if on:
            raise ConfigError(key, f"has no effect here: {reason}.")
