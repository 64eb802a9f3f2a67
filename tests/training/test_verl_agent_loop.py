"""Our verl agent loop, driven by a stand-in for verl's server manager.

``ScriptedServer`` stands in for verl's ``LLMServerClient`` in front of vLLM, which cannot run
on this CPU machine: it answers ``generate(request_id, prompt_ids=..., sampling_params=...)``
with scripted token ids, the way vLLM replicas answer through verl. The loop itself is built the
lightest way verl allows: ``AgentLoopBase.__init__`` with a composed verl config (not validated),
the character tokenizer and no processor; no Ray.
"""

import asyncio

import pytest
from omegaconf import OmegaConf

from training.agents.base import BaseAgent, BaseEnv
from training.agents.workflow import Workflow

from training.agents.spec import AgentSpec
from training.backends.verl.backend import AGENT_LOOP_NAME, compose_verl_config, encode_object, task_to_verl_row
from training.config import Config
from training.rollouts.tiny import build_char_tokenizer
from training.types import Action, Episode, Step, Trajectory

verl_agent_loop = pytest.importorskip("training.backends.verl.agent_loop")
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


class ScriptedServer:
    """Stands in for verl's server manager (vLLM cannot run here): each call returns the next
    scripted reply as token ids, ending with EOS, with log-probs of -0.5."""

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        reply = ids(self.replies.pop(0)) + [EOS]
        reply = reply[: sampling_params["max_tokens"]]
        # As vLLM answers: log-probabilities only when asked for (verl's ``calculate_log_probs``).
        logprobs = [-0.5] * len(reply) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=reply, log_probs=logprobs, stop_reason="completed")


class GuessEnv(BaseEnv):
    """Says 'go>'; answers 'no>' until the action equals the target; reward 1 when it does."""

    def __init__(self, target: str, fail: bool = False, delay: float = 0.0):
        self.target, self.fail, self.delay = target, fail, delay

    def reset(self):
        return "go>", {}

    def step(self, action):
        if self.fail:
            raise RuntimeError("environment broke")
        if self.delay:
            import time

            time.sleep(self.delay)
        done = action == self.target
        return ("yes>" if done else "no>"), (1.0 if done else 0.0), done, {"is_correct": done}

    @staticmethod
    def from_dict(info):
        return GuessEnv(info["target"], info.get("fail", False), info.get("delay", 0.0))


class EchoAgent(BaseAgent):
    def __init__(self):
        self.reset()

    def reset(self):
        self._trajectory, self.messages = Trajectory(), []

    @property
    def chat_completions(self):
        return self.messages

    @property
    def trajectory(self):
        return self._trajectory

    def update_from_env(self, observation, reward, done, info, **kwargs):
        if self._trajectory.steps:
            self._trajectory.steps[-1].reward, self._trajectory.steps[-1].done = reward, done
        self.messages.append({"role": "user", "content": observation})

    def update_from_model(self, response, **kwargs):
        self.messages.append({"role": "assistant", "content": response})
        self._trajectory.steps.append(Step(model_response=response))
        return Action(response)


class TwoCallWorkflow(Workflow):
    async def run(self, task, uid, **kwargs):
        first = await self.model.chat([{"role": "user", "content": "q>"}])
        second = await self.model.chat(
            [{"role": "user", "content": "q>"}, {"role": "assistant", "content": first.text}, {"role": "user", "content": "again>"}]
        )
        reward = 1.0 if second.text == task["target"] else 0.0
        return Episode(trajectories=[Trajectory(steps=list(self.model.steps), reward=reward)], is_correct=reward == 1.0)


@pytest.fixture(scope="module")
def base_verl_config():
    config = Config.build({"actor_rollout_ref.model.path": "tiny-char"})
    return compose_verl_config(config, agent_kind="agent_env", agent_payload="unset", validate=False)


def run_loop(base_verl_config, spec: AgentSpec, task: dict, replies: list[str], reward_fn=None, sampling=None,
             **overrides):
    """One episode of ``task`` through AgentTrainerLoop.run, as verl's AgentLoopWorker would call it."""
    config = Config.build({"actor_rollout_ref.model.path": "tiny-char", **overrides})
    verl = OmegaConf.create(OmegaConf.to_container(base_verl_config))
    verl.agent_trainer.payload = encode_object({"spec": spec.validate(), "reward_fn": reward_fn, "config": config})
    verl.data.max_prompt_length = config.data.max_prompt_length
    verl.data.max_response_length = config.data.max_response_length
    server = ScriptedServer(replies)
    loop = verl_agent_loop.AgentTrainerLoop(
        trainer_config=DictConfigWrap(verl),
        server_manager=server,
        tokenizer=TOKENIZER,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(verl.data),
    )
    row = task_to_verl_row(task, 3, split="train", agent_name=AGENT_LOOP_NAME)
    output = asyncio.run(loop.run({**SAMPLING, **(sampling or {})}, raw_prompt=row["prompt"], **row))
    return output, server


AGENT_ENV = AgentSpec(agent_class=EchoAgent, env_class=GuessEnv)


def test_loop_is_registered_with_verl():
    assert _agent_loop_registry[AGENT_LOOP_NAME] == {"_target_": "training.backends.verl.agent_loop.AgentTrainerLoop"}


def test_turns_masks_and_reward_until_env_done(base_verl_config):
    output, server = run_loop(base_verl_config, AGENT_ENV, {"target": "b"}, ["a", "b"])

    assert output.prompt_ids == ids("go>")
    # model "a</s>" (1) | environment "no>" (0) | model "b</s>" (1)
    assert output.response_ids == ids("a") + [EOS] + ids("no>") + ids("b") + [EOS]
    assert output.response_mask == [1, 1, 0, 0, 0, 1, 1]
    assert output.response_logprobs == [-0.5, -0.5, 0.0, 0.0, 0.0, -0.5, -0.5]
    assert output.reward_score == 1.0
    assert output.num_turns == 2
    assert output.extra_fields["termination_reason"] == "env_done"
    assert output.extra_fields["turn_scores"] == [0.0, 1.0]
    extra = dict(output.extra_fields["reward_extra_info"])
    assert isinstance(extra.pop("episode_record"), str)  # the episode store's record (test_verl_episodes)
    assert extra == {"acc": 1.0, "termination_reason": "env_done", "error": "", "traceback": ""}
    # Tokens in, tokens out: the second call continues from the episode's own ids, on one sticky request id.
    assert server.calls[1]["prompt_ids"] == output.prompt_ids + output.response_ids[:5]
    assert server.calls[0]["request_id"] == server.calls[1]["request_id"]
    assert server.calls[0]["sampling_params"]["max_tokens"] == 64 and server.calls[0]["sampling_params"]["logprobs"]


def test_max_turns(base_verl_config):
    output, server = run_loop(base_verl_config, AGENT_ENV, {"target": "z"}, ["a", "b", "c"], **{"rllm.agent.max_steps": 2})

    assert len(server.calls) == 2
    assert output.extra_fields["termination_reason"] == "max_turns"
    assert output.reward_score == 0.0
    assert output.response_mask == [1, 1, 0, 0, 0, 1, 1]


def test_max_response_length(base_verl_config):
    output, _ = run_loop(base_verl_config, AGENT_ENV, {"target": "z"}, ["a", "b", "c"], **{"data.max_response_length": 6})

    # "a</s>" + "no>" fill 5 of 6; the second reply is cut to the one token left, then the budget is spent.
    assert output.extra_fields["termination_reason"] == "max_response_length"
    assert len(output.response_ids) == 6
    assert output.response_mask == [1, 1, 0, 0, 0, 1]


def test_env_error_ends_the_episode_with_reward_zero(base_verl_config):
    output, _ = run_loop(base_verl_config, AGENT_ENV, {"target": "a", "fail": True}, ["a"])

    assert output.extra_fields["termination_reason"] == "error"
    assert output.reward_score == 0.0
    assert output.response_ids == ids("a") + [EOS]  # the tokens gathered before the error are kept
    # verl's rollout dump carries the error to the driver, which checks each step's error rate.
    dumped = output.extra_fields["reward_extra_info"]
    assert dumped["termination_reason"] == "error" and dumped["error"] == "RuntimeError: environment broke"
    assert dumped["traceback"].rstrip().endswith("RuntimeError: environment broke")


def test_a_reward_that_raises_stops_the_run_naming_the_reward_and_the_row(base_verl_config):
    from training.rollouts.outcomes import RewardFailed
    from training.rewards import load_reward

    def strict(task, response):
        raise ValueError("no answer field")

    spec = AgentSpec(agent_run_func=lambda task, model: None)  # no reward of its own: reward_fn scores it
    with pytest.raises(RewardFailed, match=r"reward function strict raised ValueError: no answer field on row 3 of train_dataset"):
        run_loop(base_verl_config, spec, {"target": "a"}, ["a"], reward_fn=load_reward(strict))


def test_timeout(base_verl_config):
    output, _ = run_loop(
        base_verl_config, AGENT_ENV, {"target": "a", "delay": 0.5}, ["a"], **{"rllm.agent.trajectory_timeout": 0.1}
    )

    assert output.extra_fields["termination_reason"] == "timeout"
    assert output.reward_score == 0.0


def test_too_long_prompt_gives_a_masked_placeholder(base_verl_config):
    output, server = run_loop(base_verl_config, AGENT_ENV, {"target": "a"}, ["a"], **{"data.max_prompt_length": 2})

    assert server.calls == []
    assert output.extra_fields["termination_reason"] == "max_prompt_length"
    assert output.prompt_ids == [EOS] and output.response_ids == [EOS] and output.response_mask == [0]
    assert output.reward_score == 0.0


def test_workflow_tokens_come_from_its_model_calls(base_verl_config):
    spec = AgentSpec(workflow_class=TwoCallWorkflow)
    output, server = run_loop(base_verl_config, spec, {"target": "y"}, ["x", "y"])

    assert output.prompt_ids == ids("q>")
    # reply "x</s>"; the second prompt re-renders "q>x" + "again>" (EOS dropped by the plain rendering).
    assert output.response_ids == ids("x") + [EOS] + ids("again>") + ids("y") + [EOS]
    assert output.response_mask == [1, 1] + [0] * len("again>") + [1, 1]
    assert output.reward_score == 1.0
    assert output.extra_fields["termination_reason"] == "env_done"


# -- episodes of several sequences: verl takes one sample per episode ------------------------------


def test_rllm_solver_judge_episode_stops_the_run_naming_verl_and_the_workflow(base_verl_config):
    """rLLM's own solver-judge workflow (two solvers and a judge, three conversations): verl's agent
    loop can return one sample per episode, so the run stops, naming the backend and the workflow,
    instead of training the first solver alone."""
    import sys
    from pathlib import Path

    from training.errors import MultiSequenceEpisode

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    from rllm_solver_judge_flow import SolverJudgeWorkflow

    def reward(task, action):
        from training import RewardOutput

        return RewardOutput(reward=float(action == "<answer>3</answer>"), is_correct=action == "<answer>3</answer>")

    spec = AgentSpec(workflow_class=SolverJudgeWorkflow, workflow_args={"n_solutions": 2, "reward_function": reward})
    with pytest.raises(MultiSequenceEpisode) as raised:
        run_loop(base_verl_config, spec, {"question": "1+2"}, ["<answer>3</answer>", "<answer>4</answer>", "<answer>1</answer>"])
    message = str(raised.value)
    assert message.startswith("backend verl: an episode of workflow rllm_solver_judge_flow.SolverJudgeWorkflow has 3 sequences")
    assert "trajectories: solver, solver, judge" in message and "backend=trl" in message


def test_the_layout_verl_uses_refuses_any_episode_of_several_sequences():
    """``single_sequence`` is what the loop calls before ``episode_to_output``: one conversation
    passes (continued calls included); two conversations in one trajectory are refused too."""
    from training.algorithms.episode_rows import single_sequence
    from training.errors import MultiSequenceEpisode

    config = Config.build({"actor_rollout_ref.model.path": "tiny-char"})

    def step(prompt: str, reply: str) -> Step:
        return Step(prompt_ids=ids(prompt), response_ids=ids(reply), logprobs=[-0.5] * len(reply))

    one = Episode(trajectories=[Trajectory(steps=[step("q>", "x"), step("q>xagain>", "y")])])
    single_sequence(one, config, "verl", "workflow W")  # one conversation: nothing raised
    output = verl_agent_loop.episode_to_output(_with_tokens(one), 64, EOS)
    assert output.response_mask == [1] + [0] * len("again>") + [1]

    two = Episode(trajectories=[Trajectory(name="agent", steps=[step("q>", "x"), step("new>", "y")])])
    with pytest.raises(MultiSequenceEpisode, match=r"backend verl: an episode of workflow W has 2 sequences to train \(trajectories: agent, agent\)"):
        single_sequence(two, config, "verl", "workflow W")


def _with_tokens(episode: Episode) -> Episode:
    """The episode's token view as the rollout engine fills it (first prompt, then continuations)."""
    first, second = episode.trajectories[0].steps
    episode.prompt_ids = list(first.prompt_ids)
    extension = second.prompt_ids[len(first.prompt_ids) + len(first.response_ids):]
    episode.response_ids = first.response_ids + extension + second.response_ids
    episode.response_mask = [1] * len(first.response_ids) + [0] * len(extension) + [1] * len(second.response_ids)
    episode.response_logprobs = [-0.5] * len(episode.response_ids)
    return episode
