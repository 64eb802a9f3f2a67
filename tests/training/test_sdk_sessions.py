"""rLLM's SDK views inside ``fn(**task)`` episodes: ``session()``, ``@trajectory`` and a returned
``list[TrajectoryView]`` becoming an episode of named trajectories, each call with its exact tokens.
Calls go through the trainer's endpoint with the real ``openai`` client library."""

from __future__ import annotations

import asyncio

import pytest

from training.agents.spec import AgentSpec
from training.config import Config
from training.rollouts.generation import HFBatchGenerator
from training.rendering import encode
from training.rollouts.episode_runner import EpisodeRunner
from training.agents.sdk import StepView, TrajectoryView, get_chat_client, get_chat_client_async, session, trajectory
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model
from training.types import TerminationReason

TOKENIZER = build_char_tokenizer()
MODEL = build_tiny_model(TOKENIZER)
# Made outside any episode, as a module-level client would be: its calls still reach the episode.
SHARED = get_chat_client(base_url="http://localhost:4000/v1", api_key="EMPTY", max_retries=0)


def run(func, tasks=({},), n=1):
    config = Config.build({"rllm.agent.max_tokens_per_turn": 4})
    engine = EpisodeRunner(AgentSpec(agent_run_func=func).validate(), HFBatchGenerator(MODEL, TOKENIZER, seed=0),
                           TOKENIZER, config)
    return engine.run(list(tasks), n=n)


async def ask(client, prompt):
    response = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
    return response.choices[0].message.content


def test_solver_judge_with_sessions_returns_one_trajectory_per_view_with_step_rewards():
    async def solver_judge(question, **kwargs):
        client = get_chat_client_async(base_url="http://localhost:4000/v1", api_key="EMPTY")

        async def solve():
            with session(agent="solver") as sess:
                await ask(client, question)
            return sess.steps[0]

        solutions = await asyncio.gather(solve(), solve())
        for i, step in enumerate(solutions):
            step.action, step.reward = f"answer {i}", float(i)
        with session(agent="judge") as sess:
            await ask(client, "pick:")
        judge = sess.steps[0]
        judge.reward = 1.0
        return [TrajectoryView(name="solver", steps=[s]) for s in solutions] + [TrajectoryView(name="judge", steps=[judge])]

    [episode] = run(solver_judge, [{"question": "Q?"}])
    assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
    assert [t.name for t in episode.trajectories] == ["solver", "solver", "judge"]
    assert [t.reward for t in episode.trajectories] == [0.0, 1.0, 1.0]  # step rewards, trajectory reward left 0
    assert episode.is_correct  # the judge's trajectory earned 1, as rLLM counts it
    prompts = [t.steps[0].prompt_ids for t in episode.trajectories]
    assert prompts == [encode(TOKENIZER, "Q?")] * 2 + [encode(TOKENIZER, "pick:")]
    assert episode.trajectories[1].steps[0].action == "answer 1"
    assert all(len(t.steps[0].logprobs) == len(t.steps[0].response_ids) > 0 for t in episode.trajectories)


def test_the_trajectory_decorator_collects_its_calls_and_result():
    seen = {}

    @trajectory(name="solver", style="short")
    def solve(question):
        first = SHARED.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
        SHARED.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        return first.choices[0].message.content

    def rollout(question, **kwargs):
        view = solve(question)
        seen["view"] = view
        view.reward = 0.5
        return [view]

    [episode] = run(rollout, [{"question": "Q"}])
    view = seen["view"]
    assert isinstance(view, TrajectoryView) and view.input == {"question": "Q"} and view.metadata == {"style": "short"}
    assert len(view.steps) == 2 and all(isinstance(s, StepView) for s in view.steps)
    assert view.result == view.steps[0].output["choices"][0]["message"]["content"]
    assert view.steps[0].input["messages"] == [{"role": "user", "content": "Q"}]
    assert view.steps[0].output["prompt_token_ids"] == encode(TOKENIZER, "Q")
    [trajectory_] = episode.trajectories
    assert trajectory_.name == "solver" and trajectory_.reward == 0.5 and len(trajectory_.steps) == 2


def test_nested_sessions_both_see_the_inner_calls():
    counts = {}

    def rollout(**kwargs):
        with session() as outer:
            SHARED.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
            with session() as inner:
                SHARED.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        counts.update(outer=len(outer.steps), inner=len(inner.steps))
        return 0.0

    [episode] = run(rollout)
    assert episode.error is None and counts == {"outer": 2, "inner": 1}


def test_outside_an_episode_a_session_records_nothing():
    with session() as sess:
        pass
    assert sess.steps == [] and len(sess) == 0
    with pytest.raises(ValueError, match="name is generated"):
        session(name="x")


# -- bad returns -----------------------------------------------------------------------------------

def test_a_view_of_a_call_from_elsewhere_is_an_error_episode():
    def rollout(**kwargs):
        SHARED.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        return [TrajectoryView(name="made_up", steps=[StepView(id="nope")])]

    [episode] = run(rollout)
    assert episode.termination_reason == TerminationReason.ERROR
    assert "TrajectoryView 'made_up' holds step 'nope', which is no model call of this episode" in episode.error


def test_an_empty_list_is_an_error_episode():
    def rollout(**kwargs):
        SHARED.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        return []

    [episode] = run(rollout)
    assert "agent_run_func returned an empty list" in episode.error
