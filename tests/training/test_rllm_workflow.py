"""rLLM's Workflow base on our rollout engine: ``get_model_response`` returns a ``ModelOutput``
with the call's exact tokens; ``commit``, ``postprocess_episode``, ``TerminationEvent``, the
workflow's timeout and errors end episodes as rLLM's ``run_with_termination_handling`` does.

The model is ``ScriptedGenerator`` (see test_episode_runner.py), so token ids can be checked exactly.
"""

from __future__ import annotations

import threading

import pytest
from test_episode_runner import EOS, LOGPROB, TOKENIZER, ScriptedGenerator, ids

from training import Episode, ModelOutput, Step, TerminationEvent, TerminationReason, Trajectory, Workflow
from training.agents.spec import AgentSpec
from training.config import Config
from training.rollouts.episode_runner import EpisodeRunner
from training.errors import ModelCallError


def run(workflow_class, replies=None, tasks=None, reward_fn=None, **overrides):
    spec = AgentSpec(workflow_class=workflow_class, workflow_args=overrides.pop("workflow_args", {})).validate()
    engine = EpisodeRunner(spec, ScriptedGenerator(replies), TOKENIZER, Config.build(overrides), reward_fn)
    return engine.run(tasks or [{"question": "Q"}])


class Asker(Workflow):
    """Asks once per ``asks``, one committed trajectory per call, reward 1 for an answer 'ok'."""

    def __init__(self, rollout_engine, asks: int = 1, **kwargs):
        super().__init__(rollout_engine, **kwargs)
        self.asks = asks

    async def run(self, task, uid, **kwargs):
        self.reset(task, uid)
        for i in range(self.asks):
            messages = [{"role": "user", "content": f"{task['question']}{i}"}]
            output: ModelOutput = await self.rollout_engine.get_model_response(messages)
            step = Step(chat_completions=messages, model_output=output, thought=output.reasoning,
                        action=output.content, reward=float(output.content == "ok"))
            self.commit(name=f"asker{i}", trajectory=Trajectory(steps=[step]))
        return None  # rLLM: the committed trajectories are collected and post-processed


def test_get_model_response_returns_the_calls_tokens_and_splits_reasoning():
    seen = {}

    class Probe(Workflow):
        async def run(self, task, uid, **kwargs):
            seen["output"] = await self.rollout_engine.get_model_response([{"role": "user", "content": "Q:"}])
            return None

    run(Probe, ["<think>sum</think>42"])
    output = seen["output"]
    assert (output.text, output.reasoning, output.content) == ("<think>sum</think>42", "sum", "42")
    assert output.prompt_ids == ids("Q:") and output.completion_ids == ids("<think>sum</think>42") + [EOS]
    assert output.logprobs == [LOGPROB] * len(output.completion_ids)
    assert (output.prompt_length, output.completion_length, output.finish_reason) == (2, len(output.completion_ids), "stop")


def test_committed_trajectories_are_post_processed_as_in_rllm():
    [episode] = run(Asker, ["ok", "no"], workflow_args={"asks": 2})
    assert [t.name for t in episode.trajectories] == ["asker0", "asker1"]
    assert [t.reward for t in episode.trajectories] == [1.0, 0.0]  # compute_trajectory_reward: sum of steps
    assert episode.is_correct and episode.metrics["asker0_acc"] == 1.0 and episode.metrics["asker1_acc"] == 0.0
    assert episode.termination_reason == TerminationReason.UNKNOWN  # run() returned None, as rLLM marks it
    # Each step got its call's tokens from its ModelOutput.
    assert [t.steps[0].response_ids for t in episode.trajectories] == [ids("ok") + [EOS], ids("no") + [EOS]]


def test_termination_event_keeps_what_was_committed():
    class Stops(Asker):
        async def run(self, task, uid, **kwargs):
            await super().run(task, uid)
            raise TerminationEvent(TerminationReason.MAX_TURNS_EXCEEDED)

    [episode] = run(Stops, ["ok"])
    assert episode.termination_reason is TerminationReason.MAX_TURNS
    assert episode.reward == 1.0 and episode.error is None


def test_an_error_in_the_workflow_is_an_error_episode_with_its_traceback_and_is_retried():
    attempts = []

    class Fails(Asker):
        async def run(self, task, uid, **kwargs):
            attempts.append(uid)
            await super().run(task, uid)
            return {"not": "an episode"}["missing"]

    [episode] = run(Fails, ["ok", "ok"], **{"rllm.agent.retries": 1})
    assert len(attempts) == 2
    assert episode.termination_reason == TerminationReason.ERROR
    assert episode.error == "KeyError: 'missing'"
    assert "return {\"not\": \"an episode\"}[\"missing\"]" in episode.info["traceback"]
    assert episode.info["error"]["error_type"] == "KeyError"  # rLLM's error details too
    assert episode.reward == 0.0 and episode.trajectories[0].name == "asker0"


def test_the_workflows_own_timeout_ends_the_episode_with_timeout():
    class Slow(Workflow):
        async def run(self, task, uid, **kwargs):
            import asyncio

            await self.rollout_engine.get_model_response([{"role": "user", "content": "Q"}])
            await asyncio.sleep(5)

    [episode] = run(Slow, workflow_args={"timeout": 0.05})
    assert episode.termination_reason == TerminationReason.TIMEOUT and episode.reward == 0.0


def test_a_broken_model_stops_the_rollout_instead_of_counting_error_episodes():
    class Broken(ScriptedGenerator):
        async def generate(self, prompt_ids, max_new_tokens):
            raise RuntimeError("CUDA error: out of memory")

    spec = AgentSpec(workflow_class=Asker).validate()
    engine = EpisodeRunner(spec, Broken(), TOKENIZER, Config.build({}))
    with pytest.raises(ModelCallError, match="CUDA error"):
        engine.run([{"question": "Q"}])


def test_gamma_discounts_step_rewards_into_mc_returns_and_executor_runs_blocking_code():
    class Discounted(Workflow):
        async def run(self, task, uid, **kwargs):
            self.reset(task, uid)
            thread = await self.run_in_executor(lambda: threading.current_thread().name)
            steps = []
            for reward in (0.0, 1.0):
                output = await self.rollout_engine.get_model_response([{"role": "user", "content": "Q"}])
                steps.append(Step(chat_completions=[{"role": "user", "content": "Q"}], model_output=output, reward=reward))
            self.commit(trajectory=Trajectory(name="walker", steps=steps, info={"thread": thread}))

    [episode] = run(Discounted, workflow_args={"gamma": 0.5})
    steps = episode.trajectories[0].steps
    assert [s.reward for s in steps] == [0.5, 1.0] and [s.mc_return for s in steps] == [0.5, 1.0]
    assert episode.trajectories[0].info["thread"] != threading.current_thread().name


def test_a_returned_episode_is_used_as_it_is_and_step_rewards_fill_an_unset_trajectory_reward():
    class SetsStepRewardsOnly(Workflow):  # as rLLM's solver-judge example does
        async def run(self, task, uid, **kwargs):
            output = await self.rollout_engine.get_model_response([{"role": "user", "content": "Q"}])
            step = Step(chat_completions=[], model_output=output, reward=1.0)
            return Episode(id=uid, task=task, trajectories=[Trajectory(name="solver", steps=[step])], is_correct=True)

    [episode] = run(SetsStepRewardsOnly)
    assert episode.trajectories[0].reward == 1.0 and episode.termination_reason == TerminationReason.ENV_DONE


def test_rllms_rolloutengine_is_the_only_class_of_that_name():
    """``training.RolloutEngine`` is rLLM's model interface (what rLLM code imports); the class that
    runs whole episodes is ``EpisodeRunner``, so the two never shadow each other."""
    import training
    import training.rollouts.episode_runner
    from training.rollouts.generation import ModelClient
    from training.agents.workflow import RolloutEngine

    assert training.RolloutEngine is RolloutEngine and issubclass(ModelClient, RolloutEngine)
    assert not hasattr(training.rollouts.episode_runner, "RolloutEngine")
    assert training.rollouts.episode_runner.EpisodeRunner is EpisodeRunner


def test_simple_workflow_asks_once_and_scores_with_the_reward_function():
    from training import RewardOutput, SimpleWorkflow

    def exact(task, action):
        return RewardOutput(reward=float(action.action == task["answer"]), is_correct=action.action == task["answer"])

    [right, wrong] = run(SimpleWorkflow, ["ok", "no"], tasks=[{"problem": "P", "answer": "ok"}] * 2,
                         workflow_args={"reward_function": exact})
    assert (right.reward, right.is_correct, wrong.reward) == (1.0, True, 0.0)
    assert right.termination_reason == TerminationReason.ENV_DONE
    [step] = right.trajectories[0].steps
    assert step.chat_completions[0] == {"role": "user", "content": "P"} and step.action.action == "ok"
    assert step.response_ids == ids("ok") + [EOS]

    [broken] = run(SimpleWorkflow, ["ok"], tasks=[{"text": "P"}], workflow_args={"reward_function": exact})
    assert broken.termination_reason == TerminationReason.ERROR
    assert "the task has none of messages, question, prompt, problem; its fields are ['text']" in broken.error
