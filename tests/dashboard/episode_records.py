"""Episode store records for the dashboard's tests (and the training-process stand-in
``handoff_process.py``): one episode of a known prompt, reply, tokens and reward."""

from __future__ import annotations

from training.tracking.episodes import episode_record
from training.types import Episode, Step, TerminationReason, Trajectory


def synthetic(step: int, position: int, reward: float, *, source: str = "copy", text: str = "abc=",
              termination: TerminationReason = TerminationReason.ENV_DONE, error: str = "") -> dict:
    episode = Episode(
        task={"prompt": text, "data_source": source},
        trajectories=[Trajectory(steps=[Step(chat_completions=[{"role": "user", "content": text}], model_response="ab",
                                             reward=reward, done=True)], reward=reward)],
        prompt_ids=[1, 2, 3], response_ids=[4, 5, 6], response_mask=[1, 0, 1], response_logprobs=[-0.5, 0.0, -1.5],
        termination_reason=termination, error=error or None,
    )
    if error:
        episode.info["traceback"] = f"Traceback (most recent call last):\n  ...\n{error}"
    return episode_record(episode, split="train", step=step, position=position, group=f"g{step}-{position // 2}",
                          group_position=position % 2, row_index=position, advantage=reward - 0.5,
                          reward_components={"format": 1.0})
