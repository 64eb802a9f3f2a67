"""EpisodeRunner: token views and masks, every termination reason, every agent kind, ordering, metrics.

Most tests drive the engine with ``ScriptedGenerator``, a fake that stands in for the model and
answers with given texts, so the tests can check exact token ids. One test runs the real tiny model.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from training.agents.base import BaseAgent, BaseEnv
from training.agents.workflow import Workflow

from training.agents.spec import AgentSpec
from training.config import Config
from training.rollouts.generation import GenerationOutput, HFBatchGenerator
from training.rendering import encode
from training.rollouts.episode_runner import EpisodeRunner, summarize_episodes
from training.errors import ModelCallError
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model
from training.types import Action, Episode, RewardOutput, Step, TerminationReason, Trajectory

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
LOGPROB = -0.25




def ids(text: str) -> list[int]:
    return encode(TOKENIZER, text)


class ScriptedGenerator:
    """Stands in for the model so tests can check exact tokens: answers each call with the next
    scripted text plus EOS (cut to ``max_new_tokens``, then finish_reason "length"), every token
    with logprob -0.25. Records each call's prompt ids and token limit."""

    def __init__(self, texts: list[str] | None = None, default: str = "ok") -> None:
        self.texts = list(texts or [])
        self.default = default
        self.calls: list[tuple[list[int], int]] = []

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        self.calls.append((list(prompt_ids), max_new_tokens))
        text = self.texts.pop(0) if self.texts else self.default
        completion = (ids(text) + [EOS])[:max_new_tokens]
        reason = "stop" if completion[-1:] == [EOS] else "length"
        text = TOKENIZER.decode(completion, skip_special_tokens=True)
        return GenerationOutput(text, list(prompt_ids), completion, [LOGPROB] * len(completion), reason)


class ChatAgent(BaseAgent):
    """An rLLM-style agent: observations become user messages, replies assistant messages."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.messages: list[dict] = []
        self._trajectory = Trajectory()

    @property
    def chat_completions(self) -> list[dict]:
        return self.messages

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory

    def update_from_env(self, observation, reward, done, info, **kwargs) -> None:
        if self._trajectory.steps:
            self._trajectory.steps[-1].reward = reward
        if observation:
            self.messages.append({"role": "user", "content": observation})

    def update_from_model(self, response: str, **kwargs) -> Action:
        self.messages.append({"role": "assistant", "content": response})
        self._trajectory.steps.append(Step(chat_completions=list(self.messages), model_response=response))
        return Action(response)


class CounterEnv(BaseEnv):
    """Observations "Q:" then "<n>?"; reward 1 per "ok"; done after ``task["turns"]`` steps (0: never).

    Counts instances and closes per class so tests can check retries and clean-up.
    """

    created = 0
    closed = 0
    threaded = False

    def __init__(self, task: dict) -> None:
        self.task = task
        self.turn = 0

    @classmethod
    def from_dict(cls, info: dict) -> "CounterEnv":
        cls.created += 1
        return cls(info)

    @classmethod
    def is_multithread_safe(cls) -> bool:
        return cls.threaded

    def reset(self):
        return self.task.get("first", "Q:"), {}

    def step(self, action):
        self.turn += 1
        done = self.turn == self.task.get("turns", 1)
        return f"{self.turn}?", float(action == "ok"), done, {}

    def close(self) -> None:
        type(self).closed += 1


def make_env(name: str, **members) -> type[CounterEnv]:
    """A fresh CounterEnv subclass, so counters never leak between tests."""
    return type(name, (CounterEnv,), {"created": 0, "closed": 0, **members})


def engine(env_class=None, generator=None, overrides=None, reward_fn=None, **spec) -> EpisodeRunner:
    if env_class is not None:
        spec = {"agent_class": ChatAgent, "env_class": env_class, **spec}
    config = Config.build({"rllm.agent.max_steps": 4, "rllm.agent.max_tokens_per_turn": 10, **(overrides or {})})
    return EpisodeRunner(AgentSpec(**spec).validate(), generator or ScriptedGenerator(), TOKENIZER, config, reward_fn)


def masked_text(episode: Episode, mask: int) -> str:
    return TOKENIZER.decode([t for t, m in zip(episode.response_ids, episode.response_mask) if m == mask])


# -- agent + environment ---------------------------------------------------------------------------


def test_env_tokens_are_masked_out_and_model_tokens_in():
    generator = ScriptedGenerator(["ok", "no", "ok"])
    env = make_env("Env")
    [episode] = engine(env, generator).run([{"turns": 3}])

    ok, no = ids("ok") + [EOS], ids("no") + [EOS]
    assert episode.prompt_ids == ids("Q:")
    assert episode.response_ids == ok + ids("1?") + no + ids("2?") + ok
    assert episode.response_mask == [1] * 3 + [0] * 2 + [1] * 3 + [0] * 2 + [1] * 3
    assert episode.response_logprobs == [LOGPROB] * 3 + [0.0] * 2 + [LOGPROB] * 3 + [0.0] * 2 + [LOGPROB] * 3
    assert len(episode.response_ids) == len(episode.response_mask) == len(episode.response_logprobs)
    # Each turn continues from exactly the tokens recorded so far.
    assert [prompt for prompt, _ in generator.calls] == [
        ids("Q:"),
        ids("Q:") + ok + ids("1?"),
        ids("Q:") + ok + ids("1?") + no + ids("2?"),
    ]
    assert episode.termination_reason == TerminationReason.ENV_DONE
    assert episode.reward == 2.0 and episode.is_correct
    assert episode.metrics["turns"] == 3 and episode.metrics["response_length"] == 9
    assert env.created == env.closed == 1
    steps = episode.trajectories[0].steps
    assert steps[1].prompt_ids == generator.calls[1][0] and steps[1].response_ids == no
    assert steps[1].logprobs == [LOGPROB] * 3


def test_max_turns():
    [episode] = engine(make_env("Env"), overrides={"rllm.agent.max_steps": 2}).run([{"turns": 0}])
    assert episode.termination_reason == TerminationReason.MAX_TURNS
    assert episode.metrics["turns"] == 2
    assert episode.reward == 2.0


def test_max_prompt_length_means_no_generation_and_no_reward():
    generator = ScriptedGenerator()
    env = make_env("Env")
    [episode] = engine(env, generator, {"data.max_prompt_length": 5}).run([{"first": "a long question"}])
    assert episode.termination_reason == TerminationReason.MAX_PROMPT_LENGTH
    assert generator.calls == []
    assert episode.prompt_ids == episode.response_ids == []
    assert episode.reward == 0.0 and not episode.is_correct
    assert env.closed == 1


def test_max_response_length_caps_each_turn_and_ends_when_no_room_is_left():
    generator = ScriptedGenerator(default="okay")  # 5 tokens with EOS
    overrides = {"data.max_response_length": 12, "rllm.agent.max_tokens_per_turn": 5}
    [episode] = engine(make_env("Env"), generator, overrides).run([{"turns": 0}])
    # Turn 1: 5 tokens; turn 2: "1?" (2) + room 12-5-2=5; turn 3: "2?" leaves no room.
    assert [limit for _, limit in generator.calls] == [5, 5]
    assert episode.termination_reason == TerminationReason.MAX_RESPONSE_LENGTH
    assert len(episode.response_ids) == 12
    assert masked_text(episode, 0) == "1?"


def test_generation_is_cut_to_the_room_left():
    generator = ScriptedGenerator(default="okay")
    overrides = {"data.max_response_length": 10, "rllm.agent.max_tokens_per_turn": 5}
    [episode] = engine(make_env("Env"), generator, overrides).run([{"turns": 0}])
    assert [limit for _, limit in generator.calls] == [5, 3]
    assert len(episode.response_ids) == 10
    assert episode.termination_reason == TerminationReason.MAX_RESPONSE_LENGTH


def test_timeout_keeps_tokens_so_far_and_gives_no_reward():
    def slow_step(self, action):
        if self.turn == 1:
            time.sleep(5)  # far past the timeout, so a loaded machine cannot blur which ended first
        return CounterEnv.step(self, action)

    # That the run does not wait for the slow step is the hung-step tests' to show, without a clock.
    env = make_env("SlowEnv", threaded=True, step=slow_step)
    [episode] = engine(env, overrides={"rllm.agent.trajectory_timeout": 1.0}).run([{"turns": 0}])
    assert episode.termination_reason == TerminationReason.TIMEOUT
    assert episode.prompt_ids == ids("Q:")
    assert masked_text(episode, 1) == "ok</s>ok</s>"  # two turns were generated before the slow step
    assert episode.reward == 0.0 and not episode.is_correct
    assert env.closed == 1


STUCK_FOREVER = threading.Event()  # set by nothing: a step waiting on it never returns


def stuck_step(self, action):
    if self.task.get("stuck"):
        STUCK_FOREVER.wait()
    return CounterEnv.step(self, action)


def test_a_step_that_never_returns_times_out_and_the_run_goes_on():
    """The hung step's thread is abandoned: the run returns (the other task's episode finished
    normally) instead of waiting for that thread when ``asyncio.run`` shuts down."""
    env = make_env("StuckEnv", threaded=True, step=stuck_step)
    runner = engine(env, overrides={"rllm.agent.trajectory_timeout": 0.5})
    answers: list[list[Episode]] = []
    run = threading.Thread(target=lambda: answers.append(runner.run([{"stuck": True}, {"turns": 1}])), daemon=True)
    run.start()
    run.join(timeout=120)  # a bound for the test, not a timing claim: the run hung before the fix
    assert not run.is_alive(), "the run waited for the environment step that never returns"
    [stuck, finished] = answers[0]
    assert stuck.termination_reason == TerminationReason.TIMEOUT and stuck.reward == 0.0
    assert finished.termination_reason == TerminationReason.ENV_DONE and finished.reward == 1.0
    assert env.closed == 2


@pytest.mark.slow
def test_a_process_whose_episode_step_never_returns_still_exits():
    """Threads of a ThreadPoolExecutor are joined at interpreter exit; the runner's are not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import test_episode_runner as t\n"
        "env = t.make_env('StuckEnv', threaded=True, step=t.stuck_step)\n"
        "[e] = t.engine(env, overrides={'rllm.agent.trajectory_timeout': 0.5}).run([{'stuck': True}])\n"
        "print(e.termination_reason.value)\n"
    )
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here.parents[1]), str(here)])
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                          text=True, timeout=300)  # a bound for the test: the process hung before the fix
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "timeout"


def test_errors_are_retried_then_recorded():
    def broken_step(self, action):
        raise ValueError("the sandbox\ncrashed")

    env = make_env("BrokenEnv", step=broken_step)
    [episode] = engine(env, overrides={"rllm.agent.retries": 2}).run([{}])
    assert episode.termination_reason == TerminationReason.ERROR
    assert env.created == 3 and env.closed == 3
    assert episode.error == "ValueError: the sandbox"
    assert "broken_step" in episode.info["traceback"]
    assert episode.info["attempts"] == 3
    assert episode.reward == 0.0


def test_a_retry_that_succeeds_is_a_normal_episode():
    def flaky_from_dict(cls, info):
        cls.created += 1
        if cls.created == 1:
            raise ConnectionError("sandbox busy")
        return cls(info)

    env = make_env("FlakyEnv", from_dict=classmethod(flaky_from_dict))
    [episode] = engine(env, overrides={"rllm.agent.retries": 1}).run([{}])
    assert episode.termination_reason == TerminationReason.ENV_DONE
    assert episode.info["attempts"] == 2 and episode.error is None
    assert episode.reward == 1.0


def test_model_failures_stop_the_rollout():
    class Broken(ScriptedGenerator):
        async def generate(self, prompt_ids, max_new_tokens):
            raise RuntimeError("CUDA error")

    with pytest.raises(ModelCallError, match="CUDA error"):
        engine(make_env("Env"), Broken(), {"rllm.agent.retries": 3}).run([{}])


def test_is_correct_comes_from_env_info_when_given():
    def step(self, action):
        return "", 1.0, True, {"is_correct": False}

    [episode] = engine(make_env("Env", step=step)).run([{}])
    assert episode.reward == 1.0 and not episode.is_correct


def test_episodes_come_back_group_major_whatever_order_they_finish_in():
    def step(self, action):
        time.sleep(0.02 * (3 - self.task["id"]))  # later tasks finish first
        return CounterEnv.step(self, action)

    env = make_env("Env", threaded=True, step=step)
    episodes = engine(env).run([{"id": i} for i in range(3)], n=2)
    assert [e.task["id"] for e in episodes] == [0, 0, 1, 1, 2, 2]
    assert len({e.id for e in episodes}) == 6


def test_parallelism_is_limited_by_n_parallel_tasks():
    state = {"open": 0, "most": 0}
    lock = threading.Lock()

    def reset(self):
        with lock:
            state["open"] += 1
            state["most"] = max(state["most"], state["open"])
        time.sleep(0.01)
        return "Q:", {}

    def close(self):
        with lock:
            state["open"] -= 1

    env = make_env("Env", threaded=True, reset=reset, close=close)
    engine(env, overrides={"rllm.agent.n_parallel_tasks": 2}).run([{}] * 6)
    assert state["most"] == 2


def test_env_text_rendered_through_a_chat_template():
    """With a template, the masked-out context is exactly what the template adds after the reply."""
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}</s>{% endif %}{{ '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    generator = ScriptedGenerator(["ok", "ok"])
    config = Config.build({"rllm.agent.max_steps": 2})
    spec = AgentSpec(agent_class=ChatAgent, env_class=make_env("Env")).validate()
    [episode] = EpisodeRunner(spec, generator, tokenizer, config).run([{"turns": 2}])
    assert tokenizer.decode(episode.prompt_ids) == "<user>Q:\n<assistant>"
    assert masked_text(episode, 0) == "\n<user>1?\n<assistant>"
    full = tokenizer.decode(episode.prompt_ids + episode.response_ids)
    assert full == "<user>Q:\n<assistant>ok</s>\n<user>1?\n<assistant>ok</s>"


# -- workflows and run functions -------------------------------------------------------------------


class TwoCallWorkflow(Workflow):
    """Asks, then follows up in the same conversation; reward 1 when both answers are "ok"."""

    async def run(self, task: dict, uid: str, **kwargs) -> Episode:
        messages = [{"role": "user", "content": "Q:"}]
        first = await self.model.chat(messages)
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "again?"}]
        second = await self.model.chat(messages)
        reward = float(first.text == second.text == "ok")
        return Episode(trajectories=[Trajectory(steps=list(self.model.steps), reward=reward)])


def test_workflow_tokens_come_from_its_model_calls():
    [episode] = engine(workflow_class=TwoCallWorkflow).run([{"id": 1}])
    ok = ids("ok") + [EOS]
    assert episode.prompt_ids == ids("Q:")
    # The follow-up continues the first call's ids (EOS included), so it extends the token view.
    assert episode.response_ids == ok + ids("again?") + ok
    assert episode.response_mask == [1] * 3 + [0] * 6 + [1] * 3
    assert episode.reward == 1.0
    assert episode.termination_reason == TerminationReason.ENV_DONE
    assert episode.task == {"id": 1} and episode.metrics["turns"] == 2


class FreshContextWorkflow(Workflow):
    async def run(self, task, uid, **kwargs):
        await self.model.complete("first")
        await self.model.complete("unrelated")
        return None


def test_a_call_that_does_not_continue_the_conversation_ends_the_token_view(caplog):
    calls = []

    def reward_fn(task, response):
        calls.append(response)
        return RewardOutput(reward=0.5, is_correct=True)

    with caplog.at_level(logging.WARNING, logger="training"):
        [episode] = engine(workflow_class=FreshContextWorkflow, reward_fn=reward_fn).run([{}])
    assert episode.prompt_ids == ids("first")
    assert episode.response_ids == ids("ok") + [EOS]
    assert "does not continue" in caplog.text
    # The workflow returned None, so the reward function scored the last response.
    assert calls == ["ok"] and episode.reward == 0.5 and episode.is_correct


def test_workflow_errors_keep_the_recorded_calls():
    class Failing(Workflow):
        async def run(self, task, uid, **kwargs):
            await self.model.complete("go")
            raise KeyError("missing field")

    [episode] = engine(workflow_class=Failing).run([{}])
    assert episode.termination_reason == TerminationReason.ERROR
    assert episode.error == "KeyError: 'missing field'"
    assert episode.prompt_ids == ids("go") and sum(episode.response_mask) == 3


def test_run_func_async_returning_a_float():
    async def solve(task, model):
        out = await model.complete(task["question"])
        return 1.0 if out.text == "ok" else 0.0

    [episode] = engine(agent_run_func=solve).run([{"question": "Q?"}])
    assert episode.reward == 1.0 and episode.is_correct
    assert episode.prompt_ids == ids("Q?") and episode.response_ids == ids("ok") + [EOS]


def test_run_func_sync_calls_the_model_from_its_thread():
    def solve(task, model):
        model.chat_sync([{"role": "user", "content": "A"}])
        return RewardOutput(reward=0.3, is_correct=False)

    episodes = engine(agent_run_func=solve).run([{}], n=3)
    assert [e.reward for e in episodes] == [0.3] * 3
    assert not any(e.is_correct for e in episodes)
    assert all(e.prompt_ids == ids("A") for e in episodes)


def test_run_func_returning_none_uses_the_reward_function_and_bad_returns_are_errors():
    async def no_reward(task, model):
        await model.complete("x")

    [scored] = engine(agent_run_func=no_reward, reward_fn=lambda task, text: RewardOutput(2.0, True)).run([{}])
    assert scored.reward == 2.0 and scored.is_correct

    async def wrong(task, model):
        return "yes"

    [failed] = engine(agent_run_func=wrong).run([{}])
    assert failed.termination_reason == TerminationReason.ERROR
    assert "agent_run_func returned str" in failed.error


def test_run_func_timeout():
    async def slow(task, model):
        await model.complete("x")
        await asyncio.sleep(5)

    [episode] = engine(agent_run_func=slow, overrides={"rllm.agent.trajectory_timeout": 0.1}).run([{}])
    assert episode.termination_reason == TerminationReason.TIMEOUT
    assert episode.prompt_ids == ids("x") and episode.reward == 0.0


# -- single turn -----------------------------------------------------------------------------------


def test_single_turn_scores_the_answer_with_the_reward_function():
    def reward_fn(task, response):
        correct = response == task["ground_truth"]
        return RewardOutput(reward=float(correct), is_correct=correct)

    generator = ScriptedGenerator(["4", "5"])
    tasks = [
        {"prompt": "2+2=", "ground_truth": "4"},
        {"prompt": [{"role": "user", "content": "3+3="}], "ground_truth": "6"},
    ]
    overrides = {"data.max_response_length": 7}
    right, wrong = engine(generator=generator, reward_fn=reward_fn, overrides=overrides).run(tasks)
    assert (right.reward, right.is_correct, wrong.reward, wrong.is_correct) == (1.0, True, 0.0, False)
    assert right.prompt_ids == ids("2+2=") and wrong.prompt_ids == ids("3+3=")
    assert right.response_ids == ids("4") + [EOS] and right.response_mask == [1, 1]
    assert generator.calls[0][1] == 7
    assert right.termination_reason == TerminationReason.ENV_DONE


def test_single_turn_needs_a_reward_function():
    with pytest.raises(ValueError, match="reward"):
        engine()


# -- the real tiny model ---------------------------------------------------------------------------


def test_real_tiny_model_batches_every_turn_and_masks_env_text():
    model = build_tiny_model(TOKENIZER, layers=2, hidden_size=64, seed=0)
    generator = HFBatchGenerator(model, TOKENIZER, seed=0)
    env = make_env("Env", threaded=True)
    overrides = {"rllm.agent.max_tokens_per_turn": 6, "rllm.agent.max_steps": 3}
    config = Config.build(overrides)
    spec = AgentSpec(agent_class=ChatAgent, env_class=env).validate()
    episodes = EpisodeRunner(spec, generator, TOKENIZER, config).run([{"turns": 3}] * 4, n=2)

    assert generator.batch_sizes == [8, 8, 8]  # one batched generation per turn for all episodes
    for episode in episodes:
        assert episode.termination_reason == TerminationReason.ENV_DONE
        assert episode.prompt_ids == ids("Q:")
        assert len(episode.response_ids) == len(episode.response_mask) == len(episode.response_logprobs)
        assert masked_text(episode, 0) == "1?2?"
        model_logprobs = [lp for lp, m in zip(episode.response_logprobs, episode.response_mask) if m]
        assert all(lp < 0 for lp in model_logprobs)
        assert episode.metrics["response_length"] == len(model_logprobs) <= 18


# -- metrics ---------------------------------------------------------------------------------------


def test_summarize_episodes():
    def episode(reward, correct, reason, turns, model_tokens, seconds):
        return Episode(
            trajectories=[Trajectory(reward=reward)],
            is_correct=correct,
            termination_reason=reason,
            response_mask=[0, 0] + [1] * model_tokens,
            metrics={"turns": turns, "episode_time": seconds},
        )

    summary = summarize_episodes(
        [
            episode(1.0, True, TerminationReason.ENV_DONE, 2, 4, 1.0),
            episode(0.0, False, TerminationReason.ERROR, 1, 0, 3.0),
            episode(3.0, True, TerminationReason.ENV_DONE, 3, 8, 2.0),
            episode(0.0, False, TerminationReason.TIMEOUT, 4, 4, 6.0),
        ]
    )
    assert summary["reward"] == 1.0
    assert summary["reward_std"] == pytest.approx((1.0 + 0.0 + 4.0 + 1.0) ** 0.5 / 2)  # population std
    assert summary["solve_rate"] == 0.5
    assert summary["turns"] == 2.5
    assert summary["response_length"] == 4.0
    assert summary["episode_time"] == 3.0
    assert summary["termination/env_done"] == 0.5
    assert summary["termination/error"] == summary["error_rate"] == 0.25
    assert summary["termination/timeout"] == 0.25
    assert summary["termination/max_turns"] == summary["termination/max_prompt_length"] == 0.0
    assert summary["termination/max_response_length"] == 0.0
    assert summarize_episodes([])["reward"] == 0.0


def test_reward_components_are_reported_as_their_means():
    """What a reward returned beside its total (``RewardOutput.metadata``): each numeric component's
    mean over the episodes that have it, for the platform's reward-health monitors."""
    def episode(components):
        found = Episode(trajectories=[Trajectory(reward=1.0)])
        if components is not None:
            found.info["reward_components"] = components
        return found

    summary = summarize_episodes([episode({"format": 1.0, "accuracy": 0.0, "note": "ok"}),
                                  episode({"format": 0.5, "flag": True, "bad": float("nan")}), episode(None)])
    components = {key: value for key, value in summary.items() if key.startswith("reward_components/")}
    assert components == {"reward_components/format": 0.75, "reward_components/accuracy": 0.0}


# -- rLLM's CumulativeWorkflow and SingleTurnWorkflow ---------------------------------------------------


def rllm_env() -> type[CounterEnv]:
    """CounterEnv as rLLM's workflows build it: ``env_cls(**env_args)``, then ``reset(task)``."""

    def __init__(self, task=None):
        CounterEnv.__init__(self, task or {})

    def reset(self, task=None):
        self.task, self.turn = task or self.task, 0
        return CounterEnv.reset(self)

    def step(self, action):  # rLLM's workflows hand over the Action; its environments unwrap it
        assert isinstance(action, Action)
        return CounterEnv.step(self, action.action)

    return make_env("RllmEnv", __init__=__init__, reset=reset, step=step)


def cumulative_engine(generator, max_response_length: int, max_steps: int = 5) -> EpisodeRunner:
    from training import CumulativeWorkflow

    args = {"agent_cls": ChatAgent, "env_cls": rllm_env(), "max_steps": max_steps}
    config = Config.build({"rllm.agent.max_tokens_per_turn": 10, "data.max_response_length": max_response_length})
    spec = AgentSpec(workflow_class=CumulativeWorkflow, workflow_args=args).validate()
    return EpisodeRunner(spec, generator, TOKENIZER, config)


def test_cumulative_workflow_shares_one_response_budget_over_its_turns():
    """Each turn may use only what is left of data.max_response_length after the conversation's
    growth (replies and observations) since the first prompt."""
    generator = ScriptedGenerator(default="ok")  # the rendered conversation grows by "ok" and "<n>?" a turn
    [episode] = cumulative_engine(generator, max_response_length=12).run([{"turns": 0}])
    assert [limit for _, limit in generator.calls] == [10, 8, 4]  # min(10, 12), 12-4, 12-2*4, then none left
    assert episode.termination_reason == TerminationReason.MAX_RESPONSE_LENGTH
    [trajectory] = episode.trajectories
    assert [step.reward for step in trajectory.steps][:2] == [1.0, 1.0]
    assert episode.prompt_ids == ids("Q:") and trajectory.info["num_steps"] == len(trajectory.steps) == 3


def test_cumulative_workflow_ends_when_the_env_is_done_or_after_max_steps():
    [done] = cumulative_engine(ScriptedGenerator(), 100).run([{"turns": 2}])
    assert done.termination_reason == TerminationReason.ENV_DONE and done.reward == 2.0
    assert done.response_ids == ids("ok") + [EOS] + ids("1?") + ids("ok") + [EOS]  # one growing sequence
    [capped] = cumulative_engine(ScriptedGenerator(), 100, max_steps=3).run([{"turns": 0}])
    assert capped.termination_reason == TerminationReason.MAX_TURNS and len(capped.trajectories[0].steps) == 3


def test_single_turn_workflow_hands_the_env_the_action_and_ends_env_done():
    from training import SingleTurnWorkflow

    args = {"agent_cls": ChatAgent, "env_cls": rllm_env()}
    spec = AgentSpec(workflow_class=SingleTurnWorkflow, workflow_args=args).validate()
    [episode] = EpisodeRunner(spec, ScriptedGenerator(["no"]), TOKENIZER, Config.build({})).run([{"turns": 1}])
    assert episode.termination_reason == TerminationReason.ENV_DONE
    [step] = episode.trajectories[0].steps
    assert step.response_ids == ids("no") + [EOS] and step.model_output.content == "no"
    assert episode.reward == 0.0  # "no" is not "ok"
