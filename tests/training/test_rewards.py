import os

import numpy as np
import pytest

from training.rewards import registry
from training.rewards import RewardFunction, builtin_rewards, load_reward, register_reward
from training.types import RewardOutput

TASK = {"question": "1+1?", "ground_truth": "2"}


# --- signatures -----------------------------------------------------------------------------


def test_rllm_signature_gets_task_and_response():
    seen = []

    def reward(task_info, action):
        seen.append((task_info, action))
        return RewardOutput(0.5, True, {"k": 1})

    output = RewardFunction(reward)(TASK, "two")
    assert seen == [(TASK, "two")]
    assert output == RewardOutput(0.5, True, {"k": 1})


def test_verl_signature_gets_data_source_ground_truth_and_task():
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 1.0

    fn = RewardFunction(compute_score)
    assert fn.style == "verl"
    fn(TASK, "2")
    fn({**TASK, "data_source": "gsm8k"}, "3")
    assert seen[0] == ("default", "2", "2", TASK)
    assert seen[1][0] == "gsm8k" and seen[1][1] == "3"


def test_verl_signature_with_optional_arguments_like_verls_default_compute_score():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return {"score": float(solution_str == ground_truth), "acc": True}

    fn = RewardFunction(compute_score)
    assert fn.style == "verl"
    output = fn(TASK, "2")
    assert output.reward == 1.0 and output.is_correct and output.metadata == {"acc": True}


def test_verl_signature_reads_answer_key():
    fn = load_reward(lambda data_source, solution_str, ground_truth, extra_info: ground_truth == "x", answer_key="answer")
    assert fn({"answer": "x"}, "").reward == 1.0


def test_verl_signature_missing_answer_column_says_how_to_fix():
    fn = load_reward("exact_match", answer_key="answer")
    with pytest.raises(ValueError, match=r"'answer'.*question, ground_truth.*data.answer_key"):
        fn(TASK, "2")


def test_callable_object_is_named_after_its_class():
    class Scorer:
        def __call__(self, task_info, action):
            return 0.0

    fn = RewardFunction(Scorer())
    assert fn.style == "rllm" and fn.name == "Scorer"


def test_unsupported_signature_is_refused():
    def three(a, b, c):
        return 0.0

    with pytest.raises(ValueError, match=r"three has signature \(a, b, c\).*task_info, action.*solution_str"):
        RewardFunction(three)


# --- return values --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.25, RewardOutput(0.25, False)),
        (1, RewardOutput(1.0, True)),
        (True, RewardOutput(1.0, True)),
        (False, RewardOutput(0.0, False)),
        (np.float32(0.5), RewardOutput(0.5, False)),
        ({"reward": 0.3, "is_correct": True, "note": "x"}, RewardOutput(0.3, True, {"note": "x"})),
        ({"score": 1.0, "pred": "2"}, RewardOutput(1.0, True, {"pred": "2"})),
        ({"score": 0.0}, RewardOutput(0.0, False)),
    ],
)
def test_return_values_are_normalized(value, expected):
    assert RewardFunction(lambda task_info, action: value)(TASK, "") == expected


@pytest.mark.parametrize("value", [None, "1.0", [1.0], {"value": 1.0}, {"score": "high"}, float("nan")])
def test_bad_return_value_names_the_function(value):
    def my_reward(task_info, action):
        return value

    with pytest.raises(ValueError, match="reward function my_reward returned"):
        RewardFunction(my_reward)(TASK, "")


def test_user_exceptions_propagate_from_call():
    def broken(task_info, action):
        raise KeyError("target")

    with pytest.raises(KeyError):
        RewardFunction(broken)(TASK, "")


# --- probe ----------------------------------------------------------------------------------


def test_probe_passes_for_a_working_function():
    assert RewardFunction(lambda task_info, action: float(action == "")).probe(TASK) is None


def test_probe_reports_an_exception_with_the_row():
    def needs_target(task_info, action):
        return float(task_info["target"])

    with pytest.raises(ValueError, match=r"reward function needs_target raised KeyError\('target'\) on the first row.*1\+1\?.*Fix"):
        RewardFunction(needs_target).probe(TASK)


def test_probe_reports_a_bad_return_value():
    def says_yes(task_info, action):
        return "yes"

    with pytest.raises(ValueError, match=r"reward function says_yes raised .*returned 'yes'.*Fix"):
        RewardFunction(says_yes).probe(TASK)


# --- load_reward ----------------------------------------------------------------------------


def test_load_reward_none_and_passthrough():
    fn = RewardFunction(lambda task_info, action: 0.0)
    assert load_reward(None) is None
    assert load_reward(fn) is fn


def test_load_reward_builtin_by_name():
    fn = load_reward("exact_match")
    assert fn.name == "exact_match"
    assert fn(TASK, " 2\n").reward == 1.0


def test_load_reward_dotted_path():
    fn = load_reward("training.rewards.char_accuracy")
    assert fn.name == "char_accuracy" and fn(TASK, "2").is_correct


def test_load_reward_file_path(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text("def score(task_info, action):\n    return {'reward': len(action)}\n")
    fn = load_reward(f"{path}:score")
    assert fn.name == "score" and fn(TASK, "abc").reward == 3.0


def test_load_reward_unknown_name_lists_builtins():
    with pytest.raises(ValueError, match=r"unknown reward 'exact'.*char_accuracy, code, countdown, exact_match, f1, math, search"):
        load_reward("exact")


def test_load_reward_unimportable_path_names_it_and_lists_builtins():
    with pytest.raises(ValueError, match=r"no_such_pkg\.fn.*Built-in rewards are char_accuracy"):
        load_reward("no_such_pkg.fn")
    with pytest.raises(ValueError, match=r"missing\.py does not exist"):
        load_reward("missing.py:fn")


def test_load_reward_not_callable():
    with pytest.raises(ValueError, match=r"'os\.sep' is a str, not a callable"):
        load_reward("os.sep")
    with pytest.raises(ValueError, match="not int"):
        load_reward(3)


# --- registry -------------------------------------------------------------------------------


def test_register_reward_refuses_duplicates(monkeypatch):
    monkeypatch.setattr(registry, "_REWARDS", dict(registry._REWARDS))

    @register_reward("always_one")
    def always_one(task_info, action):
        return 1.0

    assert "always_one" in builtin_rewards()
    assert load_reward("always_one")(TASK, "").reward == 1.0
    with pytest.raises(ValueError, match="'always_one' is already registered"):
        register_reward("always_one")(lambda task_info, action: 0.0)
    with pytest.raises(ValueError, match="'math' is already registered"):
        register_reward("math")(always_one)


def test_builtin_names():
    assert builtin_rewards() == ["char_accuracy", "code", "countdown", "exact_match", "f1", "math", "search"]


# --- exact_match ----------------------------------------------------------------------------


def test_exact_match():
    fn = load_reward("exact_match", answer_key="answer")
    assert fn({"answer": "Paris"}, "  Paris\n") == RewardOutput(1.0, True)
    assert fn({"answer": "Paris"}, "paris") == RewardOutput(0.0, False)
    assert fn({"answer": 42}, "42").is_correct


# --- math -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, truth, correct",
    [
        ("so the answer is \\boxed{42}.", "42", True),
        ("\\boxed{42} ... wait, 41", "42", True),  # the boxed answer wins over a later number
        ("I think 7 then 12", "12", True),
        ("I think 12 then 7", "12", False),
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{1/3}", "0.3333333", True),
        ("total: 1,000 dollars", "1000", True),
        ("\\boxed{3.0}", "3", True),
        ("\\boxed{-2}", "2", False),
        ("\\boxed{x+1}", "x + 1", True),
        ("\\boxed{x+2}", "x+1", False),
        ("no idea", "5", False),
        ("", "5", False),
        ("\\boxed{72}", "She sold 48 + 24 = 72 clips.\n#### 72", True),
    ],
)
def test_math(response, truth, correct):
    output = load_reward("math")({"ground_truth": truth}, response)
    assert output.is_correct is correct
    assert output.reward == (1.0 if correct else 0.0)


def test_math_records_the_extracted_answer():
    output = load_reward("math")({"ground_truth": "4"}, "\\boxed{\\sqrt{16}}")
    assert output.metadata == {"extracted": "\\sqrt{16}"}
    assert not output.is_correct


# --- countdown ------------------------------------------------------------------------------

COUNTDOWN = {"target": 24, "nums": [4, 6, 2, 3]}


@pytest.mark.parametrize(
    "response, reward",
    [
        ("4*6", 1.0),
        ("<think>try</think><answer>(6 - 2) * (3 + 3)</answer>", 0.0),  # 3 used twice
        ("<answer>(6-2)*6</answer>", 0.0),  # 6 used twice
        ("<answer> (6 / 2 + 3) * 4 </answer>", 1.0),
        ("<answer>6/4</answer> <answer>6*4</answer>", 1.0),  # the last answer counts
        ("<answer>6*3</answer>", 0.1),
        ("<answer>4 * 6 / (3 - 3)</answer>", 0.0),  # 3 used twice
        ("<answer>4 / (6 - 6)</answer>", 0.0),
        ("<answer>24</answer>", 0.0),  # 24 is not one of the numbers
        ("<answer>4 ** 2</answer>", 0.0),
        ("<answer>-4 * -6</answer>", 0.0),
        ("<answer>4.0 * 6</answer>", 0.0),
        ("<answer>4 * 6 =</answer>", 0.0),
        ("", 0.0),
    ],
)
def test_countdown(response, reward):
    output = load_reward("countdown")(COUNTDOWN, response)
    assert output.reward == reward
    assert output.is_correct is (reward == 1.0)


def test_countdown_division_is_exact():
    # 8 / 3 * 3 is 8 exactly; floats would give 7.999...
    assert load_reward("countdown")({"target": 8, "nums": [8, 3, 3]}, "8 / 3 * 3").reward == 1.0


def test_countdown_never_runs_code(tmp_path):
    marker = tmp_path / "ran"
    fn = load_reward("countdown")
    for response in (
        "__import__('os')",
        f"<answer>__import__('os').system('touch {marker}')</answer>",
        f"open('{marker}', 'w')",
        "(4).__class__",
    ):
        assert fn(COUNTDOWN, response).reward == 0.0
    assert not os.path.exists(marker)


def test_countdown_survives_deep_expressions():
    assert load_reward("countdown")(COUNTDOWN, "+".join(["4"] * 100_000)).reward == 0.0


# --- char_accuracy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, reward, correct",
    [
        ("abcd", 1.0, True),
        ("abcd\n", 1.0, True),
        ("abxd", 0.75, False),
        ("ab", 0.5, False),
        ("abcdef", 1.0, False),
        ("", 0.0, False),
        ("dcba", 0.0, False),
    ],
)
def test_char_accuracy(response, reward, correct):
    output = load_reward("char_accuracy")({"ground_truth": "abcd"}, response)
    assert output.reward == reward and output.is_correct is correct
