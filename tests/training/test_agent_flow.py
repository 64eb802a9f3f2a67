"""rLLM's AgentFlow API (its main branch): ``@rollout`` flows call the model through the episode's
OpenAI-compatible endpoint with the real ``openai`` client, the calls' exact tokens and logprobs
end up on the flow's steps, and the ``@evaluator``'s ``EvalOutput`` gives the reward.

The model is ``ScriptedGenerator`` (see test_episode_runner.py), so token ids can be checked exactly."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI
from test_episode_runner import EOS, LOGPROB, ScriptedGenerator, ids

import training as rllm
from training import AgentTrainer
from training.agents.spec import AgentSpec
from training.config import Config
from training.rollouts.episode_runner import EpisodeRunner
from training.types import AgentConfig, Episode, EvalOutput, Signal, Step, Task, TerminationReason, Trajectory


def run(flow, evaluator, replies=(), tasks=({"question": "2+5="},), **overrides):
    config = Config.build({"rllm.agent.max_tokens_per_turn": 8, **overrides})
    spec = AgentSpec(agent_flow=flow, evaluator=evaluator).validate()
    return EpisodeRunner(spec, ScriptedGenerator(list(replies)), __import__("test_episode_runner").TOKENIZER, config).run(list(tasks))


async def ask(config: AgentConfig, content: str) -> str:
    client = AsyncOpenAI(base_url=config.base_url, api_key="EMPTY", max_retries=0)
    try:
        response = await client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": content}])
    finally:
        await client.close()
    return response.choices[0].message.content or ""


SEEN: list[tuple[Task, AgentConfig]] = []


@rllm.rollout(name="math")
async def one_call_flow(task: Task, config: AgentConfig) -> Episode:
    SEEN.append((task, config))
    content = await ask(config, task.metadata["question"])
    step = Step(chat_completions=[{"role": "user", "content": task.instruction}, {"role": "assistant", "content": content}],
                model_response=content, action=content)
    return Episode(trajectories=[Trajectory(name="math", steps=[step])], artifacts={"answer": content})


@rllm.evaluator
def exact_seven(task: dict, episode: Episode) -> EvalOutput:
    correct = episode.artifacts["answer"] == task["ground_truth"]
    return EvalOutput(reward=float(correct), is_correct=correct, signals=[Signal("accuracy", float(correct))],
                      metadata={"reason_code": 3, "note": "text is left out of the metrics"})


def test_a_flow_gets_a_task_and_the_episodes_endpoint_and_its_steps_get_the_calls_tokens():
    SEEN.clear()
    [episode] = run(one_call_flow, exact_seven, ["7"], tasks=[{"question": "2+5=", "ground_truth": "7", "id": "t9"}])
    assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
    [(task, config)] = SEEN
    assert (task.id, task.instruction, task.metadata) == ("t9", "2+5=", {"question": "2+5=", "ground_truth": "7", "id": "t9"})
    assert config.base_url.startswith("http://127.0.0.1:") and config.model == "policy" and not config.is_validation
    assert config.sampling_params == {"temperature": 1.0, "top_p": 1.0}
    [trajectory] = episode.trajectories
    assert trajectory.name == "math" and trajectory.reward == 1.0 and episode.is_correct
    assert trajectory.signals == {"accuracy": 1.0}
    assert episode.metrics["accuracy"] == 1.0 and episode.metrics["reason_code"] == 3.0 and "note" not in episode.metrics
    [step] = trajectory.steps
    assert step.response_ids == ids("7") + [EOS] and step.logprobs == [LOGPROB] * 2
    assert episode.prompt_ids == step.prompt_ids and episode.prompt_ids[-len(ids("2+5=")) - 2:]  # the rendered chat
    assert episode.response_ids == step.response_ids and episode.response_mask == [1, 1]
    assert episode.artifacts == {"answer": "7"} and episode.session_id


def test_a_wrong_answer_earns_the_evaluators_zero():
    [episode] = run(one_call_flow, exact_seven, ["3"], tasks=[{"question": "2+5=", "ground_truth": "7"}])
    assert episode.reward == 0.0 and not episode.is_correct and episode.metrics["accuracy"] == 0.0


@rllm.rollout(name="solver-judge")
async def solver_judge(task: Task, config: AgentConfig) -> Episode:
    async def solve() -> Trajectory:
        content = await ask(config, "solve")
        return Trajectory(name="solver", steps=[Step(model_response=content, action=content)])

    solvers = await asyncio.gather(solve(), solve())
    choice = await ask(config, "judge")
    judge = Trajectory(name="judge", steps=[Step(model_response=choice, action=choice)])
    return Episode(trajectories=[*solvers, judge], artifacts={"answer": choice})


def test_rewards_an_evaluator_gives_trajectories_itself_are_kept_even_zero():
    @rllm.evaluator
    def per_trajectory(task: dict, episode: Episode) -> EvalOutput:
        for trajectory in episode.trajectories[:2]:  # the solvers: 1 for "a", 0 otherwise
            trajectory.reward = 1.0 if trajectory.steps[0].action == "a" else 0.0
        return EvalOutput(reward=0.5, is_correct=True)  # the judge's, which it left unset

    [episode] = run(solver_judge, per_trajectory, ["a", "b", "1"])
    assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
    assert sorted(t.reward for t in episode.trajectories[:2]) == [0.0, 1.0] and episode.trajectories[2].reward == 0.5
    for trajectory in episode.trajectories:  # each step got the tokens of the call that wrote its text
        [step] = trajectory.steps
        assert step.response_ids == ids(step.model_response) + [EOS]


def test_a_flow_returning_none_gets_one_trajectory_named_by_the_decorator_with_every_call():
    @rllm.rollout(name="caller")
    async def two_calls(task, config):
        await ask(config, "first")
        await ask(config, "second")

    [episode] = run(two_calls, lambda_evaluator(1.0), ["x", "y"])
    [trajectory] = episode.trajectories
    assert trajectory.name == "caller" and [s.model_response for s in trajectory.steps] == ["x", "y"]
    assert trajectory.reward == 1.0 and all(s.response_ids for s in trajectory.steps)


def lambda_evaluator(reward: float):
    return rllm.evaluator(lambda task, episode: reward)


def test_evaluators_get_the_row_or_the_task_as_rllm_decides_by_their_signature():
    got = []

    class TaskEvaluator:
        def evaluate(self, task, episode):
            got.append(task)
            return EvalOutput(reward=1.0, is_correct=True)

    class RowEvaluator:
        def evaluate(self, task_info, episode):
            got.append(task_info)
            return True

    run(one_call_flow, TaskEvaluator(), ["7"])
    run(one_call_flow, RowEvaluator(), ["7"])
    assert isinstance(got[0], Task) and got[0].metadata == {"question": "2+5="}
    assert got[1] == {"question": "2+5="}


def test_a_flow_that_never_calls_the_model_is_an_error_episode_saying_so():
    @rllm.rollout
    def silent(task, config):
        return Trajectory(steps=[Step(model_response="made up")])

    [episode] = run(silent, lambda_evaluator(1.0), **{"rllm.agent.retries": 0})
    assert episode.termination_reason == TerminationReason.ERROR
    assert "returned without calling the model" in episode.error and "config.base_url" in episode.error


def test_a_sync_flow_runs_in_a_thread_and_its_trajectory_takes_the_flows_name():
    @rllm.rollout(name="sync")
    def sync_flow(task, config):
        content = asyncio.run(ask(config, "hi"))
        return Trajectory(steps=[Step(model_response=content)])

    [episode] = run(sync_flow, lambda_evaluator(1.0), ["z"])
    assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
    assert episode.trajectories[0].name == "sync" and episode.trajectories[0].steps[0].response_ids == ids("z") + [EOS]


def test_bad_agent_flow_arguments_are_refused_when_the_trainer_is_built(tmp_path):
    rows = [{"question": "q", "ground_truth": "7"}] * 2
    build = dict(train_dataset=rows, backend="trl", run_path=str(tmp_path), config={"data.train_batch_size": 2})
    with pytest.raises(ValueError, match="needs an evaluator"):
        AgentTrainer(agent_flow=one_call_flow, **build)
    with pytest.raises(ValueError, match="evaluator must have evaluate"):
        AgentTrainer(agent_flow=one_call_flow, evaluator=lambda task, episode: 1.0, **build)
    with pytest.raises(ValueError, match="agent_flow must be an AgentFlow"):
        AgentTrainer(agent_flow="not a flow at all".split, evaluator=exact_seven, **build)
    with pytest.raises(ValueError, match="scored by its evaluator"):
        AgentTrainer(agent_flow=one_call_flow, evaluator=exact_seven, reward_func="exact_match", **build)
    with pytest.raises(ValueError, match="give agent_flow= too"):
        AgentTrainer(agent_run_func=lambda **kw: 1.0, evaluator=exact_seven, **build)
    with pytest.raises(ValueError, match="command-line registry"):
        rllm.rollout(name="x", register="my-agent")


def test_rllm_mains_unified_config_names_and_a_hydra_dictconfig_are_read(tmp_path):
    from omegaconf import OmegaConf

    from training.errors import ConfigError

    # Overrides as rLLM's cookbooks/math/train_tinker.sh gives them (hydra's rllm/backend group too).
    config = Config.build(["rllm/backend=trl", "model.name=tiny-char", "training.group_size=4",
                           "rllm.rollout.train.temperature=0.6", "rllm.rollout.val.temperature=0.5",
                           "rllm.trainer.total_epochs=1", "rllm.trainer.test_freq=10", "data.train_batch_size=2"])
    rollout = config.actor_rollout_ref.rollout
    assert (config.rllm.backend, config.actor_rollout_ref.model.path, rollout.n) == ("trl", "tiny-char", 4)
    assert (rollout.temperature, rollout.val_kwargs.temperature) == (0.6, 0.5)
    assert (config.trainer.total_epochs, config.trainer.test_freq) == (1, 10)
    as_hydra = OmegaConf.from_dotlist(["rllm.backend=trl", "model.name=tiny-char", "training.group_size=2"])
    assert Config.build(as_hydra).actor_rollout_ref.rollout.n == 2
    with pytest.raises(ConfigError, match="rllm.backend.*names backend 'tinker' but this trainer runs 'trl'"):
        AgentTrainer(agent_flow=one_call_flow, evaluator=exact_seven, train_dataset=[{"question": "q"}] * 2,
                     backend="trl", run_path=str(tmp_path),
                     config=OmegaConf.from_dotlist(["rllm.backend=tinker", "data.train_batch_size=2"]))
