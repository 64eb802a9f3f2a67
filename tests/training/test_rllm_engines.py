"""rLLM's inference-only engines (``AgentExecutionEngine``, ``AgentWorkflowEngine``, ``OpenAIEngine``,
``compute_pass_at_k``) run rLLM's evaluation scripts against a real local OpenAI-compatible server.

The server is the trainer's own chat endpoint (``training.rollouts.chat_endpoint.ChatEndpoint``) serving a tiny
model through one session, whose base URL is an ordinary OpenAI base URL: the real ``openai``
client talks HTTP to it, and every call it answers is recorded, so the tests can check that each
result came from the server. rLLM's ``run_*.py`` scripts are in ``tests/fixtures`` with only their
imports changed; their ``__main__`` blocks load Qwen's tokenizer from the hub and name a server on
``localhost:30000``, neither of which exists here, so each test does what that block does with
the tiny model's tokenizer and this server's address in their place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from training import (
    AgentExecutionEngine,
    AgentWorkflowEngine,
    Episode,
    OpenAIEngine,
    TerminationEvent,
    TerminationReason,
    Trajectory,
    Workflow,
    compute_pass_at_k,
)
from training.data import DatasetRegistry
from training.rollouts.generation import HFBatchGenerator, ModelClient
from training.errors import ModelCallError
from training.rewards import countdown_reward_fn
from training.rollouts.chat_endpoint import ChatEndpoint
from training.rollouts.tiny import build_char_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import rllm_run_frozenlake_agent as frozenlake_script  # noqa: E402
import rllm_run_solver_judge_flow as solver_judge_script  # noqa: E402
from rllm_frozenlake_agent import FrozenLakeAgent  # noqa: E402
from rllm_frozenlake_env import FrozenLakeEnv  # noqa: E402
from rllm_solver_judge_flow import SolverJudgeWorkflow  # noqa: E402
from warm_start import warm_tiny_model  # noqa: E402


@pytest.fixture(autouse=True)
def own_dataset_registry(monkeypatch):
    """The splits these tests register under rLLM's names (frozenlake, countdown) are gone after each test."""
    monkeypatch.setattr(DatasetRegistry, "_splits", dict(DatasetRegistry._splits))


@contextlib.contextmanager
def served(model_dir: str, max_tokens: int, temperature: float, top_p: float):
    """``model_dir`` behind an OpenAI-compatible base URL; yields it and the client that records
    every call served (its ``steps``). Replies stop at ``max_tokens`` tokens, as a server's limit.
    The endpoint samples as it was started (a request's temperature and top_p are not applied)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = HFBatchGenerator(model, tokenizer, temperature=temperature, top_p=top_p, seed=0)
    client = ModelClient(generator, tokenizer, max_tokens_per_turn=max_tokens)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with ChatEndpoint(model_name="tiny-warm", tokenizer=tokenizer) as endpoint, endpoint.session(client, loop) as session:
            yield session.base_url, client
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


# -- compute_pass_at_k and Dataset.repeat ---------------------------------------------------------------


def test_compute_pass_at_k_against_a_hand_computation(capsys):
    def result(task, reward):
        return Trajectory(task=task, reward=reward)

    a, b, c = {"q": "a", "n": [1, 2]}, {"q": "b"}, "task c"
    results = [result(a, 1.0), result(a, 0.0), result(a, 0.0), result(a, 0.0),  # 1 of 4 right
               result(b, 0.0), result(b, 0.0),                                   # none right
               result(c, 0.5), result(c, 1.0)]                                   # reward > 0 counts
    # By hand: 3 distinct tasks; pass@1 = 3 right / 8 results; pass@k = 2 of 3 tasks solved at least once.
    summary = compute_pass_at_k(results)
    assert summary == {"total_problems": 3, "pass@1": 3 / 8, "pass@k": 2 / 3}
    assert capsys.readouterr().out.splitlines() == [
        "Total unique problems: 3", f"Average Pass@1 Accuracy: {3 / 8}", f"Average Pass@k Accuracy: {2 / 3}",
    ]
    # Episodes count by their reward too; a task dict's key order does not split it in two.
    episodes = [Episode(task={"n": [1, 2], "q": "a"}, trajectories=[Trajectory(reward=r)]) for r in (0.0, 1.0)]
    assert compute_pass_at_k(episodes) == {"total_problems": 1, "pass@1": 0.5, "pass@k": 1.0}
    with pytest.raises(ValueError, match="no results"):
        compute_pass_at_k([])


def test_registry_datasets_repeat_rows_next_to_each_other_as_rllm():
    DatasetRegistry.register_dataset("engines_demo", [{"q": "a"}, {"q": "b"}], "test")
    dataset = DatasetRegistry.load_dataset("engines_demo", "test")
    assert dataset.repeat(n=3).get_data() == [{"q": "a"}] * 3 + [{"q": "b"}] * 3
    assert dataset.get_data() == [{"q": "a"}, {"q": "b"}]
    with pytest.raises(ValueError, match="n must be positive"):
        dataset.repeat(0)


# -- FrozenLake: examples/frozenlake/run_frozenlake_agent.py -------------------------------------------

# 2x2 maps whose goal is right below the start: ```Down``` wins at once.
FROZENLAKE_TASKS = [{"size": 2, "p": 0.8, "seed": seed, "is_slippery": False} for seed in (0, 1, 2, 9)]
MOVES = ("Left", "Down", "Right", "Up")


def frozenlake_pairs(agent_args: dict, env_args: dict) -> list[tuple[list[dict], str]]:
    """The agent's first prompt of each map answered with every move in rLLM's format: a model
    warmed on them writes fenced moves with no preference, so some episodes reach the goal at once
    and others walk on (later, longer prompts were left out: warming on them costs minutes here)."""
    pairs = []
    for task in FROZENLAKE_TASKS:
        env, agent = FrozenLakeEnv.from_dict({**task, **env_args}), FrozenLakeAgent(**agent_args)
        observation, info = env.reset()
        agent.update_from_env(observation, 0.0, False, info)
        pairs += [(list(agent.chat_completions), f"```{move}```") for move in MOVES]
    return pairs


@pytest.mark.slow
def test_run_frozenlake_agent_script_scores_each_task_from_the_server(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # What the script's __main__ block sets, verbatim.
    agent_args = {"max_steps": 10, "use_accumulate_history": True}
    env_args = {"max_steps": 8, "is_slippery": False}
    sampling_params = {"temperature": 0.6, "top_p": 0.95, "model": "tiny-warm"}  # model: was Qwen/Qwen3-4B
    model = warm_tiny_model(tmp_path / "warm", frozenlake_pairs(agent_args, env_args), steps=30)
    # rLLM's prepare_frozenlake_data registers the test split; each map twice, so pass@k has k = 2.
    DatasetRegistry.register_dataset("frozenlake", [t for t in FROZENLAKE_TASKS for _ in range(2)], "test")

    with served(model, max_tokens=12, temperature=0.6, top_p=0.95) as (base_url, server):
        engine = AgentExecutionEngine(
            agent_class=FrozenLakeAgent,
            env_class=FrozenLakeEnv,
            agent_args=agent_args,
            env_args=env_args,
            engine_name="openai",
            tokenizer=build_char_tokenizer(),  # was AutoTokenizer.from_pretrained("Qwen/Qwen3-4B")
            sampling_params=sampling_params,
            rollout_engine_args={"base_url": base_url, "api_key": "None"},  # was http://localhost:30000/v1
            max_response_length=16384,
            max_prompt_length=4096,
            n_parallel_agents=256,
        )
        tasks = frozenlake_script.load_frozenlake_data()
        results = asyncio.run(engine.execute_tasks(tasks))
        capsys.readouterr()
        summary = compute_pass_at_k(results)
        served_replies = [step.model_response for step in server.steps]

    assert len(results) == len(tasks) == 8
    steps = [step for trajectory in results for step in trajectory.steps]
    # Every turn is one call the server answered: the replies the agents read are the server's.
    assert len(served_replies) == len(steps) and sorted(served_replies) == sorted(s.model_response for s in steps)
    assert any("```" in reply for reply in served_replies), served_replies
    for task, trajectory in zip(tasks, results):
        assert trajectory.task == task
        assert 1 <= len(trajectory.steps) <= env_args["max_steps"]
        # The reward is what rLLM's environment gives for these moves: replayed on a fresh one.
        env = FrozenLakeEnv.from_dict({**task, **env_args})
        env.reset()
        answers = [env.step(step.action) for step in trajectory.steps]
        replayed = [reward for _, reward, _, _ in answers]
        assert [step.reward for step in trajectory.steps] == replayed
        # Each step records the environment's answer to its action (the episode viewer shows it).
        assert [step.next_observation for step in trajectory.steps] == [observation for observation, _, _, _ in answers]
        assert trajectory.reward == sum(replayed)
        assert trajectory.info["termination_reason"] in {"ENV_DONE", "MAX_STEPS"}
        assert (trajectory.info["termination_reason"] == "ENV_DONE") == bool(trajectory.steps[-1].done)
    # pass@k by hand from the per-task results.
    by_task: dict[str, list[float]] = {}
    for trajectory in results:
        by_task.setdefault(json.dumps(trajectory.task, sort_keys=True), []).append(trajectory.reward)
    expected_pass_1 = sum(r > 0 for rewards in by_task.values() for r in rewards) / len(results)
    expected_pass_k = sum(any(r > 0 for r in rewards) for rewards in by_task.values()) / len(by_task)
    assert summary == {"total_problems": 4, "pass@1": expected_pass_1, "pass@k": expected_pass_k}


# -- solver-judge: examples/solver_judge/run_solver_judge_flow.py -----------------------------------------

COUNTDOWN = [{"question": f"Using the numbers {nums}, create an equation that equals {target}.", "target": target, "nums": nums}
             for nums, target in (([1, 2], 3), ([2, 2], 4), ([3, 1], 4))]


def solver_pairs() -> list[tuple[list[dict], str]]:
    """Solver prompts answered right (a+b) and wrong (a*b, a-b). (The judge's prompt is ~850
    characters: warming on it costs minutes here, so the judge answers unwarmed.)"""
    pairs = []
    for row in COUNTDOWN:
        a, b = row["nums"]
        solver = [{"role": "user", "content": f"{row['question']}. Output the final answer within <answer>...</answer>"}]
        pairs += [(solver, f"<answer>{a}{op}{b}</answer>") for op in "+*-"]
    return pairs


@pytest.mark.slow
def test_run_solver_judge_flow_script_scores_each_episode_from_the_server(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the script writes logs/solver_judge_countdown.json
    model = warm_tiny_model(tmp_path / "warm", solver_pairs(), steps=40)
    DatasetRegistry.register_dataset("countdown", COUNTDOWN, "test")

    with served(model, max_tokens=24, temperature=0.6, top_p=0.95) as (base_url, server):
        # The script's __main__ block, with the tiny model's tokenizer and this server's address.
        rollout_engine = OpenAIEngine(
            model="tiny-warm",
            tokenizer=build_char_tokenizer(),
            max_prompt_length=2048,
            max_response_length=1024,
            base_url=base_url,
            api_key="None",
            sampling_params={"temperature": 0.6, "top_p": 0.95},
        )
        engine = AgentWorkflowEngine(
            workflow_cls=SolverJudgeWorkflow,
            workflow_args={"n_solutions": 2, "reward_function": countdown_reward_fn},
            rollout_engine=rollout_engine,
            config=None,
            n_parallel_tasks=128,
            retry_limit=1,
        )
        tasks = solver_judge_script.load_data(n=2)
        results = asyncio.run(engine.execute_tasks(tasks))
        capsys.readouterr()
        solver_judge_script.evaluate_results(results)
        printed = capsys.readouterr().out.splitlines()
        served_replies = sorted(step.model_response for step in server.steps)
        os.makedirs("logs", exist_ok=True)  # the script's last lines
        with open("logs/solver_judge_countdown.json", "w") as f:
            json.dump([episode.to_dict() for episode in results], f, indent=4)

    assert len(results) == len(tasks) == 6
    assert [e.task for e in results] == tasks  # grouped by task, in the order given
    # Three calls per episode (two solvers and a judge), each one the server answered.
    assert served_replies == sorted(t.steps[0].model_output.text for e in results for t in e.trajectories)
    for episode in results:
        assert episode.termination_reason != TerminationReason.ERROR, episode.info.get("error")
        assert [t.name for t in episode.trajectories] == ["solver", "solver", "judge"]
        for trajectory in episode.trajectories:
            step = trajectory.steps[0]
            assert step.model_output.completion_ids and step.model_output.prompt_ids  # the server's token ids
            assert step.reward == countdown_reward_fn(episode.task, step.action).reward
        judge = episode.trajectories[-1].steps[0]
        assert episode.is_correct == countdown_reward_fn(episode.task, judge.action).is_correct
    assert any(t.steps[0].action.startswith("<answer>") for e in results for t in e.trajectories[:2])
    # pass@1 and pass@k by hand, as the script defines them (episode.is_correct, grouped by question).
    by_question: dict[str, list[bool]] = {}
    for episode in results:
        by_question.setdefault(episode.task["question"], []).append(episode.is_correct)
    assert printed == [
        "Total unique problems: 3",
        f"Average Pass@1 Accuracy: {sum(e.is_correct for e in results) / 6}",
        f"Average Pass@2 Accuracy: {sum(any(v) for v in by_question.values()) / 3}",
    ]
    assert len(json.loads(Path("logs/solver_judge_countdown.json").read_text())) == 6


# -- errors ---------------------------------------------------------------------------------------------


class FailingWorkflow(Workflow):
    attempts = 0

    async def run(self, task, uid, **kwargs):
        FailingWorkflow.attempts += 1
        raise RuntimeError(f"broken on {task['q']}")


def test_a_failing_workflow_is_retried_then_raised_or_kept():
    engine = AgentWorkflowEngine(FailingWorkflow, {}, rollout_engine=None, n_parallel_tasks=2, retry_limit=3)
    with pytest.raises(RuntimeError, match=r"failed permanently after 3 attempt\(s\): RuntimeError: broken on x"):
        asyncio.run(engine.execute_tasks([{"q": "x"}]))
    FailingWorkflow.attempts = 0
    engine = AgentWorkflowEngine(FailingWorkflow, {}, rollout_engine=None, retry_limit=2, raise_on_error=False)
    [episode] = asyncio.run(engine.execute_tasks([{"q": "y"}]))
    assert FailingWorkflow.attempts == 2 and episode.info["attempts"] == 2
    assert episode.termination_reason == TerminationReason.ERROR and episode.task == {"q": "y"}


def test_openai_engine_names_an_unreachable_server_and_enforces_the_prompt_length():
    closed = socket.socket()  # bound, never listening: connections are refused
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    dead = OpenAIEngine(model="m", base_url=f"http://127.0.0.1:{port}/v1", api_retries=0)
    with pytest.raises(ModelCallError, match=f"server at http://127.0.0.1:{port}/v1 failed"):
        asyncio.run(dead.get_model_response([{"role": "user", "content": "hi"}]))
    short = OpenAIEngine(model="m", tokenizer=build_char_tokenizer(), max_prompt_length=5, base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(TerminationEvent) as event:
        asyncio.run(short.get_model_response([{"role": "user", "content": "longer than five"}]))
    assert event.value.reason == TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED
    closed.close()


def test_engines_other_than_openai_are_refused_by_name():
    with pytest.raises(ValueError, match=r"engine_name='verl'.*only 'openai'.*AgentTrainer\(...\).evaluate\(\)"):
        AgentExecutionEngine(engine_name="verl", agent_class=FrozenLakeAgent, env_class=FrozenLakeEnv)
    with pytest.raises(TypeError, match="env_class must be a BaseEnv subclass"):
        AgentExecutionEngine(agent_class=FrozenLakeAgent, env_class=dict)
