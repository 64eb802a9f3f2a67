"""Scoring helpers rLLM's AgentFlow cookbooks import, as our own code with rLLM's behaviour:

- ``evaluate_math(task, episode)``: rLLM's ``rllm.eval.reward_fns.math.evaluate``: the last
  ``\\boxed{...}`` of the episode's answer against the task's ``ground_truth`` (one or a list),
  1.0 when they are equal as text after LaTeX normalisation or as numbers / sympy expressions;
  0.0 with ``metadata["reason"]`` when no answer or no ground truth is found.
- ``extract_answer_text(episode)``: rLLM's ``rllm.eval.reward_fns._helpers.extract_answer_text``.
- ``extract_answer(text)``: rLLM's ``rllm.rewards.math_utils.utils.extract_answer`` (None without a box).
- ``countdown_compute_score(...)``: rLLM's ``rllm.rewards.countdown_reward.compute_score``.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from fractions import Fraction
from typing import Any

import sympy

from training.types import Episode, EvalOutput, Signal, Task


def extract_answer_text(episode: Episode) -> str:
    """The episode's final answer: ``artifacts["answer"]``, else the last trajectory's ``output``,
    its last step's ``output``, or the last non-empty ``model_response`` of its steps."""
    if "answer" in episode.artifacts:
        return str(episode.artifacts["answer"])
    if not episode.trajectories:
        return ""
    trajectory = episode.trajectories[-1]
    if trajectory.output:
        return str(trajectory.output)
    if not trajectory.steps:
        return ""
    if trajectory.steps[-1].output:
        return str(trajectory.steps[-1].output)
    return next((str(step.model_response) for step in reversed(trajectory.steps) if step.model_response), "")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced) or ``\\boxed x``."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    if rest.startswith("\\boxed ") and not rest.startswith("\\boxed {"):
        return rest[len("\\boxed ") :].split("$")[0].strip()
    open_at = rest.find("{")
    if open_at < 0:
        return None
    depth = 0
    for i in range(open_at, len(rest)):
        depth += {"{": 1, "}": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[open_at + 1 : i]
    return None


_BOX_TOKENS = re.compile(r"<\|begin_of_box\|>([\s\S]*?)<\|end_of_box\|>")


def extract_answer(passage: str) -> str | None:
    """rLLM's ``extract_answer``: the last answer between ``<|begin_of_box|>`` tokens, else the last
    boxed answer; None when it has neither (no fallback to bare numbers)."""
    marked = _BOX_TOKENS.findall(passage)
    if marked:
        return marked[-1].strip()
    if "\\boxed" not in passage and "\\fbox" not in passage:
        return None
    return _last_boxed(passage)


def extract_boxed_answer(solution: str) -> str | None:
    """rLLM's ``extract_boxed_answer``: the content of the last ``\\boxed{...}`` (None without one)."""
    return _last_boxed(solution)


def grade_answer_mathd(given_answer: str, ground_truth: str) -> bool:
    """rLLM's ``grade_answer_mathd``: equal after the MATH dataset's (mathd) normalisation, as verl's
    grader normalises (``verl.utils.reward_score.prime_math.math_normalize``)."""
    # verl is imported on first use: it is heavy, and only math grading needs it here.
    from verl.utils.reward_score.prime_math.math_normalize import normalize_answer

    return given_answer is not None and normalize_answer(ground_truth) == normalize_answer(given_answer)


_TEXT_WRAPPERS = re.compile(r"\\(?:text|mbox|mathrm|textbf)\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_SHORT_FRAC = re.compile(r"\\[dt]?frac(\d)(\d)")


def normalize_math(answer: str) -> str:
    """A LaTeX answer reduced to a comparable form (rLLM's mathd normalisation, in short):
    no spaces, ``\\left``/``\\right``, ``$``, degree marks, trailing ``.``, text wrappers or
    ``x =`` prefix; ``\\dfrac`` / ``\\tfrac`` read as ``\\frac``; ``0.5`` not ``.5``."""
    text = answer.strip()
    text = _TEXT_WRAPPERS.sub(r"\1", text)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("$", ""),
                     ("^{\\circ}", ""), ("^\\circ", ""), ("\\%", ""), ("%", ""), ("\\dfrac", "\\frac"),
                     ("\\tfrac", "\\frac"), (" ", "")):
        text = text.replace(old, new)
    text = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", text)
    if re.fullmatch(r"[a-zA-Z]\w*=.+", text):
        text = text.split("=", 1)[1]
    text = text.rstrip(".")
    if text.startswith("."):
        text = "0" + text
    return text


def _as_sympy(text: str) -> Any:
    expression = _FRAC.sub(r"((\1)/(\2))", text)
    expression = expression.replace("\\sqrt", "sqrt").replace("\\pi", "pi").replace("\\cdot", "*")
    expression = expression.replace("\\times", "*").replace("^", "**").replace("{", "(").replace("}", ")")
    if re.search(r"[a-zA-Z_]{2,}", expression.replace("sqrt", "").replace("pi", "")):
        raise ValueError(f"not a plain expression: {text}")
    return sympy.sympify(expression, rational=True)


def grade_answer_sympy(given_answer: str, ground_truth: str) -> bool:
    """rLLM's ``grade_answer_sympy``: equal as normalised text, else as sympy expressions (``0.5`` and
    ``\\frac{1}{2}``). verl's PRM800K grader (``prime_math.grade_answer``) is stricter on integers and
    unreduced fractions, but it runs each sympy comparison in a forked process with a timeout, which
    hangs in a process with threads (the episode loop's): so this one is ours."""
    given_n, truth_n = normalize_math(given_answer or ""), normalize_math(ground_truth)
    if not given_n or not truth_n:
        return False
    if given_n == truth_n:
        return True
    try:
        return bool(sympy.simplify(_as_sympy(given_n) - _as_sympy(truth_n)) == 0)
    except Exception:  # sympy raises many kinds on text that is not an expression: not equal
        return False


def grade_math_answer(given: str, truth: str) -> bool:
    """Whether two final answers are the same, as rLLM's math evaluator decides: mathd, else sympy."""
    return grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth)


def evaluate_math(task: Task | dict, episode: Episode) -> EvalOutput:
    """rLLM's math evaluator (``rllm.eval.reward_fns.math.evaluate``)."""
    metadata = task.metadata if isinstance(task, Task) else task
    model_answer = extract_answer(extract_answer_text(episode))
    if model_answer is None:
        return _math_output(False, "no_answer_extracted")
    truths = metadata.get("ground_truth")
    if truths is None:
        return _math_output(False, "no_ground_truth")
    if isinstance(truths, (str, int, float)):
        truths = [truths]
    processed = []
    for truth in truths:
        text = str(truth)
        processed.append(extract_answer(text) if "\\boxed" in text else text)
    processed = [truth for truth in processed if truth is not None]
    if not processed:
        return _math_output(False, "no_processed_ground_truth")
    return _math_output(any(grade_math_answer(model_answer, truth) for truth in processed), None)


def _math_output(correct: bool, reason: str | None) -> EvalOutput:
    value = 1.0 if correct else 0.0
    return EvalOutput(reward=value, is_correct=correct, signals=[Signal(name="accuracy", value=value)],
                      metadata={"reason": reason} if reason else {})


_ANSWER = re.compile(r"<answer>(.*?)</answer>")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arithmetic(node: ast.AST) -> Fraction:
    """+ - * / and parentheses over numbers; anything else raises ValueError (never ``eval``)."""
    if isinstance(node, ast.Expression):
        return _arithmetic(node.body)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _arithmetic(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    raise ValueError("not arithmetic")


def countdown_compute_score(solution_str: str, ground_truth: dict, method: str = "strict",
                            format_score: float = 0.1, score: float = 1.0) -> float:
    """rLLM's countdown score: the last ``<answer>...</answer>`` must use exactly the given
    ``numbers`` (each once) with + - * / and reach ``target``: ``score``; a well-formed answer that
    misses or misuses the numbers: ``format_score``; no answer: 0."""
    text = solution_str
    for marker in ("Assistant:", "<|im_start|>assistant"):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    answers = _ANSWER.findall(text)
    if not answers:
        return 0
    equation = answers[-1].strip()
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(ground_truth["numbers"]):
        return format_score
    if not re.fullmatch(r"[\d+\-*/().\s]+", equation):
        return format_score
    try:
        result = _arithmetic(ast.parse(equation, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return format_score
    return score if math.isclose(float(result), ground_truth["target"], abs_tol=1e-5) else format_score
