"""``python -m training.backends.swift_child <job.json>``: the swift backend's training process.

It runs in the swift backend's own interpreter (``.venv-swift``: ms-swift, its trl and datasets
pins, and torch), never in the platform's. It imports only the library's light parts (rewards,
the tiny model), registers our reward as an ms-swift ORM and a callback that reports each logged
step, then trains through ms-swift's own GRPO entry point (``swift.pipelines.train.rlhf.rlhf_main``).

It talks to its parent (``SwiftProcessor``) on stdout, one line per event:
``@agent-trainer {"event": "metrics", "step": N, "metrics": {...}}`` and ``{"event": "done", ...}``;
a file named in the job (``stop_file``) asks it to stop after the current step.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

PREFIX = "@agent-trainer "
REWARD_NAME = "agent_trainer_reward"
CALLBACK_NAME = "agent_trainer_report"


def emit(event: str, **payload: Any) -> None:
    print(PREFIX + json.dumps({"event": event, **payload}), flush=True)


def register(job: dict[str, Any]) -> None:
    """Our reward as an ms-swift ORM, our reporting as an ms-swift trainer callback."""
    from swift.callbacks import callbacks_map
    from swift.callbacks.base import TrainerCallback
    from swift.rewards.orm import ORM, orms

    from training.rewards import load_reward

    reward_fn = load_reward(job["reward"], answer_key=job["answer_key"])
    prompt_key = job["prompt_key"]
    samples: list[dict] = []

    class AgentTrainerReward(ORM):
        def __call__(self, completions, **columns) -> list[float]:
            rewards = []
            for i, completion in enumerate(completions):
                task = {k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                task = {k: v for k, v in task.items() if k != "messages"}
                scored = reward_fn(task, completion)
                rewards.append(float(scored.reward))
                if len(samples) < 4:
                    samples.append({"task": {prompt_key: task.get(prompt_key)}, "response": completion, "reward": scored.reward})
            return rewards

    class Report(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and any(key.startswith("reward") for key in logs):
                numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and math.isfinite(v)}
                emit("metrics", step=state.global_step, metrics=numbers, samples=list(samples))
                samples.clear()

        def on_step_end(self, args, state, control, **kwargs):
            if Path(job["stop_file"]).exists():
                control.should_training_stop = True

    orms[REWARD_NAME] = AgentTrainerReward
    callbacks_map[CALLBACK_NAME] = Report


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    if job.get("cpu_threads"):
        import torch

        torch.set_num_threads(job["cpu_threads"])
    register(job)
    from swift.arguments import RLHFArguments
    from swift.pipelines.train.rlhf import rlhf_main

    arguments = RLHFArguments(**job["swift_args"], reward_funcs=[REWARD_NAME], callbacks=[CALLBACK_NAME])
    result = rlhf_main(arguments)
    emit("done", result={k: v for k, v in (result or {}).items() if isinstance(v, (int, float, str))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
