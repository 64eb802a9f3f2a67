"""Episodes as training rows (training/algorithms/episode_rows.py): one row per conversation, advantages
compared within (task, trajectory name) groups, rLLM's stepwise modes and filters."""

from __future__ import annotations

import pytest
import torch

from training.config import Config
from training.algorithms.episode_rows import episode_rows, equal_reward_groups, pad_rows, row_advantages
from training.types import Episode, ModelOutput, Step, TerminationReason, Trajectory

NO_STD = Config.build({"algorithm.norm_adv_by_std_in_grpo": False}).algorithm  # advantages are reward - group mean


def call(prompt: list[int], reply: list[int], reward: float = 0.0) -> Step:
    return Step(prompt_ids=prompt, response_ids=reply, logprobs=[-0.5] * len(reply), reward=reward)


def single_conversation(reward: float, reason=TerminationReason.ENV_DONE) -> Episode:
    steps = [call([1, 2], [3]), call([1, 2, 3, 4], [5, 6])]
    return Episode(
        trajectories=[Trajectory(steps=steps, reward=reward)], termination_reason=reason,
        prompt_ids=[1, 2], response_ids=[3, 4, 5, 6], response_mask=[1, 0, 1, 1], response_logprobs=[-0.5, 0, -0.5, -0.5],
    )


def solver_judge(solver_rewards: tuple[float, float], judge_reward: float) -> Episode:
    solvers = [Trajectory(name="solver", steps=[call([7], [8 + i], r)], reward=r) for i, r in enumerate(solver_rewards)]
    judge = Trajectory(name="judge", steps=[call([9, 9], [1], judge_reward)], reward=judge_reward)
    episode = Episode(trajectories=[*solvers, judge], termination_reason=TerminationReason.ENV_DONE)
    episode.prompt_ids, episode.response_ids, episode.response_mask = [7], [8], [1]  # the engine's view: first call only
    return episode


def test_one_conversation_per_episode_is_one_row_per_episode_in_order():
    batch = episode_rows([single_conversation(1.0), single_conversation(0.0)], ["0", "0"], Config.build({}))
    assert not batch.expanded
    assert [(r.prompt_ids, r.response_ids, r.response_mask, r.reward) for r in batch.rows] == [
        ([1, 2], [3, 4, 5, 6], [1, 0, 1, 1], 1.0), ([1, 2], [3, 4, 5, 6], [1, 0, 1, 1], 0.0)]


def test_every_trajectory_is_a_row_with_its_own_reward_grouped_by_task_and_name():
    episodes = [solver_judge((1.0, 0.0), 1.0), solver_judge((0.0, 0.0), 0.0)]
    batch = episode_rows(episodes, ["t", "t"], Config.build({}))
    assert batch.expanded and batch.metrics["rows"] == 6
    assert [(r.group, r.reward, r.response_ids) for r in batch.rows[:3]] == [
        ("t/solver", 1.0, [8]), ("t/solver", 0.0, [9]), ("t/judge", 1.0, [1])]
    advantages = row_advantages(batch, NO_STD)
    # Solvers: mean of (1, 0, 0, 0) is 0.25; judges: mean of (1, 0) is 0.5.
    assert advantages.tolist() == pytest.approx([0.75, -0.25, 0.5, -0.25, -0.25, -0.5])


def test_calls_that_do_not_continue_each_other_become_separate_rows_of_one_unit():
    trajectory = Trajectory(name="agent", steps=[call([1], [2]), call([5], [6])], reward=1.0)
    episode = Episode(trajectories=[trajectory], termination_reason=TerminationReason.ENV_DONE, prompt_ids=[1], response_ids=[2], response_mask=[1])
    other = Episode(trajectories=[Trajectory(name="agent", steps=[call([1], [3])], reward=0.0)],
                    termination_reason=TerminationReason.ENV_DONE, prompt_ids=[1], response_ids=[3], response_mask=[1])
    batch = episode_rows([episode, other], ["t", "t"], Config.build({}))
    assert [(r.prompt_ids, r.unit) for r in batch.rows] == [([1], "0/0"), ([5], "0/0"), ([1], "1/0")]
    # One unit counts once in its group, whatever its number of rows.
    assert row_advantages(batch, NO_STD).tolist() == pytest.approx([0.5, 0.5, -0.5])


def test_per_step_mode_compares_each_step_with_the_same_step_of_the_other_episodes():
    config = Config.build({"rllm.stepwise_advantage.enable": True, "rllm.stepwise_advantage.mode": "per_step"})
    first = single_conversation(1.0)
    first.trajectories[0].steps[1].reward = 1.0
    batch = episode_rows([first, single_conversation(0.0)], ["t", "t"], config)
    assert [(r.group, r.prompt_ids, r.response_ids, r.reward) for r in batch.rows] == [
        ("t/agent/0", [1, 2], [3], 0.0), ("t/agent/1", [1, 2, 3, 4], [5, 6], 1.0),
        ("t/agent/0", [1, 2], [3], 0.0), ("t/agent/1", [1, 2, 3, 4], [5, 6], 0.0)]
    assert row_advantages(batch, NO_STD).tolist() == pytest.approx([0, 0.5, 0, -0.5])


def test_broadcast_mode_gives_each_step_its_trajectorys_advantage_normalized_by_steps():
    config = Config.build({"rllm.stepwise_advantage.enable": True, "rllm.stepwise_advantage.normalize_by_steps": True})
    batch = episode_rows([single_conversation(1.0), single_conversation(0.0)], ["t", "t"], config)
    assert row_advantages(batch, NO_STD).tolist() == pytest.approx([0.25, 0.25, -0.25, -0.25])


def test_steps_without_tokens_take_them_from_model_output_via_the_engine_and_empty_episodes_keep_a_masked_row():
    empty = Episode(trajectories=[Trajectory(steps=[Step(model_output=ModelOutput(text="x"))])],
                    termination_reason=TerminationReason.MAX_PROMPT_LENGTH)
    batch = episode_rows([solver_judge((1.0, 0.0), 0.0), empty], ["t", "u"], Config.build({}))
    last = batch.rows[-1]
    assert (last.response_ids, last.trainable, last.group) == ([], False, "u")


def test_compact_filtering_masks_episodes_by_termination_after_advantages():
    config = Config.build({"rllm.compact_filtering.enable": True})
    batch = episode_rows([single_conversation(1.0, TerminationReason.TIMEOUT), single_conversation(0.0)], ["t", "t"], config)
    assert [r.trainable for r in batch.rows] == [False, True] and batch.metrics["masked_rows"] == 0.5
    assert batch.rows[0].loss_mask == [0, 0, 0, 0]


def test_rejection_sampling_masks_tasks_all_solved_or_all_failed():
    config = Config.build({"rllm.rejection_sample.enable": True})
    solved, failed = single_conversation(1.0), single_conversation(0.0)
    solved.is_correct = True
    batch = episode_rows([solved, failed, failed, failed], ["a", "a", "b", "b"], config)
    assert [r.trainable for r in batch.rows] == [True, True, False, False]
    assert batch.metrics["rejection/solve_none"] == 0.5 and batch.metrics["rejection/solve_partial"] == 0.5


def test_truncated_rows_are_masked_when_asked():
    config = Config.build({"rllm.mask_truncated_samples": True, "data.max_response_length": 4})
    batch = episode_rows([single_conversation(1.0)], ["t"], config)
    assert not batch.rows[0].trainable


def test_padding_rows_and_equal_reward_groups():
    batch = episode_rows([solver_judge((1.0, 1.0), 0.0)], ["t"], Config.build({}))
    pad_rows(batch, 4)
    assert len(batch.rows) == 4 and batch.rows[-1].reward is None and not batch.rows[-1].trainable
    assert equal_reward_groups(batch) == {"t/solver", "t/judge"}
    assert row_advantages(batch, Config.build({"algorithm.adv_estimator": "rloo"}).algorithm)[-1] == 0.0
    assert isinstance(row_advantages(batch, Config.build({"algorithm.adv_estimator": "reinforce_plus_plus"}).algorithm), torch.Tensor)


def test_overlong_buffer_penalises_each_row_by_its_own_length():
    """reward_model.overlong_buffer on an episode of several trajectories: each row's penalty
    follows its own length (DAPO's soft punishment: 0 up to max_response_length - len tokens, then
    down to -penalty_factor at the limit), not the first conversation's length for all of them."""
    config = Config.build({
        "data.max_response_length": 4, "reward_model.overlong_buffer.enable": True,
        "reward_model.overlong_buffer.len": 2, "reward_model.overlong_buffer.penalty_factor": 1.0,
    })
    long = Episode(
        trajectories=[
            Trajectory(name="solver", steps=[call([7], [8], 1.0)], reward=1.0),
            Trajectory(name="solver", steps=[call([7], [8, 8, 8, 8])], reward=0.0),  # at the limit: -1
            Trajectory(name="judge", steps=[call([9], [1, 1, 1], 1.0)], reward=1.0),  # 3 tokens: -0.5
        ],
        termination_reason=TerminationReason.ENV_DONE, prompt_ids=[7], response_ids=[8], response_mask=[1],
    )
    batch = episode_rows([long, solver_judge((0.0, 0.0), 0.0)], ["t", "t"], config)
    assert [row.penalty for row in batch.rows] == pytest.approx([0.0, -1.0, -0.5, 0.0, 0.0, 0.0])
    assert batch.metrics["overlong_penalty"] == pytest.approx(-1.5 / 6)
    # Solvers' shaped rewards (1, -1, 0, 0), mean 0; judges' (0.5, 0), mean 0.25.
    assert row_advantages(batch, NO_STD).tolist() == pytest.approx([1.0, -1.0, 0.25, 0.0, 0.0, -0.25])


def test_overlong_buffer_gives_a_unit_of_several_rows_the_penalty_of_its_longest():
    config = Config.build({
        "data.max_response_length": 4, "reward_model.overlong_buffer.enable": True, "reward_model.overlong_buffer.len": 2,
    })
    two_rows = Trajectory(name="agent", steps=[call([1], [2]), call([5], [6, 6, 6, 6])], reward=1.0)
    episode = Episode(trajectories=[two_rows], termination_reason=TerminationReason.ENV_DONE, prompt_ids=[1], response_ids=[2], response_mask=[1])
    other = Episode(trajectories=[Trajectory(name="agent", steps=[call([1], [3])], reward=1.0)],
                    termination_reason=TerminationReason.ENV_DONE, prompt_ids=[1], response_ids=[3], response_mask=[1])
    batch = episode_rows([episode, other], ["t", "t"], config)
    assert [row.penalty for row in batch.rows] == pytest.approx([0.0, -1.0, 0.0])
    # Unit 0/0 earns 1 - 1 = 0, unit 1/0 earns 1: both of unit 0's rows get its advantage.
    assert row_advantages(batch, NO_STD).tolist() == pytest.approx([-0.5, -0.5, 0.5])
    assert equal_reward_groups(batch) == set()  # equal rewards, unequal once shaped
