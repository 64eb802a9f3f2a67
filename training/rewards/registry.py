"""Reward functions: one normalized callable over the signatures rLLM and verl users already write.

A user function is wrapped in :class:`RewardFunction`, which always answers ``(task, response) ->
RewardOutput`` (and ``score_batch(tasks, responses)`` for a batch). Three signatures are accepted,
told apart by ``inspect.signature``:

* rLLM's ``fn(task_info: dict, action: str)``;
* verl's ``fn(data_source, solution_str, ground_truth, extra_info)``, where ``data_source`` is
  ``task["data_source"]`` (default ``"default"``), ``ground_truth`` is ``task[answer_key]`` (or verl's
  ``task["reward_model"]["ground_truth"]``) and ``extra_info`` is the whole task;
* TRL's batch ``fn(completions, prompts, **kwargs) -> list[float]`` (any function with a
  ``completions`` parameter), called as TRL calls it: ``prompts`` from ``task[prompt_key]``, each
  completion a string (a list with one assistant message when the prompt is chat messages), and
  every other column as a keyword argument holding one value per completion.

A function may return a :class:`RewardOutput`, a number (``bool`` included), or a dict with a
``"reward"`` or ``"score"`` key (verl's ``compute_score`` returns ``"score"``), an optional
``"is_correct"``, and anything else, which is kept as metadata.

Built-ins (``exact_match``, ``math``, ``countdown``, ``char_accuracy``) are registered by name with
:func:`register_reward` and loaded with :func:`load_reward`.
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
from training.utils import import_file, import_object

_REWARDS: dict[str, Callable[..., Any]] = {}

_RETURN_HELP = "return a float, a dict with a 'reward' or 'score' key, or a RewardOutput"


class RewardFunction:
    """A user reward function behind one calling convention: ``reward_fn(task, response)``.

    ``name`` labels the reward in metrics. ``answer_key`` is the task column passed as verl's
    ``ground_truth``; it is unused by rLLM-style functions, which read the task themselves.
    """

    def __init__(
        self, fn: Callable[..., Any], name: str | None = None, answer_key: str = "ground_truth", prompt_key: str = "prompt"
    ) -> None:
        if not callable(fn):
            raise ValueError(f"reward function must be callable, got {type(fn).__name__} {fn!r}.")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.answer_key = answer_key
        self.prompt_key = prompt_key
        self.style = _signature_style(fn, self.name)

    def __call__(self, task: dict, response: str) -> RewardOutput:
        """Score ``response`` to ``task``. Exceptions of the user function propagate unchanged."""
        return self.score_batch([task], [response])[0]

    def score_batch(self, tasks: list[dict], responses: list[str]) -> list[RewardOutput]:
        """Score each response to its task: one call of a batch (TRL-style) function, else one call each."""
        if self.style != "trl":
            return [self._to_output(self._call_user(task, response)) for task, response in zip(tasks, responses)]
        values = self._call_batch(tasks, responses)
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__") or len(values) != len(responses):
            raise ValueError(
                f"reward function {self.name} takes TRL's batch form (completions, prompts, **kwargs), so it must "
                f"return a list with one reward per completion: {len(responses)} completion(s), got {_short(values)}."
            )
        return [self._to_output(value) for value in values]

    def probe(self, task: dict) -> None:
        """Call the function once on ``task`` with an empty response, to fail before training starts.

        An empty response is what an untrained model often writes, so the function must cope with it.
        """
        try:
            self(task, "")
        except Exception as exc:  # user code can raise anything; report it with the row that caused it
            raise ValueError(
                f"reward function {self.name} raised {exc!r} on the first row of the dataset: "
                f"{_short(task)} (response ''). Fix the function so that it handles every row, an empty "
                f"response included, and {_RETURN_HELP}."
            ) from exc

    def _call_user(self, task: dict, response: str) -> Any:
        if self.style == "rllm":
            return self.fn(task, response)
        return self.fn(task.get("data_source", "default"), response, self._ground_truth(task), task)

    def _ground_truth(self, task: dict) -> Any:
        if self.answer_key in task:
            return task[self.answer_key]
        nested = task.get("reward_model")  # verl's own data files keep it at reward_model.ground_truth
        if self.answer_key == "ground_truth" and isinstance(nested, dict) and "ground_truth" in nested:
            return nested["ground_truth"]
        raise ValueError(
            f"reward function {self.name} takes verl's ground_truth from the task's {self.answer_key!r} "
            f"column, which this task lacks; it has: {', '.join(map(str, task))}. "
            f"Rename the column or set data.answer_key=<name>."
        )

    def _call_batch(self, tasks: list[dict], responses: list[str]) -> Any:
        """TRL's call: ``fn(prompts=..., completions=..., **columns)``, each column a list."""
        prompts = [task.get(self.prompt_key) for task in tasks]
        completions = [
            [{"role": "assistant", "content": response}] if isinstance(prompt, list) else response
            for prompt, response in zip(prompts, responses)
        ]
        columns = {key for task in tasks for key in task if key != self.prompt_key}
        kwargs: dict[str, Any] = {key: [task.get(key) for task in tasks] for key in sorted(columns)}
        kwargs.update(prompts=prompts, completions=completions)
        parameters = inspect.signature(self.fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            kwargs = {key: value for key, value in kwargs.items() if key in parameters}
        return self.fn(**kwargs)

    def _to_output(self, value: Any) -> RewardOutput:
        if isinstance(value, RewardOutput):
            output = value
        elif isinstance(value, bool):
            output = RewardOutput(reward=float(value), is_correct=value)
        elif isinstance(value, numbers.Real):  # numbers.Real also admits numpy scalars
            # A bare number carries no verdict; full marks (1.0 or more) is the common convention.
            output = RewardOutput(reward=float(value), is_correct=bool(value >= 1.0))
        elif isinstance(value, dict) and ("reward" in value or "score" in value):
            key = "reward" if "reward" in value else "score"
            reward = value[key]
            if not isinstance(reward, numbers.Real):
                raise ValueError(
                    f"reward function {self.name} returned a dict whose {key!r} is {reward!r}; it must be a number."
                )
            metadata = {k: v for k, v in value.items() if k not in (key, "is_correct")}
            output = RewardOutput(float(reward), bool(value.get("is_correct", reward >= 1.0)), metadata)
        else:
            raise ValueError(f"reward function {self.name} returned {value!r} ({type(value).__name__}); {_RETURN_HELP}.")
        if not _math.isfinite(output.reward):
            raise ValueError(f"reward function {self.name} returned reward {output.reward}; it must be a finite number.")
        return output

    def __repr__(self) -> str:
        return f"RewardFunction({self.name!r}, style={self.style!r})"


def _signature_style(fn: Callable[..., Any], name: str) -> str:
    """'verl' for the 4-argument ``compute_score`` signature, 'rllm' for ``(task_info, action)``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reward function {name}: cannot read its signature ({exc}); wrap it in a def.") from exc
    # TRL's and verl's parameter names settle it whatever the arity.
    if "completions" in signature.parameters:
        return "trl"
    if "solution_str" in signature.parameters or "data_source" in signature.parameters:
        return "verl"
    for style, arity in (("rllm", 2), ("verl", 4)):
        try:
            signature.bind(*([None] * arity))
            return style
        except TypeError:
            pass
    raise ValueError(
        f"reward function {name} has signature {signature}; it must take (task_info, action) as in rLLM, "
        f"(data_source, solution_str, ground_truth, extra_info) as in verl, or (completions, prompts, **kwargs) as in TRL."
    )


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def register_reward(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a reward function under ``name`` so that ``load_reward(name)`` finds it."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REWARDS:
            raise ValueError(f"a reward named {name!r} is already registered ({_REWARDS[name]!r}); choose another name.")
        _REWARDS[name] = fn
        return fn

    return decorator


def builtin_rewards() -> list[str]:
    """Names that ``load_reward`` accepts without an import path."""
    return sorted(_REWARDS)


def load_reward(spec: Any, answer_key: str = "ground_truth", prompt_key: str = "prompt") -> RewardFunction | None:
    """Turn a reward specification into a :class:`RewardFunction` (None stays None).

    ``spec`` may be a RewardFunction (returned as is), a callable, a registered name such as
    ``"math"``, a dotted import path ``"pkg.mod.fn"``, a file path ``"path/to/file.py:fn"``, or a
    file path alone (``"reward/score.py"``: its function is found by :func:`reward_in_file`).
    """
    if spec is None or isinstance(spec, RewardFunction):
        return spec
    keys = {"answer_key": answer_key, "prompt_key": prompt_key}
    if callable(spec):
        return RewardFunction(spec, **keys)
    if not isinstance(spec, str):
        raise ValueError(f"reward_func must be a callable, a built-in name, an import path or a file path, not {type(spec).__name__}.")
    if spec in _REWARDS:
        return RewardFunction(_REWARDS[spec], name=spec, **keys)
    if spec.endswith(".py"):
        return RewardFunction(reward_in_file(spec), **keys)
    builtins = ", ".join(builtin_rewards())
    if "." not in spec:
        raise ValueError(
            f"unknown reward {spec!r}: built-in rewards are {builtins}; otherwise give an import path "
            f"such as 'pkg.module.fn', a file 'path/to/file.py' or 'path/to/file.py:fn'."
        )
    try:
        fn = import_object(spec, what="reward function")
    except ValueError as exc:
        raise ValueError(f"{exc} Built-in rewards are {builtins}.") from exc
    if not callable(fn):
        raise ValueError(f"reward function {spec!r} is a {type(fn).__name__}, not a callable.")
    return RewardFunction(fn, **keys)


# The names a reward file's function goes by: verl's default, then the common ones.
CONVENTIONAL_REWARD_NAMES = ("compute_score", "reward_func", "reward_fn", "reward_function", "reward")
_REWARD_SUFFIXES = ("reward_func", "reward_fn", "reward_function", "_reward")


def reward_in_file(path: str) -> Callable[..., Any]:
    """The reward function of a Python file given without ``:name``.

    In order: a function with a conventional name (``compute_score``, verl's default, then
    ``reward_func``, ``reward_fn``, ``reward_function``, ``reward``); the one function whose name
    ends like one (``gaia_reward_func``, as AWorld names them); the file's only function.
    Functions imported from elsewhere do not count. Anything else is refused, listing the candidates.
    """
    module = import_file(path, what=f"reward function {path!r}")
    functions = {
        name: value for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")
    }
    for name in CONVENTIONAL_REWARD_NAMES:
        if name in functions:
            return functions[name]
    suffixed = [name for name in functions if name.endswith(_REWARD_SUFFIXES)]
    if len(suffixed) == 1:
        return functions[suffixed[0]]
    if len(functions) == 1:
        return next(iter(functions.values()))
    conventions = ", ".join(CONVENTIONAL_REWARD_NAMES)
    if not functions:
        raise ValueError(
            f"reward_func: {path} defines no function to use as the reward; define one (named e.g. "
            f"compute_score or reward_func) or give 'path.py:name'."
        )
    raise ValueError(
        f"reward_func: {path} defines {len(functions)} functions ({', '.join(sorted(functions))}) and none is "
        f"the reward by name ({conventions}, or one ending in reward_func); give the one to use as '{path}:name'."
    )
