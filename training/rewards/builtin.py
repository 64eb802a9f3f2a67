"""The built-in rewards, registered by name (``exact_match``, ``math``, ``countdown``,
``char_accuracy``, ``code``, ``search``, ``f1``), and rLLM's reward functions under rLLM's names
(``math_reward_fn``, ``countdown_reward_fn``, ``code_reward_fn``, ``search_reward_fn``,
``f1_reward_fn``). How a reward is loaded and called is in ``training.rewards.registry``.
"""

from __future__ import annotations

import ast
import inspect
import math as _math
import numbers
import operator
import re
from fractions import Fraction
from typing import Any, Callable

from training.types import RewardOutput
from training.rewards.registry import register_reward
from training.isolation.sandbox import Limits, MAX_TIMEOUT_S, run_python


@register_reward("exact_match")
def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict) -> RewardOutput:
    """1.0 when the response, stripped, equals the ground truth, else 0.0."""
    correct = solution_str.strip() == str(ground_truth).strip()
    return RewardOutput(float(correct), correct)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\d?frac\{([^{}]+)\}\{([^{}]+)\}")


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, braces inside it balanced."""
    start = text.rfind("\\boxed{")
    return None if start < 0 else _braced(text, start + len("\\boxed{"))


def _braced(text: str, begin: int) -> str | None:
    """The text from ``begin`` up to the ``}`` that closes an already open ``{`` (None: never closed)."""
    depth = 0
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i]
            depth -= 1
    return None


def _to_number(text: str) -> float | None:
    text = _FRAC.sub(r"(\1)/(\2)", text)
    text = text.replace(",", "").replace("$", "").replace("(", "").replace(")", "").strip()
    try:
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        return None


def extract_math_answer(response: str) -> str | None:
    """The answer of a math response: the last ``\\boxed{...}``, else the last number."""
    boxed = _boxed(response)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


@register_reward("math")
def math_reward(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict) -> RewardOutput:
    """1.0 when the extracted answer equals the ground truth numerically (or as text, if not a number)."""
    answer = extract_math_answer(solution_str)
    truth = str(ground_truth).strip()
    if answer is None:
        return RewardOutput(0.0, False, {"extracted": None})
    expected = _to_number(truth)
    if expected is None:  # a worked solution such as GSM8K's "... #### 72": its last number is the answer
        last = extract_math_answer(truth)
        expected = _to_number(last) if last is not None else None
    got = _to_number(answer)
    if expected is not None and got is not None:
        correct = _math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    else:
        correct = answer.replace(" ", "") == truth.replace(" ", "")
    return RewardOutput(float(correct), correct, {"extracted": answer})


def math_reward_fn(task_info: dict, action: Any) -> RewardOutput:
    """rLLM's ``math_reward_fn(task_info, action)``: ``math`` against the task's ``ground_truth``;
    an ``Action`` counts by its ``action``."""
    return math_reward(task_info.get("data_source", ""), _action_text(action), task_info.get("ground_truth"), task_info)


def _action_text(action: Any) -> str:
    """The text of an answer given as rLLM's ``Action`` (what its workflows hand environments) or as text."""
    return str(getattr(action, "action", action))


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Evaluate + - * / over integer literals, recording each literal; anything else raises ValueError.

    Walking the tree ourselves (never eval) means a response such as ``__import__('os')`` is rejected
    as an unknown node instead of being run.
    """
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        return _OPERATORS[type(node.op)](left, right)  # Fraction / 0 raises ZeroDivisionError
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise ValueError(f"not allowed in a countdown expression: {ast.dump(node)[:80]}")


@register_reward("countdown")
def countdown(task_info: dict, action: str) -> RewardOutput:
    """Countdown: reach ``task["target"]`` with + - * / over ``task["nums"]``, each used at most as often as given.

    1.0 on target; 0.1 for a valid expression (allowed operators, given numbers) that misses; 0.0 otherwise.
    The expression may sit inside ``<answer>...</answer>``; the last such block counts.
    """
    blocks = _ANSWER_TAG.findall(action)
    expression = (blocks[-1] if blocks else action).strip()
    used: list[int] = []
    try:
        value = _evaluate(ast.parse(expression, mode="eval"), used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return RewardOutput(0.0, False, {"expression": expression, "valid": False})
    available = list(task_info["nums"])
    for number in used:
        if number not in available:
            return RewardOutput(0.0, False, {"expression": expression, "valid": False})
        available.remove(number)
    correct = value == task_info["target"]
    return RewardOutput(1.0 if correct else 0.1, correct, {"expression": expression, "valid": True})


def countdown_reward_fn(task_info: dict, action: Any) -> RewardOutput:
    """rLLM's name (``rllm.rewards.countdown_reward``) for ``countdown``; an ``Action`` counts by its ``action``."""
    return countdown(task_info, getattr(action, "action", action))


@register_reward("char_accuracy")
def char_accuracy(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict) -> RewardOutput:
    """Share of the ground truth's positions the response matches: partial credit for copy tasks."""
    truth = str(ground_truth)
    matches = sum(1 for got, want in zip(solution_str, truth) if got == want)
    return RewardOutput(matches / max(len(truth), 1), solution_str.strip() == truth)


# --- rLLM's code, search and F1 rewards -------------------------------------------------------


@register_reward("f1")
def f1_reward_fn(task_info: dict, action: Any) -> RewardOutput:
    """rLLM's ``f1_reward_fn``: token F1 between the answer and ``task["ground_truth"]`` after
    SQuAD's normalisation (lower case, no punctuation, no articles, single spaces); 0 when either is empty."""
    predicted = _normalize_answer(_action_text(action)).split()
    gold = _normalize_answer(str(task_info.get("ground_truth") or "")).split()
    return RewardOutput(reward=_token_f1(predicted, gold)[0], metadata={})


def _normalize_answer(text: str) -> str:
    """SQuAD's / HotpotQA's answer normalisation."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


_PUNCTUATION = frozenset(__import__("string").punctuation)


def _token_f1(predicted: list[str], gold: list[str]) -> tuple[float, float, float]:
    """(F1, precision, recall) of two token lists by their multiset overlap."""
    from collections import Counter

    same = sum((Counter(predicted) & Counter(gold)).values())
    if not predicted or not gold or same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall), precision, recall


# Answers rLLM's search reward treats as verdicts: they must match exactly, never partly.
_VERDICTS = ("yes", "no", "noanswer")
_SEARCH_F1_THRESHOLD = 0.3


@register_reward("search")
def search_reward_fn(task_info: dict, action: Any) -> RewardOutput:
    """rLLM's ``search_reward_fn`` (``RewardSearchFn``): the answer is extracted from the response
    (``extract_search_answer``) and compared with ``task["ground_truth"]`` (or ``"answer"``; one
    string or a list of acceptable ones). An exact match after normalisation earns 1; otherwise the
    best token F1 earns itself when it reaches 0.3 (``is_correct``), else 0."""
    truth = task_info.get("ground_truth") or task_info.get("answer")
    if truth is None:
        return RewardOutput(reward=0.0, is_correct=False, metadata={"error": "No ground truth provided"})
    extracted = extract_search_answer(_action_text(action))
    truths = [truth] if isinstance(truth, str) else list(truth)
    metadata: dict[str, Any] = {"extracted_answer": extracted, "ground_truths": truths, "evaluation_method": None}
    best = (0.0, 0.0, 0.0)
    best_match, exact = "", False
    for candidate in (str(t).strip() for t in truths):
        if _normalize_answer(extracted) == _normalize_answer(candidate):
            best, best_match, exact = (1.0, 1.0, 1.0), candidate, True
            metadata["evaluation_method"] = "exact_match"
            break
        scored = _search_f1(extracted, candidate)
        if scored[0] > best[0]:
            best, best_match = scored, candidate
            metadata["evaluation_method"] = "f1_score"
    correct = exact or best[0] >= _SEARCH_F1_THRESHOLD
    metadata.update(best_match=best_match, f1_score=best[0], precision=best[1], recall=best[2], exact_match=exact,
                    f1_threshold=_SEARCH_F1_THRESHOLD)
    reward = (1.0 if exact else best[0]) if correct else 0.0
    return RewardOutput(reward=reward, is_correct=correct, metadata=metadata)


def _search_f1(predicted: str, gold: str) -> tuple[float, float, float]:
    a, b = _normalize_answer(predicted), _normalize_answer(gold)
    if (a in _VERDICTS or b in _VERDICTS) and a != b:
        return 0.0, 0.0, 0.0
    return _token_f1(a.split(), b.split())


_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_NOT_NAMES = {"United States", "New York", "Los Angeles", "Great Britain", "Middle East", "South Africa"}
_ANSWER_PHRASES = (
    r"(?:the\s+)?(?:correct\s+)?answer\s+is\s*:?\s*([^.!?]+)",
    r"(?:therefore|thus|so|hence)\s*,?\s*([^.!?]+)",
    r"(?:in\s+conclusion|to\s+summarize|in\s+summary)\s*,?\s*([^.!?]+)",
    r"(?:^|\.\s+)([A-Z][^.!?]*(?:was|is|are|were)\s+[^.!?]+)",
    r"(?:the\s+answer\s+would\s+be|it\s+(?:is|was))\s*:?\s*([^.!?]+)",
)


def extract_search_answer(response: str) -> str:
    """The answer in a search agent's response, by rLLM's order of evidence: ``\\boxed{...}``; bold
    text; a date or year; a multi-word proper name; a number; an "answer is ..." phrase; the most
    informative sentence; the first sentence; the first 100 characters. ``<think>`` is ignored."""
    text = re.sub(r"<think>.*?</think>", "", response.strip(), flags=re.DOTALL)
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        return ""
    start = text.find("boxed{")  # the first, backslash or not, as rLLM's
    if start >= 0:
        boxed = _braced(text, start + len("boxed{"))
        if boxed is not None:
            return boxed.strip()
    for pattern in (r"\*\*([^*]+)\*\*", r"\*([^*]+)\*"):
        found = [m.strip() for m in re.findall(pattern, text) if len(m.strip()) > 2 and re.search(r"\w", m)]
        if found:
            return found[0]
    for pattern in (rf"\b(?:{_MONTHS})\s+\d{{1,2}},?\s+\d{{4}}\b", r"\b\d{1,2}[/-]\d{1,2}[/-]\d{4}\b",
                    rf"\b(?:{_MONTHS})\s+\d{{4}}\b", r"\b\d{4}\b"):
        found = re.findall(pattern, text, re.IGNORECASE)
        if found:
            return found[0]
    names = [n for n in re.findall(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+\b", text) if n not in _NOT_NAMES and len(n.split()) <= 4]
    if names:
        return names[0]
    for pattern in (r"\b(\d+(?:,\d{3})*(?:\.\d+)?)\s*(?:votes?|dollars?|years?|months?|days?|people|million|billion|percent|%)\b",
                    r"\b(\d+(?:,\d{3})*(?:\.\d+)?)\b"):
        found = re.findall(pattern, text)
        if found:
            return found[0]
    for pattern in _ANSWER_PHRASES:
        match = re.search(pattern, text, re.IGNORECASE | re.MULTILINE)
        if match:
            answer = re.sub(r"^\W+|\W+$", "", match.group(1).strip())
            if len(answer) > 3:
                return answer
    sentences = [s.strip() for s in re.split(r"[.!?]+", text) if len(s.strip()) > 10]
    if sentences:
        best = max(sentences, key=_sentence_information)  # max keeps the first of equals, as rLLM's stable sort
        if _sentence_information(best) > 0:
            return best
    sentences = [s.strip() for s in re.split(r"[.!?]+", text) if len(s.strip()) > 5]
    return sentences[0] if sentences else text[:100].strip()


def _sentence_information(sentence: str) -> int:
    return (3 * bool(re.search(r"\b\d{4}\b", sentence)) + 2 * bool(re.search(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+\b", sentence))
            + bool(re.search(r"\b(?:was|is|are|were)\b", sentence, re.IGNORECASE)) + (len(sentence.split()) < 15))


# Data sources code_reward_fn knows, by the form of their tests (rLLM's names).
_STDIO_OR_CALL_SOURCES = ("taco", "apps", "code_contests", "livecodebench", "codeforces", "primeintellect")
_CODE_SOURCES = (*_STDIO_OR_CALL_SOURCES, "leetcode", "kodcode")
# What LiveCodeBench's harness imports before a solution, which solutions take for granted (List, ...).
_SOLUTION_PRELUDE = (
    "from typing import *\nimport bisect, collections, functools, heapq, itertools, math, re, string\n"
    "from collections import *\nfrom functools import *\nfrom itertools import *\nfrom heapq import *\nfrom bisect import *\n"
)
_CALL_HARNESS = """import json, sys
with open("call.json") as handle:
    call = json.load(handle)
namespace = {"__name__": "solution"}
with open("solution.py") as handle:
    exec(compile(handle.read(), "solution.py", "exec"), namespace)
if "Solution" in namespace:
    function = getattr(namespace["Solution"](), call["fn_name"])
else:
    function = namespace[call["fn_name"]]
result = function(*call["args"])
sys.stdout.write("\\n" + call["marker"] + json.dumps(result))
"""
# pytest in the sandbox, without the plugins installed beside it (Django's, browsers'): they are not the tests'.
_PYTEST_MAIN = """import os, sys
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
import pytest
sys.exit(int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "test_solution.py"])))
"""
_MAX_OUTPUT_CHARS = 1 << 20  # expected outputs can be long: far more is read back than the python tool's


@register_reward("code")
def code_reward_fn(task_info: dict, action: Any, limits: Any = None) -> RewardOutput:
    """rLLM's ``code_reward_fn`` (``RewardCodeFn``): the last fenced code block of the response runs
    against the task's tests (``task["ground_truth"]``); 1 when every test passes, else 0, with
    per-test details in ``metadata`` (``all_passed``, ``passed_tests``, ``total_tests``, ``test_results``).

    Every program run is a child interpreter in ``training.isolation.sandbox`` (the python tool's sandbox: no
    network, no new processes or threads, reads only its own folder and the interpreter's
    libraries, time, memory and file limits, no secrets), one per test; the first failing test
    ends the checking. The tests' form follows ``task["data_source"]``, as in rLLM:

    * ``taco``, ``apps``, ``code_contests``: ``{"inputs": [...], "outputs": [...]}``, plus ``"fn_name"``
      for tests that call a function (each input then the list of its arguments);
    * ``livecodebench``, ``codeforces``, ``primeintellect``: a list (or its JSON) of ``{"input",
      "output"}``, ``"testtype": "functional"`` and ``"metadata": {"func_name"}`` for calls (the input
      then one JSON value per line, the output one JSON value);
    * ``leetcode``: ``{"functional": test code}`` run after the solution; passes when it exits 0;
    * ``kodcode``: a pytest file importing ``solution``; passes when pytest does.

    Standard-input programs pass when their output matches line by line (numbers to 1e-6).
    ``limits``: a ``training.isolation.sandbox.Limits`` (6 s and 1 GiB per run by default).
    """
    limits = limits or Limits()
    tests = task_info.get("ground_truth")
    if tests is None:
        return RewardOutput(reward=0.0, is_correct=False, metadata={"error": "No tests found in task_info"})
    code = extract_code_from_model(_action_text(action))
    if code is None:
        return RewardOutput(reward=0.0, is_correct=False, metadata={"error": "No code found in model response"})
    source = task_info.get("data_source", "")
    if source in _STDIO_OR_CALL_SOURCES:
        details = _run_test_cases(_test_cases(tests, source), code, limits)
    elif source == "leetcode":
        details = _run_test_program(_SOLUTION_PRELUDE + code + "\n" + tests["functional"], {}, limits, 1)
    elif source == "kodcode":
        count = max(1, tests.count("def test"))
        files = {"solution.py": _without_main_block(code), "test_solution.py": tests}
        details = _run_test_program(_PYTEST_MAIN, files, _scaled(limits, count), count)
    else:
        raise ValueError(
            f"code_reward_fn: unknown data_source {source!r}; the tests' form is known for {', '.join(_CODE_SOURCES)}."
        )
    correct = details["all_passed"]
    return RewardOutput(reward=1.0 if correct else 0.0, is_correct=correct, metadata=details)


def extract_code_from_model(response: str) -> str | None:
    """The last fenced (```lang ... ```) code block of a response, stripped; None without one."""
    blocks = re.findall(r"```(?:\w+)?\n(.*?)```", response, re.DOTALL)
    return blocks[-1].strip() if blocks else None


def _test_cases(tests: Any, source: str) -> list[dict[str, Any]]:
    """Tests as a list of ``{"input", "output", "fn_name"}`` (fn_name None for standard input)."""
    if isinstance(tests, str):
        import json

        tests = json.loads(tests)
    if isinstance(tests, dict):  # TACO's form: inputs and outputs side by side
        inputs, outputs = list(tests.get("inputs", [])), list(tests.get("outputs", []))
        if len(inputs) != len(outputs):
            raise ValueError(f"code_reward_fn ({source}): {len(inputs)} inputs but {len(outputs)} outputs in the tests.")
        fn_name = tests.get("fn_name")
        return [{"input": i, "output": o[0] if isinstance(o, list) and fn_name is None and len(o) == 1 else o,
                 "fn_name": fn_name} for i, o in zip(inputs, outputs)]
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"code_reward_fn ({source}): tests must be a non-empty list of {{input, output}}, got {_short(tests)}.")
    cases = []
    for test in tests:
        if not isinstance(test, dict) or "input" not in test or "output" not in test:
            raise ValueError(f"code_reward_fn ({source}): each test needs 'input' and 'output', got {_short(test)}.")
        functional = test.get("testtype") == "functional"
        fn_name = (test.get("metadata") or {}).get("func_name") or test.get("fn_name") if functional else None
        if functional and not fn_name:
            raise ValueError(f"code_reward_fn ({source}): a functional test names no metadata.func_name: {_short(test)}.")
        cases.append({"input": test["input"], "output": test["output"], "fn_name": fn_name})
    return cases


def _run_test_cases(cases: list[dict[str, Any]], code: str, limits: Any) -> dict[str, Any]:
    import json
    import secrets

    results: list[dict[str, Any]] = []
    for case in cases:
        result: dict[str, Any] = {"input": case["input"], "expected": case["output"], "passed": False}
        results.append(result)
        if case["fn_name"] is None:
            ran = _sandboxed(code, {}, str(case["input"]), limits)
            got = ran.stdout
            result["passed"] = ran.exit_status == 0 and _same_output(got, str(case["output"]))
        else:
            raw = case["input"]
            args = raw if isinstance(raw, list) else [json.loads(line) for line in str(raw).splitlines() if line.strip()]
            marker = secrets.token_hex(8)
            call = json.dumps({"fn_name": case["fn_name"], "args": args, "marker": marker})
            ran = _sandboxed(_CALL_HARNESS, {"solution.py": _SOLUTION_PRELUDE + code, "call.json": call}, "", limits)
            got = ran.stdout.rpartition(marker)[2] if marker in ran.stdout else ""
            expected = case["output"]
            if isinstance(expected, str):
                try:
                    expected = json.loads(expected)
                except ValueError:
                    pass
            try:
                result["passed"] = ran.exit_status == 0 and bool(got) and json.loads(got) == expected
            except ValueError:
                result["passed"] = False
        if not result["passed"]:
            result["output"] = got[:1000]
            result["error"] = _failure(ran)
            break  # as LiveCodeBench's harness: the first failure settles it
    skipped = [{"input": c["input"], "expected": c["output"], "passed": False, "error": "not run: an earlier test failed"}
               for c in cases[len(results):]]
    passed = sum(r["passed"] for r in results)
    return {"all_passed": passed == len(cases), "test_results": results + skipped, "total_tests": len(cases), "passed_tests": passed}


def _sandboxed(code: str, files: dict[str, str], stdin: str, limits: Any) -> Any:
    return run_python(code, limits.timeout_s, limits.memory_mb, stdin=stdin, files=files, file_mb=limits.file_mb,
                      max_output_chars=_MAX_OUTPUT_CHARS)


def _failure(ran: Any) -> str:
    """Why a run failed its test: timeout (wall clock or CPU), how it was stopped, its error, or a wrong answer."""
    if ran.stopped:
        return "timeout" if "timed out" in ran.stopped or "CPU" in ran.stopped else ran.stopped
    if ran.exit_status:
        return f"exit status {ran.exit_status}: {ran.stderr.strip()[-500:]}"
    return "wrong answer"


def _run_test_program(code: str, files: dict[str, str], limits: Any, count: int) -> dict[str, Any]:
    ran = _sandboxed(code, files, "", limits)
    passed = ran.exit_status == 0
    output = (ran.stdout + ran.stderr)[-2000:]
    if ran.stopped:
        output += f"\n({_failure(ran)})"
    return {"all_passed": passed, "output": output, "total_tests": count, "test_results": [{"passed": passed, "output": output}]}


def _scaled(limits: Any, count: int) -> Any:
    """``limits`` with the time allowed for ``count`` tests run by one program."""
    from dataclasses import replace

    return replace(limits, timeout_s=min(limits.timeout_s * count, MAX_TIMEOUT_S))


def _without_main_block(code: str) -> str:
    """The code without its ``if __name__ == "__main__":`` block (it would run under pytest's import)."""
    kept, skipping = [], False
    for line in code.split("\n"):
        stripped = line.strip()
        if stripped.startswith(('if __name__ == "__main__"', "if __name__ == '__main__'")):
            skipping = True
            continue
        if skipping and stripped and not line.startswith((" ", "\t")):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def _same_output(got: str, expected: str) -> bool:
    """Standard output against the expected: line by line, whitespace-insensitive, numbers to 1e-6."""
    lines_got = [line.split() for line in got.strip().splitlines()]
    lines_expected = [line.split() for line in expected.strip().splitlines()]
    if lines_got == lines_expected:
        return True
    if len(lines_got) != len(lines_expected):
        return False
    for a, b in zip(lines_got, lines_expected):
        if a == b:
            continue
        if len(a) != len(b):
            return False
        try:
            if not all(_math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(a, b)):
                return False
        except ValueError:
            return False
    return True
