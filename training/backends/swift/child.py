"""``python -m training.backends.swift.child <job.json>``: the swift backend's training process.

It runs in the swift backend's own interpreter (``.venv-swift``: ms-swift, its trl and datasets
pins, and torch), never in the platform's. It imports only the library's light parts (rewards,
agent and environment classes, the tiny model), registers our reward as an ms-swift ORM and a
callback that reports each logged step, then trains through ms-swift's own GRPO entry point
(``swift.pipelines.train.rlhf.rlhf_main``).

An agent + environment trains through ms-swift's multi-turn hook: ``AgentEnvScheduler`` is an
ms-swift ``MultiTurnScheduler`` (registered in ``swift.rollout.multi_turn.multi_turns``) that
steps our one turn loop (``training.agents.turn_loop``, the one every runner drives). At the start
of a trajectory it builds the agent and the environment from the row, starts the loop and puts
the agent's first messages in the request; after each model turn the loop hands the reply to
``agent.update_from_model``, steps the environment with the action and feeds the observation back
through ``agent.update_from_env``; the messages the agent added become the next turn's. The
episode ends as the loop's rules say: the environment says done, ``max_turns``, or ``timeout``
(reward 0, as in our rollout engine) once it has run longer than ``rllm.agent.trajectory_timeout``;
its reward is the sum of the environment's step rewards, which our ORM returns for that completion.
The environment's calls run in a daemon thread and are cut at the timeout (a hung environment
step ends the episode with ``timeout`` when its time is up); the model's reply is generated inside
ms-swift's own loop and is not interrupted: the timeout is checked when it ends.

It talks to its parent (``SwiftProcessor``) on stdout, one line per event:
``@agent-trainer {"event": "metrics", "step": N, "metrics": {...}}``, ``{"event": "checkpoint", "step": N,
"path": ...}`` and ``{"event": "done", ...}``;
a file named in the job (``stop_file``) asks it to stop after the current step. Before each
checkpoint it asks ``{"event": "may_save", "step": N}`` and waits for the parent's ``yes`` or ``no``
on stdin (``no``: the run is another process's now; it saves nothing and stops).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any
from training.agents.base import build_agent, build_env
from training.agents.spec import AgentSpec
from training.agents.turn_loop import Reply, TurnLoop
from training.errors import TrainingFailed
from training.rewards import load_reward
from training.rollouts.outcomes import OutcomeMonitor
from training.threads import DaemonThreadExecutor
from training.types import Episode, Step, TerminationReason, Trajectory

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


def may_save(step: int) -> bool:
    """Whether the parent lets this process write the checkpoint of ``step`` (its platform may have
    given the run to another attempt); a parent that is gone answers no."""
    emit("may_save", step=step)
    return sys.stdin.readline().strip() == "yes"


def register(job: dict[str, Any]) -> None:
    """Our reward as an ms-swift ORM, our reporting as an ms-swift trainer callback, and for an
    agent + environment our turn loop as an ms-swift multi-turn scheduler."""
    from swift.callbacks import callbacks_map
    from swift.callbacks.base import TrainerCallback
    from swift.rewards.orm import ORM, orms

    samples: list[dict] = []  # episodes (as dicts) for the next report
    stats: dict[str, float] = {}  # the step's own metrics (termination/...), for the next report
    # The checks every backend makes: episode error rate per step, a reward that raises.
    monitor = OutcomeMonitor(job.get("max_episode_error_rate", 0.0))

    if job.get("agent"):
        from swift.rollout.multi_turn import multi_turns

        multi_turns[SCHEDULER_NAME] = agent_env_scheduler(job["agent"], samples, job.get("trajectory_timeout"))
        reward_class = _episode_reward(ORM, monitor, stats)
    else:
        reward_fn = monitor.watch_reward(load_reward(job["reward"], answer_key=job["answer_key"]))
        reward_class = _single_turn_reward(ORM, reward_fn, job["prompt_key"], samples, monitor)

    class Report(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and any(key.startswith("reward") for key in logs):
                numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and math.isfinite(v)}
                emit("metrics", step=state.global_step, metrics={**numbers, **stats}, samples=list(samples))
                samples.clear()
                stats.clear()

        def on_save(self, args, state, control, **kwargs):
            saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if saved.is_dir():  # whole on disk: sinks that keep files (an artifact store) take it
                emit("checkpoint", step=state.global_step, path=str(saved))

        def on_step_end(self, args, state, control, **kwargs):
            if Path(job["stop_file"]).exists():
                # Saved where it stops, so that a resumed run continues from this step.
                control.should_training_stop = control.should_save = True
            if control.should_save and not may_save(state.global_step):
                control.should_save = False
                control.should_training_stop = True

    orms[REWARD_NAME] = reward_class
    callbacks_map[CALLBACK_NAME] = Report


def register_plain_template() -> None:
    from swift.template import TemplateMeta, register_template

    register_template(TemplateMeta(PLAIN_TEMPLATE, prefix=[], prompt=["{{QUERY}}"], chat_sep=[], auto_add_bos=True), exist_ok=True)


def _single_turn_reward(ORM: type, reward_fn: Any, prompt_key: str, samples: list[dict], monitor: Any) -> type:
    class AgentTrainerReward(ORM):
        def __call__(self, completions, trainer_state=None, **columns) -> list[float]:
            monitor.step = trainer_state.global_step + 1 if trainer_state is not None else None
            rewards = []
            for i, completion in enumerate(completions):
                task = {k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                task = {k: v for k, v in task.items() if k != "messages"}
                scored = reward_fn(task, completion)
                rewards.append(float(scored.reward))
                if len(samples) < SAMPLES_PER_STEP:
                    prompt = task.get(prompt_key)
                    # The prompt is what the model read; no environment answers a single turn.
                    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or [])
                    step = Step(chat_completions=messages, model_response=completion, reward=scored.reward, done=True)
                    samples.append(Episode(task={prompt_key: prompt}, trajectories=[Trajectory(steps=[step], reward=scored.reward)],
                                           termination_reason=TerminationReason.ENV_DONE).to_dict())
            return rewards

    return AgentTrainerReward


def _episode_reward(ORM: type, monitor: Any, stats: dict[str, float]) -> type:
    class AgentTrainerEpisodeReward(ORM):
        """The episode's reward, which ``AgentEnvScheduler`` summed from the environment's steps
        (0 for an episode whose agent or environment raised); the step's episodes are checked
        against ``trainer.max_episode_error_rate`` as every backend's are."""

        def __call__(self, completions, rollout_infos=None, trainer_state=None, **columns) -> list[float]:
            if rollout_infos is None or len(rollout_infos) != len(completions):
                raise RuntimeError("ms-swift passed no rollout_infos with the multi-turn completions")
            ends = [info.get("termination", TerminationReason.MAX_TURNS.value) for info in rollout_infos]
            for reason in TerminationReason:
                stats[f"termination/{reason.value}"] = ends.count(reason.value) / len(ends)
            episodes = [{"termination_reason": end, "error": info.get("error"), "info": {"traceback": info.get("traceback", "")}}
                        for end, info in zip(ends, rollout_infos)]
            monitor.check_episodes(episodes, step=trainer_state.global_step + 1 if trainer_state is not None else None)
            return [float(info[EPISODE_REWARD]) for info in rollout_infos]

    return AgentTrainerEpisodeReward


def agent_env_scheduler(agent: dict[str, Any], samples: list[dict], trajectory_timeout: float | None = None) -> type:
    """An ms-swift ``MultiTurnScheduler`` class that runs our agent + environment turn loop.

    ``agent``: the job's ``{"agent_class", "env_class", "agent_args", "env_args"}`` (import paths
    and JSON arguments). Finished episodes are appended to ``samples`` (at most a few per step).
    ``trajectory_timeout``: seconds an episode may take (None: no limit): the environment's step is cut
    at it, the model's reply is checked after it ends.
    """
    from swift.rollout.multi_turn import MultiTurnScheduler

    spec = AgentSpec(agent_class=agent["agent_class"], env_class=agent["env_class"],
                     agent_args=agent.get("agent_args") or {}, env_args=agent.get("env_args") or {}).validate()

    class AgentEnvScheduler(MultiTurnScheduler):
        """Each episode is our one turn loop (``training.agents.turn_loop``), stepped from ms-swift's
        hooks. Agent and environment code can raise anything: the loop records it, the episode ends
        with an error (reward 0), as in our rollout engine, and the step's error rate decides."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.live: dict[str, TurnLoop] = {}
            self.tasks: dict[str, dict] = {}
            self.executor = DaemonThreadExecutor("swift-episode")

        async def call_env(self, fn: Any, *args: Any) -> Any:
            # In a daemon thread: a call that outlasts the episode's time is abandoned there (the
            # thread is never waited for) and the episode ends with ``timeout`` now.
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

        async def on_trajectory_start(self, requests) -> None:
            for request in requests:
                task = {k: v for k, v in (request.data_dict or {}).items() if k != "messages"}
                self._close(request.uuid)
                episode = TurnLoop(None, None, max_steps=self.max_turns or None, timeout=trajectory_timeout,
                                   call_env=self.call_env)
                self.live[request.uuid], self.tasks[request.uuid] = episode, task
                try:
                    with episode.failures():
                        episode.env = build_env(spec.env_class, task, spec.env_args)
                        episode.agent = build_agent(spec.agent_class, spec.agent_args)
                    await episode.start()
                except Exception:
                    pass  # recorded on the loop: the row's placeholder stays, and the first turn ends it
                if episode.reason is None:
                    request.messages = [dict(message) for message in episode.messages]

        async def on_turn_end(self, request, response_choice, current_turn: int) -> dict[str, Any]:
            episode = self.live[request.uuid]
            if episode.reason is None:
                try:
                    await episode.turn(Reply(response_choice.message.content))
                except Exception:
                    pass  # recorded on the loop: the episode ends with an error
            if episode.reason is None:
                return {"done": False, "rollout_infos": {EPISODE_REWARD: episode.total_reward}}
            infos = {EPISODE_REWARD: episode.reward, "termination": episode.reason.value}
            if episode.error:
                infos.update(error=episode.error, traceback=episode.traceback)
            self._finish(request.uuid, current_turn)
            return {"done": True, "rollout_infos": infos}

        def step(self, request, response_choice, current_turn: int) -> dict[str, Any]:
            # The messages the agent added since the model's reply (the environment's answer) are the next turn.
            added = self.live[request.uuid].messages[len(request.messages):]
            request.messages.extend(dict(message) for message in added)
            return {"infer_request": request}

        def _finish(self, uuid: str, turns: int) -> None:
            episode = self.live[uuid]
            if len(samples) < SAMPLES_PER_STEP or (episode.error and not any(s.get("error") for s in samples)):
                trajectories = []
                if episode.agent is not None:
                    trajectory = episode.agent.trajectory
                    trajectory.reward = episode.reward
                    trajectories = [trajectory]
                samples.append(Episode(
                    task=self.tasks[uuid], trajectories=trajectories, termination_reason=episode.reason, error=episode.error,
                    is_correct=episode.is_correct, metrics={"turns": float(turns)},
                    info={"traceback": episode.traceback} if episode.error else {},
                ).to_dict())
            self._close(uuid)

        def _close(self, uuid: str) -> None:
            episode = self.live.pop(uuid, None)
            self.tasks.pop(uuid, None)
            if episode is not None:
                episode.close()

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
    try:
        result = rlhf_main(arguments)
    except TrainingFailed as exc:  # the parent raises it again, as the other backends would
        emit("failed", kind=type(exc).__name__, summary=exc.summary, traceback=exc.user_traceback)
        return 1
    emit("done", result={k: v for k, v in (result or {}).items() if isinstance(v, (int, float, str))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
