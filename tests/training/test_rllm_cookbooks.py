"""rLLM's main-branch AgentFlow cookbooks train here with only their import lines changed.

The fixtures tests/fixtures/rllm_cookbook_*.py are rLLM's cookbooks/math, cookbooks/solver_judge_flow
and cookbooks/frozenlake (flow, evaluator and train.py), copied with only their imports changed.
Their ``train.py`` is a hydra ``main`` whose ``config_path="pkg://rllm.trainer.config"`` names rLLM's
package, which is not here: hydra's ``main`` passes a given config straight through, so each test
calls ``main(config)`` with a hydra ``DictConfig`` built from the overrides of the cookbook's
``train_tinker.sh`` (hydra's ``rllm/backend=X`` group choice is what sets ``rllm.backend: X``), then
the test's own: the tiny model, small batches, the trl backend.

A randomly initialised character model never writes the cookbooks' answer formats
(``\\boxed{7}``, ``<answer>7</answer>``), so the training tests first warm the tiny model up on
them, every allowed answer alike (``warm_start.py``); RL then has to find the rewarded one. The
learning is read from the policy itself without sampling (the log-probability of the rewarded
answer before and after training): sampled rewards of a few steps are too noisy to assert on.
The solver-judge and FrozenLake flows are also run with a scripted model (exact tokens).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from training.data import DatasetRegistry
from training.compat.rllm.evaluators import extract_answer, grade_math_answer
from training.rollouts.tiny import build_char_tokenizer
from training.types import Episode, Step, Task, Trajectory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from warm_start import NO_CHECKPOINTING, answer_logprob, sampled_accuracy, warm_tiny_model  # noqa: E402

TOKENIZER = build_char_tokenizer()

# The overrides of rLLM's cookbooks/<name>/train_tinker.sh (main branch), less model.lora_rank
# (Tinker's LoRA rank) and the "ui" logger (rLLM's web UI): what the tests start from.
TRAIN_TINKER_SH = {
    "math": ["rllm/backend=tinker", "model.name=Qwen/Qwen3-4B-Instruct-2507", "training.group_size=8",
             "data.train_batch_size=32", "data.val_batch_size=500", "data.max_prompt_length=4096",
             "data.max_response_length=4096", "rllm.rollout.train.temperature=0.6", "rllm.rollout.val.temperature=0.6",
             "rllm.trainer.total_epochs=1", "rllm.trainer.test_freq=10", "rllm.trainer.project_name=math",
             "rllm.trainer.experiment_name=qwen3-4b-instruct"],
    "solver_judge": ["rllm/backend=tinker", "model.name=Qwen/Qwen3-4B-Instruct-2507", "training.group_size=4",
                     "data.train_batch_size=32", "data.val_batch_size=256", "data.max_prompt_length=4096",
                     "data.max_response_length=1024", "rllm.trainer.total_epochs=1", "rllm.trainer.test_freq=10",
                     "rllm.trainer.project_name=solver_judge", "rllm.trainer.experiment_name=qwen3-4b-instruct"],
    "frozenlake": ["rllm/backend=tinker", "model.name=Qwen/Qwen3-4B-Instruct-2507", "training.group_size=8",
                   "data.train_batch_size=32", "data.val_batch_size=100", "data.max_prompt_length=4096",
                   "data.max_response_length=2048", "rllm.trainer.total_epochs=1", "rllm.trainer.test_freq=10",
                   "rllm.trainer.project_name=frozenlake", "rllm.trainer.experiment_name=qwen3-4b-instruct"],
}


def hydra_config(cookbook: str, *overrides: str):
    """The cookbook's overrides then ours ("$@" in its script), as hydra composes them: later wins."""
    ours = (*(f"{key}={str(value).lower()}" for key, value in NO_CHECKPOINTING.items()), *overrides)
    items = [item.replace("rllm/backend=", "rllm.backend=", 1) for item in (*TRAIN_TINKER_SH[cookbook], *ours)]
    return OmegaConf.from_dotlist(items)


@pytest.fixture(autouse=True)
def own_dataset_registry(monkeypatch):
    monkeypatch.setattr(DatasetRegistry, "_splits", dict(DatasetRegistry._splits))


def read_run(run: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """The training steps' metrics, every metrics record (validation included) and the episodes."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    return [m for m in records if "reward" in m], records, episodes


def assert_weights_changed(before: str, run: Path) -> None:
    warm = AutoModelForCausalLM.from_pretrained(before).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    assert sum(not torch.equal(warm[name], trained[name]) for name in warm) > len(warm) // 2


# -- cookbooks/math ---------------------------------------------------------------------------------


def test_math_cookbooks_evaluator_grades_as_rllms_own_cookbook_tests_say():
    """The cases of rLLM's cookbooks/math/test.py, through our ``evaluate_math``."""
    from rllm_cookbook_math_eval import math_evaluator

    def episode(answer: str) -> Episode:
        return Episode(trajectories=[Trajectory(name="math", steps=[Step()])], artifacts={"answer": answer})

    def grade(truth, answer):
        return math_evaluator.evaluate({} if truth is None else {"ground_truth": truth}, episode(answer))

    assert (grade("42", "After simplifying, \\boxed{42}.").reward, grade("42", "\\boxed{41}.").reward) == (1.0, 0.0)
    no_box = grade("42", "The answer is 42.")
    assert not no_box.is_correct and no_box.metadata == {"reason": "no_answer_extracted"}
    assert grade("5", "First I thought \\boxed{4}, but actually \\boxed{5}.").is_correct
    assert grade("\\frac{1}{2}", "\\boxed{0.5}").is_correct and not grade("\\frac{1}{2}", "\\boxed{0.6}").is_correct
    assert grade(None, "\\boxed{99}").metadata == {"reason": "no_ground_truth"}
    as_task = Task(id="t1", instruction="", metadata={"ground_truth": "7"}, dataset_dir=Path("."))
    assert math_evaluator.evaluate(as_task, episode("\\boxed{7}")).is_correct


MATH_QUESTIONS = ["3+4=", "2+5=", "1+6=", "9-2="]


def train_math(directory: Path, seed: int = 0, steps: int = 5, extra: tuple[str, ...] = ()) -> dict:
    """cookbooks/math's train.py on the tiny model warmed up from ``seed`` (which also seeds the
    trainer), in ``directory``: the rewarded answer's log-probability before and after, the per-step
    metrics, every metrics record, the episodes and the run folder. bench/learning_seeds.py
    (``--recipe math``) runs this same recipe over many seeds.

    Four answers warmed alike, one rewarded (a quarter of the samples right at the start), at lr
    5e-4: with ten answers at lr 1e-3 the policy broke on a fresh install (reward 0.09 -> 0, the
    answer's log-probability -2.39 -> -16.1). Also returned: the share of answers sampled at the
    recipe's temperature (0.6) that the evaluator's rule grades right, before and after."""
    from rllm_cookbook_math_flow import SYSTEM_PROMPT
    from rllm_cookbook_math_train import main

    prompts = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}] for q in MATH_QUESTIONS]
    model = warm_tiny_model(directory / "warm", [(p, f"\\boxed{{{d}}}") for p in prompts for d in (3, 5, 7, 9)],
                            steps=100, context=24, seed=seed)
    DatasetRegistry.register_dataset("hendrycks_math", [{"question": q, "ground_truth": "7"} for q in MATH_QUESTIONS], "train")
    DatasetRegistry.register_dataset("math500", [{"problem": q, "ground_truth": "7", "data_source": "math500"} for q in MATH_QUESTIONS[:2]], "test")
    with contextlib.chdir(directory):  # train.py trains into AgentTrainer's default run_path, ./runs
        main(hydra_config(
            "math", "rllm/backend=trl", f"model.name={model}", "data.train_batch_size=4", "data.val_batch_size=2",
            "data.max_prompt_length=1024", "data.max_response_length=12", "rllm.trainer.logger=[jsonl]",
            "rllm.trainer.total_epochs=100", "actor_rollout_ref.actor.optim.lr=5e-4", "rllm.agent.max_tokens_per_turn=12",
            "rllm.agent.trajectory_timeout=1800", f"trainer.total_training_steps={steps}", f"trainer.seed={seed}", *extra,
        ))
    run = directory / "runs"
    warm, trained = (AutoModelForCausalLM.from_pretrained(path) for path in (model, run / "final_model"))
    before, after = (answer_logprob(m, prompts, "\\boxed{7}") for m in (warm, trained))
    right = lambda reply: grade_math_answer(extract_answer(reply) or "", "7")  # noqa: E731  the cookbook's evaluator's rule
    # cookbooks/math's train.sh samples at temperature 0.6 (rllm.rollout.train.temperature)
    accuracy_before, accuracy_after = (sampled_accuracy(m, prompts, right, seed=seed, temperature=0.6) for m in (warm, trained))
    metrics, records, episodes = read_run(run)
    return {"before": before, "after": after, "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
            "metrics": metrics, "records": records, "episodes": episodes, "model": model, "run": run}


@pytest.mark.slow
def test_math_cookbook_trains_unchanged_and_learns(tmp_path):
    """cookbooks/math: math_flow asks once through AsyncOpenAI(base_url=config.base_url), the
    evaluator grades the last \\boxed{} of episode.artifacts["answer"]; every answer is 7. The recipe
    learns on every seed of bench/learning_seeds.py --recipe math (bench/results/math_seeds.json)."""
    trained = train_math(tmp_path)
    metrics, records, episodes, run = trained["metrics"], trained["records"], trained["episodes"], trained["run"]
    assert len(metrics) == 5 and all(m["termination/error"] == m["termination/timeout"] == 0.0 for m in metrics), metrics
    assert any("val/math500/reward" in r for r in records)  # val_dataset through the flow and evaluator too
    assert all("accuracy" in m for m in metrics)  # the evaluator's signal, averaged per step
    for episode in episodes:  # one trainable call per episode: the flow's step holds its tokens
        [step] = episode["trajectories"][0]["steps"]
        assert episode["trajectories"][0]["name"] == "math" and step["response_ids"]
        assert episode["prompt_ids"] == step["prompt_ids"] and episode["response_ids"] == step["response_ids"]
        assert len(step["logprobs"]) == len(step["response_ids"]) and episode["artifacts"]["answer"] == step["model_response"]
    # What the reward measures, at the recipe's temperature: the share of sampled answers graded right
    # rises (by 0.22-0.42 over seeds 0-9, bench/results/math_seeds.json). The log-probability of the
    # one string "\\boxed{7}" at temperature 1 is no measure here: it fell on seed 6 while that
    # policy answered right most often of all (0.27 -> 0.68).
    before, after = trained["accuracy_before"], trained["accuracy_after"]
    assert after > before + 0.15, (before, after, [m["reward"] for m in metrics])
    assert_weights_changed(trained["model"], run)


# -- cookbooks/solver_judge_flow ---------------------------------------------------------------------


def test_countdown_compute_score_scores_as_rllms():
    """rLLM's rules: the last <answer> must use each given number exactly once and reach the target
    (score 1); a well-formed answer that does not: format_score 0.1; no answer: 0."""
    from training.compat.rllm.evaluators import countdown_compute_score as compute_score

    truth = {"target": 17, "numbers": [7, 3, 4]}
    assert compute_score("<answer>7*3-4</answer>", truth) == 1.0
    assert compute_score("<answer>1</answer> then <answer>(7-4)*3+4+4</answer>", truth) == 0.1  # 4 used twice
    assert compute_score("<answer>7+3+4</answer>", truth) == 0.1  # reaches 14
    assert compute_score("<answer>7*3-4; import os</answer>", truth) == 0.1  # not arithmetic
    assert compute_score("Assistant: 7*3-4", truth) == 0
    assert compute_score("<answer>7*3-4</answer>", truth, format_score=0.0, score=2.0) == 2.0



COUNTDOWN = [{"target": 7, "nums": [7]}, {"target": 7, "nums": [7], "data_source": "countdown"}]


def test_solver_judge_cookbook_scores_each_trajectory_through_the_endpoint():
    """cookbooks/solver_judge_flow's flow and evaluator, run by the episode runner with a scripted
    model: two solver calls in parallel and a judge call, three trajectories, each step with its
    own call's tokens, each trajectory scored by the evaluator with countdown's compute_score."""
    from rllm_cookbook_solver_judge_eval import solver_judge_countdown_evaluator
    from rllm_cookbook_solver_judge_flow import solver_judge_flow
    from test_episode_runner import EOS, ScriptedGenerator, ids

    from training.agents.spec import AgentSpec
    from training.config import Config
    from training.rollouts.episode_runner import EpisodeRunner
    from training.types import TerminationReason

    config = Config.build({"rllm.agent.max_tokens_per_turn": 24, "data.max_prompt_length": 4096, "rllm.agent.retries": 0})
    spec = AgentSpec(agent_flow=solver_judge_flow, evaluator=solver_judge_countdown_evaluator).validate()

    def play(replies: list[str]):
        [episode] = EpisodeRunner(spec, ScriptedGenerator(replies), TOKENIZER, config).run([COUNTDOWN[0]])
        assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
        return episode

    right = play(["<answer>7</answer>", "so <answer>7</answer>", "<answer>2</answer>"])
    assert [t.name for t in right.trajectories] == ["solver", "solver", "judge"]
    assert [t.reward for t in right.trajectories] == [1.0, 1.0, 1.0] and right.is_correct
    assert right.artifacts == {"answer": "<answer>7</answer>"}  # the judge chose solution 2, parsed
    assert (right.metrics["solver_acc"], right.metrics["judge_acc"]) == (1.0, 1.0)
    for trajectory in right.trajectories:
        [step] = trajectory.steps
        assert step.response_ids == ids(step.model_response) + [EOS] and len(step.logprobs) == len(step.response_ids)
    wrong = play(["<answer>3</answer>", "none", "<answer>1</answer>"])  # 3 misuses the numbers; no answer
    assert [t.reward for t in wrong.trajectories] == [0.0, 0.0, 0.0] and not wrong.is_correct
    assert wrong.metrics["solver_acc"] == 0.0


def test_async_clients_a_flow_leaves_open_are_closed_on_their_own_loop(caplog):
    """The cookbooks' flows make an ``AsyncOpenAI`` client per episode and never close it; the
    client closes itself on whatever loop runs when it is collected. Batches of episodes share one
    loop (``run_on_episode_loop``), so a client of batch 1 collected while batch 2 runs closes its
    own sockets; with a loop per batch that logged "Task exception was never retrieved ...
    RuntimeError: Event loop is closed" in every trained cookbook run."""
    import gc
    import logging

    from rllm_cookbook_solver_judge_eval import solver_judge_countdown_evaluator
    from rllm_cookbook_solver_judge_flow import solver_judge_flow
    from test_episode_runner import ScriptedGenerator

    from training.agents.flow import rollout
    from training.agents.spec import AgentSpec
    from training.config import Config
    from training.rollouts.episode_runner import EpisodeRunner, close_episode_loop

    @rollout(name="solver-judge-collecting")
    async def flow_collecting_garbage(task, config):
        gc.collect()  # what the interpreter may do at any moment of a later batch
        return await solver_judge_flow.arun(task, config)

    config = Config.build({"rllm.agent.max_tokens_per_turn": 24, "data.max_prompt_length": 4096, "rllm.agent.retries": 0})
    spec = AgentSpec(agent_flow=flow_collecting_garbage, evaluator=solver_judge_countdown_evaluator).validate()
    replies = ["<answer>7</answer>", "<answer>7</answer>", "<answer>1</answer>"]
    caplog.set_level(logging.ERROR, logger="asyncio")
    try:
        for _ in range(3):  # three batches, as three training steps
            [episode] = EpisodeRunner(spec, ScriptedGenerator(list(replies)), TOKENIZER, config).run([COUNTDOWN[0]])
            assert episode.is_correct, episode.error
    finally:
        close_episode_loop()
    gc.collect()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


SOLVER_JUDGE_STEPS = 5


def train_solver_judge(directory: Path, seed: int = 0, steps: int = SOLVER_JUDGE_STEPS, extra: tuple[str, ...] = ()) -> dict:
    """cookbooks/solver_judge_flow's train.py on the tiny model warmed up from ``seed`` (which also
    seeds the trainer's sampling), in ``directory``: the rewarded solver answer's log-probability
    before and after, the per-step metrics and the run folder. bench/learning_seeds.py runs this
    same recipe over many seeds; ``extra`` (hydra overrides) is how it tries others."""
    from rllm_cookbook_solver_judge_flow import _create_judge_prompt, _format_countdown_problem
    from rllm_cookbook_solver_judge_train import main

    problem = _format_countdown_problem(Task(id="0", instruction="", metadata=COUNTDOWN[0]))
    solver_prompt = [{"role": "user", "content": f"{problem}. Output the final answer within <answer>...</answer>"}]
    # Four answers warmed alike, one rewarded: a quarter of the solvers' samples are right at the
    # start, enough signal in 5 steps of 16 episodes (with ten answers, one in ten, the move of the
    # policy in CI ranged from +0.25 to +1.0). At lr 1e-3 one seed in three broke the policy in its
    # first step (reward 0.56 -> 0, the answer's log-probability -1.59 -> -6.96, as on a fresh install
    # once); 5e-4 learns on every seed of bench/learning_seeds.py.
    pairs = [(solver_prompt, f"<answer>{d}</answer>") for d in (3, 5, 7, 9)]
    for solutions in (["<answer>7</answer>", "<answer>3</answer>"], ["No solution found", "<answer>7</answer>"]):
        judge = [{"role": "user", "content": _create_judge_prompt(problem, solutions)}]
        pairs += [(judge, "<answer>1</answer>"), (judge, "<answer>2</answer>")]
    model = warm_tiny_model(directory / "warm", pairs, steps=80, seed=seed)
    DatasetRegistry.register_dataset("countdown", COUNTDOWN, "train")
    DatasetRegistry.register_dataset("countdown", COUNTDOWN[:1], "test")
    with contextlib.chdir(directory):  # train.py writes its run under ./runs, as rLLM's does
        main(hydra_config(
            "solver_judge", "rllm/backend=trl", f"model.name={model}", "training.group_size=8", "data.train_batch_size=2",
            "data.val_batch_size=1", "data.max_prompt_length=2048", "data.max_response_length=24", "rllm.trainer.logger=[jsonl]",
            "rllm.trainer.total_epochs=100", "actor_rollout_ref.actor.optim.lr=5e-4", "rllm.agent.max_tokens_per_turn=22",
            "rllm.agent.trajectory_timeout=1800", f"trainer.total_training_steps={steps}", f"trainer.seed={seed}", *extra,
        ))
    run = directory / "runs"
    warm, trained = (AutoModelForCausalLM.from_pretrained(path) for path in (model, run / "final_model"))
    before, after = (answer_logprob(m, [solver_prompt], "<answer>7</answer>") for m in (warm, trained))
    metrics, _, episodes = read_run(run)
    return {"before": before, "after": after, "metrics": metrics, "episodes": episodes, "model": model, "run": run}


@pytest.mark.slow
def test_solver_judge_cookbook_trains_unchanged_and_learns(tmp_path):
    """cookbooks/solver_judge_flow trained: two solvers in parallel and a judge, each its own call
    and trajectory; the evaluator scores each trajectory with countdown's compute_score (1 only for
    an answer that uses the number 7 once and reaches 7). The recipe learns on every seed of
    bench/learning_seeds.py (bench/results/solver_judge_seeds.json)."""
    trained = train_solver_judge(tmp_path)
    metrics, episodes, run = trained["metrics"], trained["episodes"], trained["run"]
    assert len(metrics) == SOLVER_JUDGE_STEPS, metrics
    assert all(m["termination/error"] == m["termination/timeout"] == 0.0 for m in metrics), metrics
    assert all(m["rows"] == 3 * 16 for m in metrics)  # both solvers and the judge trained, each its own row
    assert all("solver_acc" in m and "judge_acc" in m for m in metrics)  # the evaluator's signals
    for episode in episodes:
        assert [t["name"] for t in episode["trajectories"]] == ["solver", "solver", "judge"]
        for trajectory in episode["trajectories"]:
            [step] = trajectory["steps"]
            assert len(step["logprobs"]) == len(step["response_ids"]) > 0
    before, after = trained["before"], trained["after"]
    assert after > before + 0.3, (before, after, [m["reward"] for m in metrics])
    assert_weights_changed(trained["model"], run)


# -- cookbooks/frozenlake -----------------------------------------------------------------------------


def one_move_wins(seed: int, size: int = 2) -> str | None:
    """The move that takes the agent from S straight to G on the cookbook's map for ``seed``, if any."""
    from rllm_cookbook_frozenlake_flow import generate_random_map

    desc = generate_random_map(size=size, p=1.0, seed=seed)
    (sr, sc), (gr, gc) = ([(r, row.index(ch)) for r, row in enumerate(desc) if ch in row][0] for ch in "SG")
    moves = {(1, 0): "Down", (-1, 0): "Up", (0, 1): "Right", (0, -1): "Left"}
    return moves.get((gr - sr, gc - sc))


def test_frozenlake_cookbook_plays_the_lake_through_the_endpoint_and_is_scored_by_its_evaluator():
    """cookbooks/frozenlake's flow and evaluator, run by the episode runner with a scripted model
    (``ScriptedGenerator``, exact tokens): the flow drives gymnasium's FrozenLake turn by turn
    through the endpoint, answers without an action get its retry message (trained as context,
    mask 0), and the evaluator turns ``artifacts["won"]`` into the reward. (Its train.py trains the
    tiny model in test_rllm_frozenlake_learning.py.)"""
    from rllm_cookbook_frozenlake_eval import frozenlake_evaluator
    from rllm_cookbook_frozenlake_flow import frozenlake_flow
    from test_episode_runner import EOS, ScriptedGenerator, ids

    from training.agents.spec import AgentSpec
    from training.config import Config
    from training.rollouts.episode_runner import EpisodeRunner
    from training.types import TerminationReason

    seed = next(s for s in range(40) if one_move_wins(s))
    win = one_move_wins(seed)
    wall = {"Up": "Down", "Down": "Up", "Left": "Right", "Right": "Left"}[win]  # 2x2: the way back is a wall
    task = {"seed": seed, "size": 2, "p": 1.0, "is_slippery": False, "max_steps": 3}
    config = Config.build({"rllm.agent.max_tokens_per_turn": 16, "data.max_prompt_length": 4096,
                           "data.max_response_length": 1024, "rllm.agent.retries": 0})
    spec = AgentSpec(agent_flow=frozenlake_flow, evaluator=frozenlake_evaluator).validate()

    def play(replies: list[str]):
        [episode] = EpisodeRunner(spec, ScriptedGenerator(replies, default=f"```{wall}```"), TOKENIZER, config).run([task])
        assert episode.termination_reason == TerminationReason.ENV_DONE, episode.error
        return episode

    won = play(["no move yet", f"I go ```{win}```"])
    [trajectory] = won.trajectories
    assert trajectory.name == "frozenlake" and [s.model_response for s in trajectory.steps] == ["no move yet", f"I go ```{win}```"]
    assert trajectory.reward == 1.0 and won.is_correct and won.artifacts == {"won": True, "turns": 2, "last_action": win}
    assert won.metrics["accuracy"] == 1.0 and won.metrics["turns"] == 2.0
    assert [s.response_ids for s in trajectory.steps] == [ids("no move yet") + [EOS], ids(f"I go ```{win}```") + [EOS]]
    # One conversation: the second call's prompt extends the first's, the flow's retry message masked out.
    model_tokens = sum(len(s.response_ids) for s in trajectory.steps)
    assert sum(won.response_mask) == model_tokens and 0 in won.response_mask
    assert won.prompt_ids == trajectory.steps[0].prompt_ids

    lost = play([])  # walks into the wall every turn
    assert [s.action for s in lost.trajectories[0].steps] == [wall] * 3
    assert lost.reward == 0.0 and not lost.is_correct and lost.metrics["accuracy"] == 0.0
