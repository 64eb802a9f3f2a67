"""Rewards given as a file path (the module's one function, or the one with a conventional name)
and in TRL's batch form ``fn(completions, prompts, **kwargs) -> list[float]``."""

from __future__ import annotations

import textwrap

import pytest

from training import AgentTrainer
from training.rewards import load_reward


def reward_file(tmp_path, source: str, name: str = "score.py") -> str:
    path = tmp_path / "reward" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return str(path)


@pytest.mark.parametrize("source, chosen", [
    ("def helper(x):\n    return x\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n", "compute_score"),
    ("def normalize(x):\n    return x\ndef gaia_reward_func(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n", "gaia_reward_func"),
    ("from os.path import join\ndef exact(task, response):\n    return 1.0\n", "exact"),  # imported functions do not count
    ("def reward(completions, prompts, **kwargs):\n    return [1.0] * len(completions)\ndef reward_fn(task, response):\n    return 0.0\n", "reward_fn"),
])
def test_a_reward_file_alone_names_its_function(tmp_path, source, chosen):
    reward = load_reward(reward_file(tmp_path, source))
    assert reward.name == chosen
    assert reward({"ground_truth": "x", "prompt": "p"}, "x").reward == (0.0 if chosen == "reward_fn" else 1.0)


def test_a_reward_file_with_its_function_named_still_works(tmp_path):
    path = reward_file(tmp_path, "def a(task, response):\n    return 0.5\ndef b(task, response):\n    return 1.0\n")
    assert load_reward(f"{path}:b")({}, "").reward == 1.0


@pytest.mark.parametrize("source, message", [
    ("X = 1\n", "defines no function to use as the reward"),
    ("def first(task, response):\n    return 1.0\ndef second(task, response):\n    return 0.0\n",
     "defines 2 functions (first, second) and none is the reward by name"),
    ("def a_reward_func(task, response):\n    return 1.0\ndef b_reward_func(task, response):\n    return 0.0\n",
     "defines 2 functions (a_reward_func, b_reward_func)"),
    ("raise RuntimeError('broken on import')\n", "raised RuntimeError('broken on import')"),
])
def test_a_reward_file_without_one_clear_function_is_refused(tmp_path, source, message):
    path = reward_file(tmp_path, source)
    with pytest.raises(ValueError) as error:
        AgentTrainer(train_dataset=[{"prompt": "x", "ground_truth": "x"}], reward_func=path, run_path=str(tmp_path),
                     train_engine_name="trl")
    assert message in str(error.value) and path in str(error.value)


def test_a_missing_reward_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"reward/none\.py does not exist"):
        load_reward(str(tmp_path / "reward" / "none.py"))


def test_trls_batch_form_is_called_as_trl_calls_it():
    calls = []

    def batch(completions, prompts, **kwargs):
        calls.append((completions, prompts, kwargs))
        return [float(c == a) for c, a in zip(completions, kwargs["ground_truth"])]

    reward = load_reward(batch)
    assert reward.style == "trl"
    tasks = [{"prompt": "p1", "ground_truth": "a", "level": 1}, {"prompt": "p2", "ground_truth": "b", "level": 2}]
    scored = reward.score_batch(tasks, ["a", "x"])
    assert [s.reward for s in scored] == [1.0, 0.0] and [s.is_correct for s in scored] == [True, False]
    assert calls == [(["a", "x"], ["p1", "p2"], {"ground_truth": ["a", "b"], "level": [1, 2]})]  # one call for the batch


def test_chat_prompts_get_chat_completions_and_named_parameters_only():
    seen = {}

    def batch(completions, answer):  # no **kwargs: only the columns it names are passed
        seen.update(completions=completions, answer=answer)
        return [1.0]

    task = {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4", "level": 3}
    assert load_reward(batch)(task, "4").reward == 1.0
    assert seen == {"completions": [[{"role": "assistant", "content": "4"}]], "answer": ["4"]}


@pytest.mark.parametrize("returned, message", [
    (lambda n: [1.0] * (n + 1), "must return a list with one reward per completion: 1 completion(s), got [1.0, 1.0]"),
    (lambda n: 1.0, "must return a list with one reward per completion"),
    (lambda n: [None] * n, "returned None (NoneType)"),
])
def test_a_batch_reward_that_returns_the_wrong_thing_is_refused_at_construction(tmp_path, returned, message):
    def batch(completions, prompts, **kwargs):
        return returned(len(completions))

    with pytest.raises(ValueError) as error:
        AgentTrainer(train_dataset=[{"prompt": "x"}], reward_func=batch, run_path=str(tmp_path), train_engine_name="trl")
    assert message in str(error.value)


def test_a_batch_reward_trains_single_turn_with_one_call_per_generation(tmp_path, sink):
    sizes = []

    def batch(completions, prompts, **kwargs):
        sizes.append(len(completions))
        return [1.0 if c.startswith("a") else 0.0 for c in completions]

    result = AgentTrainer(
        train_dataset=[{"prompt": p} for p in "wxyz"], reward_func=batch, run_path=str(tmp_path), sinks=[sink],
        train_engine_name="trl",
        config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 4,
                "data.max_response_length": 2, "trainer.total_training_steps": 2, "trainer.logger": []},
    ).train()
    assert result.steps == 2
    assert sizes == [1, 16, 16]  # the construction probe, then one call per step with every completion
    assert all(0.0 <= m["reward"] <= 1.0 for m in sink.metrics)


def test_a_batch_reward_that_raises_mid_training_is_named_with_its_rows_and_step(tmp_path):
    from training.rollouts.outcomes import RewardFailed

    def batch(completions, prompts, **kwargs):
        if len(completions) > 1:
            raise KeyError("solution")
        return [0.0]

    trainer = AgentTrainer(
        train_dataset=[{"prompt": p} for p in "wxyz"], reward_func=batch, run_path=str(tmp_path), train_engine_name="trl",
        config={"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
                "data.max_response_length": 2, "trainer.total_training_steps": 2, "trainer.logger": []},
    )
    with pytest.raises(RewardFailed, match=r"reward function batch raised KeyError: 'solution' on the batch of rows \[\d, \d\] of train_dataset in step 1"):
        trainer.train()
