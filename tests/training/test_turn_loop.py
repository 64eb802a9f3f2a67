"""The one agent + environment turn loop (``training.agents.turn_loop``): its rules, and that every
runner plays its episodes through it (the episode runner and so verl's agent loop, rLLM's
AgentExecutionEngine, the agent + environment workflows, ms-swift's multi-turn scheduler).

The model is a script (``respond``) or the episode runner's ``ScriptedGenerator``: the tests check
exact turns, rewards and tokens.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from pathlib import Path

import pytest

from test_episode_runner import (EOS, LOGPROB, TOKENIZER, ChatAgent, CounterEnv, ScriptedGenerator, ids, make_env,
                                 masked_text, rllm_env)

import training
from training.agents.spec import AgentSpec
from training.agents.turn_loop import Reply, TurnLoop, run_turns
from training.backends.swift.backend import DEFAULT_PYTHON, environment_problem
from training.backends.verl.backend import compose_verl_config
from training.compat.rllm.engines import AgentExecutionEngine
from training.config import Config
from training.errors import TerminationEvent
from training.rollouts.episode_runner import EpisodeRunner
from training.threads import DaemonThreadExecutor
from training.types import Action, ModelOutput, TerminationReason

ROOT = Path(__file__).resolve().parents[2]
NEVER = threading.Event()  # set by nothing: a call waiting on it never returns


def script(*texts: str, out_of_budget: bool = False):
    """A model that answers with ``texts`` in turn (then "ok"), recording each conversation it saw."""
    replies = list(texts)
    seen: list[list[dict]] = []

    async def respond(messages: list[dict]) -> Reply:
        seen.append([dict(m) for m in messages])
        return Reply(replies.pop(0) if replies else "ok", out_of_budget=out_of_budget)

    respond.seen = seen
    return respond


def play(loop: TurnLoop, respond) -> TerminationReason:
    return asyncio.run(run_turns(loop, respond))


def counter(**task) -> CounterEnv:
    return make_env("Env")(task)


# -- the rules ------------------------------------------------------------------------------------


def test_the_env_ends_the_episode_and_its_rewards_add_up():
    agent, env = ChatAgent(), counter(turns=3)
    loop = TurnLoop(agent, env, max_steps=5)
    respond = script("ok", "no", "ok")
    assert play(loop, respond) == TerminationReason.ENV_DONE
    assert loop.turns == 3 and loop.reward == 2.0 and loop.is_correct
    # Each turn the model answers the whole conversation: the first observation, then each reply and answer.
    assert [m["content"] for m in respond.seen[-1]] == ["Q:", "ok", "1?", "no", "2?"]
    assert [step.next_observation for step in agent.trajectory.steps] == ["1?", "2?", "3?"]
    assert type(env).closed == 1


def test_max_steps_ends_the_episode_after_that_many_turns():
    loop = TurnLoop(ChatAgent(), counter(turns=0), max_steps=2)
    assert play(loop, script()) == TerminationReason.MAX_TURNS
    assert loop.turns == 2 and loop.reward == 2.0
    assert not loop.is_correct  # a reward gathered until the turn limit is not a solved episode


def test_no_turn_is_played_with_max_steps_zero():
    respond = script()
    assert play(TurnLoop(ChatAgent(), counter(turns=1), max_steps=0), respond) == TerminationReason.MAX_TURNS
    assert respond.seen == []


def test_a_reply_out_of_budget_ends_the_episode_even_when_the_env_is_done():
    loop = TurnLoop(ChatAgent(), counter(turns=1), max_steps=5)
    assert play(loop, script(out_of_budget=True)) == TerminationReason.MAX_RESPONSE_LENGTH
    assert loop.turns == 1 and loop.reward == 1.0  # the env's reward stands; the reason says the reply was cut


def test_the_driver_ends_the_episode_before_a_call_with_a_termination_event():
    async def too_long(messages):
        raise TerminationEvent(TerminationReason.MAX_PROMPT_LENGTH)

    env = counter(turns=1)
    loop = TurnLoop(ChatAgent(), env, max_steps=5)
    assert play(loop, too_long) == TerminationReason.MAX_PROMPT_LENGTH
    assert loop.turns == 0 and type(env).closed == 1


def test_an_env_error_is_recorded_and_raised_and_the_env_closed():
    def broken(self, action):
        raise ValueError("the sandbox crashed")

    env = make_env("Broken", step=broken)({})
    loop = TurnLoop(ChatAgent(), env, max_steps=5)
    with pytest.raises(ValueError, match="the sandbox crashed"):
        play(loop, script())
    assert loop.reason == TerminationReason.ERROR and loop.reward == 0.0
    assert loop.error == "ValueError: the sandbox crashed" and "in broken" in loop.traceback
    assert type(env).closed == 1


def test_an_agent_error_is_an_error_too_but_a_model_error_is_not_the_episodes():
    class Confused(ChatAgent):
        def update_from_model(self, response, **kwargs):
            raise KeyError("no action in the reply")

    loop = TurnLoop(Confused(), counter(turns=1), max_steps=5)
    with pytest.raises(KeyError):
        play(loop, script())
    assert loop.reason == TerminationReason.ERROR and "KeyError" in loop.error

    async def broken_model(messages):
        raise ConnectionError("server down")

    loop = TurnLoop(ChatAgent(), counter(turns=1), max_steps=5)
    with pytest.raises(ConnectionError):
        play(loop, broken_model)
    assert loop.reason is None and loop.error is None  # the driver's to handle (a model failure stops the run)


def test_the_timeout_cuts_a_hung_env_step_and_scores_zero():
    def hung(self, action):
        NEVER.wait()

    env = make_env("Hung", step=hung)({})
    threads = DaemonThreadExecutor()  # the hung call's thread is abandoned, never waited for

    async def in_thread(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(threads, fn, *args)

    loop = TurnLoop(ChatAgent(), env, max_steps=5, timeout=0.2, call_env=in_thread)
    try:
        assert play(loop, script()) == TerminationReason.TIMEOUT
    finally:
        threads.shutdown(wait=False)
    assert loop.cut == "env" and loop.turns == 1 and loop.reward == 0.0 and not loop.is_correct
    assert type(env).closed == 1


def test_the_timeout_cuts_a_model_call_too():
    async def slow_model(messages):
        await asyncio.Event().wait()

    loop = TurnLoop(ChatAgent(), counter(turns=1), max_steps=5, timeout=0.05)
    assert play(loop, slow_model) == TerminationReason.TIMEOUT
    assert loop.cut == "model" and loop.turns == 0


def test_a_turn_that_ends_past_the_timeout_ends_the_episode():
    """An env step that runs on the event loop cannot be cut; the turn it ends still ends the episode."""

    async def slow_inline(fn, *args):
        answer = fn(*args)
        if fn.__name__ == "step":
            loop.started -= 3600  # the step took an hour, as far as the loop's clock knows
        return answer

    loop = TurnLoop(ChatAgent(), counter(turns=0), max_steps=5, timeout=60.0, call_env=slow_inline)
    assert play(loop, script()) == TerminationReason.TIMEOUT
    assert loop.cut is None and loop.turns == 1 and loop.reward == 0.0


def test_the_env_gets_the_action_field_or_the_action_itself():
    seen = []

    def step(self, action):
        seen.append(action)
        return "", 0.0, True, {}

    env = make_env("Seen", step=step)
    play(TurnLoop(ChatAgent(), env({}), max_steps=1), script("a"))
    play(TurnLoop(ChatAgent(), env({}), max_steps=1, hand_action=True), script("b"))
    assert seen == ["a", Action("b")]


def test_an_env_the_loop_does_not_own_stays_open_and_a_failing_close_is_ignored():
    def failing_close(self):
        type(self).closed += 1
        raise OSError("already gone")

    kept = counter(turns=1)
    play(TurnLoop(ChatAgent(), kept, owns_env=False), script())
    assert type(kept).closed == 0
    closing = make_env("Closing", close=failing_close)({"turns": 1})
    assert play(TurnLoop(ChatAgent(), closing), script()) == TerminationReason.ENV_DONE
    assert type(closing).closed == 1


def test_masks_of_an_episode_the_loop_ended_for_budget():
    """Through the runner's token view: a reply cut to the last of data.max_response_length ends the
    episode ``max_response_length`` although the env said done; its tokens are the model's (mask 1)."""
    spec = AgentSpec(agent_class=ChatAgent, env_class=make_env("Env")).validate()
    config = Config.build({"data.max_response_length": 7, "rllm.agent.max_tokens_per_turn": 5, "rllm.agent.max_steps": 4})
    generator = ScriptedGenerator(["ok", "okay"])
    [episode] = EpisodeRunner(spec, generator, TOKENIZER, config).run([{"turns": 2}])
    assert [limit for _, limit in generator.calls] == [5, 2]  # 7 - "ok</s>" (3) - "1?" (2)
    assert episode.termination_reason == TerminationReason.MAX_RESPONSE_LENGTH
    assert episode.response_ids == ids("ok") + [EOS] + ids("1?") + ids("ok")
    assert episode.response_mask == [1, 1, 1, 0, 0, 1, 1]
    assert episode.response_logprobs == [LOGPROB] * 3 + [0.0] * 2 + [LOGPROB] * 2
    assert masked_text(episode, 0) == "1?" and episode.reward == 2.0  # "okay" cut to "ok" scores too


# -- every runner plays through the one loop ------------------------------------------------------


class InfoAgent(ChatAgent):
    """Keeps every ``info`` it is given."""

    def reset(self) -> None:
        super().reset()
        self.infos: list[dict] = []

    def update_from_env(self, observation, reward, done, info, **kwargs) -> None:
        self.infos.append(dict(info))
        super().update_from_env(observation, reward, done, info, **kwargs)


AGENTS: list[InfoAgent] = []


class SeenAgent(InfoAgent):
    def __init__(self) -> None:
        super().__init__()
        AGENTS.append(self)


def run_episode_runner() -> None:
    spec = AgentSpec(agent_class=SeenAgent, env_class=make_env("Env")).validate()
    EpisodeRunner(spec, ScriptedGenerator(), TOKENIZER, Config.build({})).run([{"turns": 2}])


def run_workflow(name: str) -> None:
    workflow = getattr(training, name)
    spec = AgentSpec(workflow_class=workflow, workflow_args={"agent_cls": SeenAgent, "env_cls": rllm_env()}).validate()
    EpisodeRunner(spec, ScriptedGenerator(), TOKENIZER, Config.build({})).run([{"turns": 2}])


def run_execution_engine() -> None:
    class Scripted(AgentExecutionEngine):
        async def get_model_response(self, prompt, application_id, **kwargs):
            return ModelOutput(text="ok", content="ok", completion_ids=[1, 2])

    engine = Scripted(agent_class=SeenAgent, env_class=make_env("Threaded", threaded=True), max_steps=4)
    asyncio.run(engine.execute_tasks([{"turns": 2}]))


def run_verl_agent_loop() -> None:
    verl_tests = pytest.importorskip("test_verl_agent_loop")  # skipped where verl is not installed

    base = compose_verl_config(Config.build({"actor_rollout_ref.model.path": "tiny-char"}), agent_kind="agent_env",
                               agent_payload="unset", validate=False)
    verl_tests.run_loop(base, AgentSpec(agent_class=SeenAgent, env_class=verl_tests.GuessEnv), {"target": "b"}, ["a", "b"])


DRIVERS = {
    "episode runner": run_episode_runner,
    "verl's agent loop": run_verl_agent_loop,
    "rLLM's AgentExecutionEngine": run_execution_engine,
    "CumulativeWorkflow": lambda: run_workflow("CumulativeWorkflow"),
    "SingleTurnWorkflow": lambda: run_workflow("SingleTurnWorkflow"),
}


@pytest.mark.parametrize("driver", list(DRIVERS))
def test_a_change_made_only_in_the_loop_shows_up_in_every_runner(driver, monkeypatch):
    """What the agent is told with each observation comes from ``TurnLoop.agent_info`` alone:
    changed there, every runner's agent sees the change, at the start and after each turn."""
    original = TurnLoop.agent_info
    monkeypatch.setattr(TurnLoop, "agent_info", lambda self, info: {**original(self, info), "via": "the turn loop"})
    AGENTS.clear()
    DRIVERS[driver]()
    infos = [info for agent in AGENTS for info in agent.infos]
    assert len(infos) >= 2, infos  # the first observation and at least one answer
    assert all(info.get("via") == "the turn loop" for info in infos), infos


SWIFT_DRIVER = r'''
import asyncio, json, sys
from types import SimpleNamespace

from training.agents.turn_loop import TurnLoop
from training.backends.swift.child import agent_env_scheduler

original = TurnLoop.agent_info
TurnLoop.agent_info = lambda self, info: {**original(self, info), "via": "the turn loop"}
samples = []
agent = {"agent_class": "examples.frozenlake.FrozenLakeAgent", "env_class": "examples.frozenlake.FrozenLakeEnv"}
scheduler = agent_env_scheduler(agent, samples, trajectory_timeout=None)(max_turns=int(sys.argv[1]))


async def main():
    request = SimpleNamespace(uuid="u1", messages=[{"role": "user", "content": "placeholder"}],
                              data_dict={"start_row": 0, "start_col": 0})
    await scheduler.on_trajectory_start([request])
    ends = []
    for turn, move in enumerate(["R", "R", "R"], start=1):
        choice = SimpleNamespace(message=SimpleNamespace(content=move))
        ended = await scheduler.on_turn_end(request, choice, turn)
        ends.append(ended["rollout_infos"].get("termination"))
        if ended["done"]:
            break
        scheduler.step(request, choice, turn)
    return ends


ends = asyncio.run(main())
steps = samples[0]["trajectories"][0]["steps"]
print(json.dumps({"ends": ends, "infos": [step["info"] for step in steps if step["model_response"]]}))
'''


@pytest.mark.skipif(environment_problem(DEFAULT_PYTHON) is not None, reason="no .venv-swift here; `make swift-env` builds it")
def test_swifts_scheduler_plays_through_the_same_loop():
    """ms-swift's scheduler, in its own interpreter, with the same change made only in the loop:
    every step of the episode carries it, and the loop's max_steps (ms-swift's max_turns) ends it."""
    done = subprocess.run([str(DEFAULT_PYTHON), "-c", SWIFT_DRIVER, "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ends"] == [None, TerminationReason.MAX_TURNS.value]
    assert len(result["infos"]) == 2 and all(info.get("via") == "the turn loop" for info in result["infos"]), result

