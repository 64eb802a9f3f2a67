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
from training.tracking.episodes import TRAIN, episode_record
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
    # Every episode to the episode store (trainer.log_episodes): sent to the parent as it is scored.
    store = EpisodeReporter() if job.get("log_episodes") else None

    if job.get("agent"):
        from swift.rollout.multi_turn import multi_turns

        multi_turns[SCHEDULER_NAME] = agent_env_scheduler(job["agent"], samples, job.get("trajectory_timeout"))
        reward_class = _episode_reward(ORM, monitor, stats, store)
    else:
        reward_fn = monitor.watch_reward(load_reward(job["reward"], answer_key=job["answer_key"]))
        reward_class = _single_turn_reward(ORM, reward_fn, job["prompt_key"], samples, monitor, store)

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


class EpisodeReporter:
    """Each scored batch's episodes as episode store records, sent to the parent (``episodes``
    events): what ms-swift hands a reward function of each sample: its conversation
    (``messages``), its prompt's group (``prompt_id``), the ids of the tokens the model generated
    (``response_token_ids``, every turn's; mask 1 on each: the environment's tokens are not in
    them), and our reward, termination and error. Positions count on within a step (ms-swift may
    score a step's samples in several batches)."""

    def __init__(self) -> None:
        self.positions: dict[int, int] = {}
        self.group_positions: dict[tuple[int, str], int] = {}

    def report(self, step: int, completions: list[str], columns: dict[str, Any], tasks: list[dict],
               scored: list[dict[str, Any]]) -> None:
        records = []
        for i, completion in enumerate(completions):
            group = str(_column(columns, "prompt_id", i, "") or "")
            position = self.positions.get(step, 0)
            self.positions[step] = position + 1
            group_position = self.group_positions.get((step, group), 0)
            self.group_positions[(step, group)] = group_position + 1
            outcome = scored[i]
            ids = [int(t) for turn in (_column(columns, "response_token_ids", i, None) or []) for t in
                   (turn if isinstance(turn, list) else [turn])]
            episode = Episode(
                task=tasks[i], trajectories=[Trajectory(steps=_turns(_column(columns, "messages", i, None) or [], completion,
                                                                     outcome["reward"]), reward=outcome["reward"])],
                termination_reason=TerminationReason(outcome["termination"]), error=outcome.get("error") or None,
                is_correct=bool(outcome.get("is_correct")), response_ids=ids, response_mask=[1] * len(ids),
                info={"traceback": outcome["traceback"]} if outcome.get("traceback") else {},
            )
            record = episode_record(episode, split=TRAIN, step=step, position=position, group=group,
                                    group_position=group_position, reward_components=outcome.get("components"))
            record["prompt_length"] = 0  # ms-swift hands the reward no prompt token ids
            records.append(record)
        emit("episodes", step=step, records=records)


def _column(columns: dict[str, Any], name: str, index: int, default: Any) -> Any:
    values = columns.get(name)
    return values[index] if isinstance(values, list) and index < len(values) else default


def _turns(messages: list[dict], completion: str, reward: float) -> list[Step]:
    """The conversation as turns: each assistant message is a turn's reply to the messages before it."""
    messages = [dict(m) for m in messages if isinstance(m, dict)]
    replies = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    if not replies:
        return [Step(chat_completions=messages, model_response=completion, reward=reward, done=True)]
    return [Step(chat_completions=messages[:k], model_response=str(messages[k].get("content") or ""),
                 reward=reward if k == replies[-1] else 0.0, done=k == replies[-1]) for k in replies]


def _single_turn_reward(ORM: type, reward_fn: Any, prompt_key: str, samples: list[dict], monitor: Any,
                        store: EpisodeReporter | None = None) -> type:
    class AgentTrainerReward(ORM):
        def __call__(self, completions, trainer_state=None, **columns) -> list[float]:
            monitor.step = trainer_state.global_step + 1 if trainer_state is not None else None
            rewards, tasks, outcomes = [], [], []
            for i, completion in enumerate(completions):
                task = {k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                task = {k: v for k, v in task.items() if k not in _SWIFT_COLUMNS}
                scored = reward_fn(task, completion)
                rewards.append(float(scored.reward))
                tasks.append(task)
                outcomes.append({"reward": float(scored.reward), "termination": TerminationReason.ENV_DONE.value,
                                 "is_correct": scored.is_correct, "components": dict(scored.metadata or {})})
                if len(samples) < SAMPLES_PER_STEP:
                    prompt = task.get(prompt_key)
                    # The prompt is what the model read; no environment answers a single turn.
                    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or [])
                    step = Step(chat_completions=messages, model_response=completion, reward=scored.reward, done=True)
                    samples.append(Episode(task={prompt_key: prompt}, trajectories=[Trajectory(steps=[step], reward=scored.reward)],
                                           termination_reason=TerminationReason.ENV_DONE).to_dict())
            if store is not None and monitor.step is not None:
                store.report(monitor.step, completions, columns, tasks, outcomes)
            return rewards

    return AgentTrainerReward


# What ms-swift adds to a sample's reward columns besides the dataset's own: not part of the task.
_SWIFT_COLUMNS = {"messages", "prompt_id", "request_id", "finish_reason", "is_truncated", "rollout_infos",
                  "response_token_ids", "trajectory_inputs"}


def _episode_reward(ORM: type, monitor: Any, stats: dict[str, float], store: EpisodeReporter | None = None) -> type:
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
            step = trainer_state.global_step + 1 if trainer_state is not None else None
            monitor.check_episodes(episodes, step=step)
            rewards = [float(info[EPISODE_REWARD]) for info in rollout_infos]
            if store is not None and step is not None:
                tasks = [{k: v for k, v in ((k, _column(columns, k, i, None)) for k in columns if k not in _SWIFT_COLUMNS)}
                         for i in range(len(completions))]
                outcomes = [{"reward": reward, "termination": end, "is_correct": info.get("is_correct"),
                             "error": info.get("error"), "traceback": info.get("traceback")}
                            for reward, end, info in zip(rewards, ends, rollout_infos)]
                store.report(step, completions, columns, tasks, outcomes)
            return rewards

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
            infos = {EPISODE_REWARD: episode.reward, "termination": episode.reason.value, "is_correct": bool(episode.is_correct)}
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
