"""``python -m training.backends.swift_child <job.json>``: the swift backend's training process.

It runs in the swift backend's own interpreter (``.venv-swift``: ms-swift, its trl and datasets
pins, and torch), never in the platform's. It imports only the library's light parts (rewards,
agent and environment classes, the tiny model), registers our reward as an ms-swift ORM and a
callback that reports each logged step, then trains through ms-swift's own GRPO entry point
(``swift.pipelines.train.rlhf.rlhf_main``).

An agent + environment trains through ms-swift's multi-turn hook: ``AgentEnvScheduler`` is an
ms-swift ``MultiTurnScheduler`` (registered in ``swift.rollout.multi_turn.multi_turns``) that
plays our turn loop. At the start of a trajectory it builds the agent and the environment from
the row and puts the agent's first messages in the request; after each model turn it hands the
reply to ``agent.update_from_model``, steps the environment with the action and feeds the
observation back through ``agent.update_from_env``; the messages the agent added become the next
turn's. The episode ends when the environment says done or at ``max_turns``; its reward is the
sum of the environment's step rewards, which our ORM returns for that completion.

It talks to its parent (``SwiftProcessor``) on stdout, one line per event:
``@agent-trainer {"event": "metrics", "step": N, "metrics": {...}}``, ``{"event": "checkpoint", "step": N,
"path": ...}`` and ``{"event": "done", ...}``;
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
SCHEDULER_NAME = "agent_trainer_agent_env"
SAMPLES_PER_STEP = 4  # episodes shown per logged step
EPISODE_REWARD = "episode_reward"  # the rollout_infos key the scheduler sums the env's rewards under
# The tiny model's template: the messages' text one after the other, over any number of rounds, as
# our rollout engine renders them (ms-swift's own 'dummy' template keeps only the last round).
PLAIN_TEMPLATE = "agent_trainer_plain"


def emit(event: str, **payload: Any) -> None:
    print(PREFIX + json.dumps({"event": event, **payload}), flush=True)


def register(job: dict[str, Any]) -> None:
    """Our reward as an ms-swift ORM, our reporting as an ms-swift trainer callback, and for an
    agent + environment our turn loop as an ms-swift multi-turn scheduler."""
    from swift.callbacks import callbacks_map
    from swift.callbacks.base import TrainerCallback
    from swift.rewards.orm import ORM, orms

    samples: list[dict] = []  # episodes (as dicts) for the next report

    if job.get("agent"):
        from swift.rollout.multi_turn import multi_turns

        multi_turns[SCHEDULER_NAME] = agent_env_scheduler(job["agent"], samples)
        reward_class = _episode_reward(ORM)
    else:
        from training.rewards import load_reward

        reward_fn = load_reward(job["reward"], answer_key=job["answer_key"])
        reward_class = _single_turn_reward(ORM, reward_fn, job["prompt_key"], samples)

    class Report(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and any(key.startswith("reward") for key in logs):
                numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and math.isfinite(v)}
                emit("metrics", step=state.global_step, metrics=numbers, samples=list(samples))
                samples.clear()

        def on_save(self, args, state, control, **kwargs):
            saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if saved.is_dir():  # whole on disk: sinks that keep files (an artifact store) take it
                emit("checkpoint", step=state.global_step, path=str(saved))

        def on_step_end(self, args, state, control, **kwargs):
            if Path(job["stop_file"]).exists():
                # Saved where it stops, so that a resumed run continues from this step.
                control.should_training_stop = control.should_save = True

    orms[REWARD_NAME] = reward_class
    callbacks_map[CALLBACK_NAME] = Report


def register_plain_template() -> None:
    from swift.template import TemplateMeta, register_template

    register_template(TemplateMeta(PLAIN_TEMPLATE, prefix=[], prompt=["{{QUERY}}"], chat_sep=[], auto_add_bos=True), exist_ok=True)


def _single_turn_reward(ORM: type, reward_fn: Any, prompt_key: str, samples: list[dict]) -> type:
    from training.types import Episode, Step, TerminationReason, Trajectory

    class AgentTrainerReward(ORM):
        def __call__(self, completions, **columns) -> list[float]:
            rewards = []
            for i, completion in enumerate(completions):
                task = {k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                task = {k: v for k, v in task.items() if k != "messages"}
                scored = reward_fn(task, completion)
                rewards.append(float(scored.reward))
                if len(samples) < SAMPLES_PER_STEP:
                    shown = {prompt_key: task.get(prompt_key)}
                    step = Step(observation=shown, model_response=completion, reward=scored.reward, done=True)
                    samples.append(Episode(task=shown, trajectories=[Trajectory(steps=[step], reward=scored.reward)],
                                           termination_reason=TerminationReason.ENV_DONE).to_dict())
            return rewards

    return AgentTrainerReward


def _episode_reward(ORM: type) -> type:
    class AgentTrainerEpisodeReward(ORM):
        """The episode's reward, which ``AgentEnvScheduler`` summed from the environment's steps."""

        def __call__(self, completions, rollout_infos=None, **columns) -> list[float]:
            if rollout_infos is None or len(rollout_infos) != len(completions):
                raise RuntimeError("ms-swift passed no rollout_infos with the multi-turn completions")
            return [float(info[EPISODE_REWARD]) for info in rollout_infos]

    return AgentTrainerEpisodeReward


def agent_env_scheduler(agent: dict[str, Any], samples: list[dict]) -> type:
    """An ms-swift ``MultiTurnScheduler`` class that runs our agent + environment turn loop.

    ``agent``: the job's ``{"agent_class", "env_class", "agent_args", "env_args"}`` (import paths
    and JSON arguments). Finished episodes are appended to ``samples`` (at most a few per step).
    """
    from swift.rollout.multi_turn import MultiTurnScheduler

    from training.agents import AgentSpec
    from training.types import Action, Episode, TerminationReason

    spec = AgentSpec(agent_class=agent["agent_class"], env_class=agent["env_class"],
                     agent_args=agent.get("agent_args") or {}, env_args=agent.get("env_args") or {}).validate()

    class Live:
        def __init__(self, task: dict) -> None:
            self.task = task
            self.env = spec.env_class.from_dict({**task, **spec.env_args})
            self.agent = spec.agent_class(**spec.agent_args)
            self.agent.reset()
            observation, info = self.env.reset()
            self.agent.update_from_env(observation, 0.0, False, info)
            self.total, self.turns, self.info = 0.0, 0, info

    class AgentEnvScheduler(MultiTurnScheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.live: dict[str, Live] = {}

        async def on_trajectory_start(self, requests) -> None:
            for request in requests:
                task = {k: v for k, v in (request.data_dict or {}).items() if k != "messages"}
                self._close(request.uuid)
                self.live[request.uuid] = episode = Live(task)
                request.messages = [dict(message) for message in episode.agent.chat_completions]

        async def on_turn_end(self, request, response_choice, current_turn: int) -> dict[str, Any]:
            episode = self.live[request.uuid]
            action = episode.agent.update_from_model(response_choice.message.content)
            observation, reward, done, info = episode.env.step(action.action if isinstance(action, Action) else action)
            episode.total += float(reward)
            episode.turns, episode.info = current_turn, info
            episode.agent.update_from_env(observation, reward, done, info)
            out_of_turns = bool(self.max_turns) and current_turn >= self.max_turns
            if done or out_of_turns:
                self._finish(request.uuid, TerminationReason.ENV_DONE if done else TerminationReason.MAX_TURNS)
            return {"done": bool(done), "rollout_infos": {EPISODE_REWARD: episode.total, "env_done": bool(done)}}

        def step(self, request, response_choice, current_turn: int) -> dict[str, Any]:
            # The messages the agent added since the model's reply (the environment's answer) are the next turn.
            added = self.live[request.uuid].agent.chat_completions[len(request.messages):]
            request.messages.extend(dict(message) for message in added)
            return {"infer_request": request}

        def _finish(self, uuid: str, reason: TerminationReason) -> None:
            episode = self.live[uuid]
            if len(samples) < SAMPLES_PER_STEP:
                trajectory = episode.agent.trajectory
                trajectory.reward = episode.total
                ended_by_env = reason == TerminationReason.ENV_DONE
                samples.append(Episode(
                    task=episode.task, trajectories=[trajectory], termination_reason=reason,
                    is_correct=bool((episode.info or {}).get("is_correct", ended_by_env and episode.total > 0)),
                    metrics={"turns": float(episode.turns)},
                ).to_dict())
            self._close(uuid)

        def _close(self, uuid: str) -> None:
            episode = self.live.pop(uuid, None)
            if episode is not None:
                episode.env.close()

    return AgentEnvScheduler


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    if job.get("cpu_threads"):
        import torch

        torch.set_num_threads(job["cpu_threads"])
    register(job)
    register_plain_template()
    from swift.arguments import RLHFArguments
    from swift.pipelines.train.rlhf import rlhf_main

    scheduler = {"multi_turn_scheduler": SCHEDULER_NAME} if job.get("agent") else {}
    arguments = RLHFArguments(**job["swift_args"], **scheduler, reward_funcs=[REWARD_NAME], callbacks=[CALLBACK_NAME])
    result = rlhf_main(arguments)
    emit("done", result={k: v for k, v in (result or {}).items() if isinstance(v, (int, float, str))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
