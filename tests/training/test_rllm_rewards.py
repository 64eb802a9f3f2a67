"""rLLM's code_reward_fn, search_reward_fn and f1_reward_fn on real inputs: right, wrong,
malformed, and for code, programs that loop forever, eat memory or fork without end (each run
is a child interpreter in training.isolation.sandbox, the python tool's sandbox)."""

from __future__ import annotations

import json

import pytest

from training.isolation.sandbox import Limits
from training.rewards import code_reward_fn, f1_reward_fn, load_reward, search_reward_fn
from training.types import Action

FAST = Limits(timeout_s=3.0, memory_mb=512)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```"


SUM_TESTS = {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}


def test_code_stdin_program_right_and_wrong():
    right = code_reward_fn({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced("a, b = map(int, input().split())\nprint(a + b)"), FAST)
    assert right.reward == 1.0 and right.is_correct
    assert right.metadata["passed_tests"] == right.metadata["total_tests"] == 2
    wrong = code_reward_fn({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced("a, b = map(int, input().split())\nprint(a * b)"), FAST)
    assert wrong.reward == 0.0 and not wrong.is_correct
    assert wrong.metadata["test_results"][1]["error"] == "not run: an earlier test failed"  # 1*2 != 3 ends it


def test_code_livecodebench_functional_and_stdin_tests_as_json():
    tests = [{"input": "[1, 2, 3]\n2", "output": "[2, 4, 6]", "testtype": "functional", "metadata": {"func_name": "scale"}}]
    task = {"data_source": "livecodebench", "ground_truth": json.dumps(tests)}
    code = "class Solution:\n    def scale(self, nums: List[int], k: int) -> List[int]:\n        return [n * k for n in nums]"
    assert code_reward_fn(task, Action(fenced(code)), FAST).is_correct  # rLLM's Action counts by its text
    assert not code_reward_fn(task, fenced(code.replace("n * k", "n + k")), FAST).is_correct
    stdin = {"data_source": "codeforces", "ground_truth": [{"input": "2\n", "output": "0.5000001"}]}
    assert code_reward_fn(stdin, fenced("print(1 / int(input()))"), FAST).is_correct  # numbers to 1e-6


def test_code_leetcode_and_kodcode_test_programs():
    leetcode = {"data_source": "leetcode", "ground_truth": {"functional": "assert Solution().twice(4) == 8"}}
    good = "class Solution:\n    def twice(self, x: int) -> int:\n        return 2 * x"
    assert code_reward_fn(leetcode, fenced(good), FAST).is_correct
    assert not code_reward_fn(leetcode, fenced(good.replace("2 * x", "x")), FAST).is_correct
    kodcode = {"data_source": "kodcode", "ground_truth": "from solution import twice\n\ndef test_twice():\n    assert twice(3) == 6\n"}
    code = "def twice(x):\n    return 2 * x\n\nif __name__ == '__main__':\n    print(twice(input()))"
    assert code_reward_fn(kodcode, fenced(code), Limits(timeout_s=20)).is_correct


def test_code_malformed_answers_and_tasks():
    task = {"data_source": "taco", "ground_truth": SUM_TESTS}
    for response in ("print(3)", "", "```python\nprint(3)"):  # no closed fenced block: nothing to run
        scored = code_reward_fn(task, response, FAST)
        assert scored.reward == 0.0 and scored.metadata == {"error": "No code found in model response"}
    assert code_reward_fn({"data_source": "taco"}, fenced("print(3)"), FAST).metadata == {"error": "No tests found in task_info"}
    syntax = code_reward_fn(task, fenced("print(("), FAST)
    assert not syntax.is_correct and "SyntaxError" in syntax.metadata["test_results"][0]["error"]
    with pytest.raises(ValueError, match="unknown data_source 'humaneval'"):
        code_reward_fn({"data_source": "humaneval", "ground_truth": SUM_TESTS}, fenced("print(3)"), FAST)
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        code_reward_fn({"data_source": "apps", "ground_truth": {"inputs": ["1", "2"], "outputs": ["1"]}}, fenced("print(1)"), FAST)


@pytest.mark.slow
def test_code_that_never_ends_is_cut_at_the_timeout():
    scored = code_reward_fn({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced("while True:\n    pass"), FAST)
    assert not scored.is_correct and scored.metadata["test_results"][0]["error"] == "timeout"
    sleeper = code_reward_fn({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced("import time\ntime.sleep(3600)"), FAST)
    assert sleeper.metadata["test_results"][0]["error"] == "timeout"  # wall clock, not only CPU time


def test_code_memory_bomb_fails_inside_its_limit():
    scored = code_reward_fn({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced("x = bytearray(8 * 1024 ** 3)\nprint(3)"), FAST)
    assert not scored.is_correct and "MemoryError" in scored.metadata["test_results"][0]["error"]


@pytest.mark.slow
def test_code_endless_output_and_stray_processes_stay_bounded(tmp_path):
    endless = code_reward_fn({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced("while True:\n    print('x' * 10000)"), FAST)
    assert not endless.is_correct  # stopped by the file-size limit or the timeout; the caller kept 1 MiB at most
    assert len(endless.metadata["test_results"][0]["output"]) <= 1000
    marker = tmp_path / "still-running"
    orphan = (f"import os, time\nif os.fork() == 0:\n    time.sleep(5)\n    open({str(marker)!r}, 'w').write('x')\n"
              "    os._exit(0)\nprint(3)")
    code_reward_fn({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced(orphan), FAST)
    import time

    time.sleep(6)  # longer than the forked child would sleep: it was killed with the run's process group
    assert not marker.exists()


def test_code_runs_see_no_platform_secrets(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "s3cret")
    task = {"data_source": "taco", "ground_truth": {"inputs": [""], "outputs": ["None"]}}
    assert code_reward_fn(task, fenced("import os\nprint(os.environ.get('SECRET_KEY'))"), FAST).is_correct


def test_code_reward_is_a_builtin_by_name():
    scored = load_reward("code")({"data_source": "taco", "ground_truth": SUM_TESTS}, fenced("print(sum(map(int, input().split())))"))
    assert scored.is_correct


def test_f1_reward_is_rllms_token_f1():
    assert f1_reward_fn({"ground_truth": "The Eiffel Tower!"}, "eiffel tower").reward == 1.0
    partial = f1_reward_fn({"ground_truth": "Hello, world!"}, Action("hello there world"))
    assert partial.reward == pytest.approx(0.8)  # precision 2/3, recall 1
    assert f1_reward_fn({"ground_truth": "Paris"}, "London").reward == 0.0
    assert f1_reward_fn({"ground_truth": None}, "").reward == 0.0  # both empty: 0, as rLLM
    assert f1_reward_fn({}, "an answer").reward == 0.0


def test_search_reward_extracts_the_answer_then_matches():
    task = {"ground_truth": ["Barack Obama", "Obama"]}
    exact = search_reward_fn(task, "<think>maybe Bush</think>The answer is \\boxed{Barack Obama}.")
    assert exact.reward == 1.0 and exact.is_correct and exact.metadata["exact_match"]
    bold = search_reward_fn({"ground_truth": "Marie Curie"}, "After searching, it was **Pierre Curie** who did it.")
    assert bold.metadata["extracted_answer"] == "Pierre Curie"
    assert bold.is_correct and bold.reward == pytest.approx(0.5)  # F1 0.5 >= 0.3: partial credit
    year = search_reward_fn({"answer": "1969"}, "Apollo 11 landed in July 1969 on the moon")
    assert year.metadata["extracted_answer"] == "July 1969" and year.is_correct
    verdict = search_reward_fn({"ground_truth": "no"}, "\\boxed{yes}")
    assert verdict.reward == 0.0 and not verdict.is_correct  # yes/no must match exactly
    wrong = search_reward_fn({"ground_truth": "Mount Everest"}, "\\boxed{K2}")
    assert wrong.reward == 0.0 and not wrong.is_correct
    missing = search_reward_fn({}, "\\boxed{K2}")
    assert missing.reward == 0.0 and missing.metadata == {"error": "No ground truth provided"}
    assert search_reward_fn({"ground_truth": "x"}, "").metadata["extracted_answer"] == ""
