"""Workflow-style task: countdown with one retry, written with rLLM's ``Workflow`` API.

The workflow asks the model for an arithmetic expression that reaches a target from given
numbers; if the first answer misses, it tells the model and asks once more. The reward is the
built-in ``countdown`` score of the final answer.
"""

from __future__ import annotations

import random
from typing import Any

from training import Episode, Step, TerminationReason, Trajectory, Workflow
from training.data import register_dataset
from training.rewards import load_reward


class CountdownWorkflow(Workflow):
    def __init__(self, rollout_engine: Any, attempts: int = 2, **kwargs: Any) -> None:
        super().__init__(rollout_engine, **kwargs)
        self.attempts = attempts
        self.score = load_reward("countdown")

    async def run(self, task: dict, uid: str, **kwargs: Any) -> Episode:
        self.reset(task, uid)
        messages = [{"role": "user", "content": f"{' '.join(map(str, task['nums']))}->{task['target']}:"}]
        trajectory = Trajectory(name="countdown", task=task)
        for _ in range(self.attempts):
            output = await self.rollout_engine.get_model_response(messages)
            result = self.score(task, output.content)
            messages.append({"role": "assistant", "content": output.content})
            trajectory.steps.append(
                Step(chat_completions=list(messages), model_response=output.text, model_output=output, reward=result.reward)
            )
            if result.is_correct:
                break
            messages.append({"role": "user", "content": " no:"})
        trajectory.reward = trajectory.steps[-1].reward
        return Episode(
            id=uid, task=task, trajectories=[trajectory], is_correct=trajectory.reward >= 1.0,
            termination_reason=TerminationReason.ENV_DONE,
        )


def make_countdown_tasks(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(count):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        tasks.append({"nums": [a, b], "target": a + b, "data_source": "countdown"})
    return tasks


register_dataset("countdown", lambda: {"train": make_countdown_tasks(128, seed=0), "test": make_countdown_tasks(32, seed=1)})
