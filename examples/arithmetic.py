"""Arithmetic questions for a chat agent with calculator tools (``add``, ``multiply``).

The agent is AWorld-style: a system prompt, a model config and these Python tools
(``examples/agents/calculator.yaml``); the reward is the built-in ``math`` (the last number of the
answer against ``ground_truth``). Rows carry ``data_source`` ``arithmetic-add`` or
``arithmetic-multiply``, so validation reports each kind of question apart.
"""

from __future__ import annotations

import random

from training.data import register_dataset


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def make_arithmetic_tasks(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        if i % 2:
            tasks.append({"prompt": f"What is {a} * {b}?", "ground_truth": str(a * b), "data_source": "arithmetic-multiply"})
        else:
            tasks.append({"prompt": f"What is {a} + {b}?", "ground_truth": str(a + b), "data_source": "arithmetic-add"})
    return tasks


register_dataset("arithmetic", lambda: {"train": make_arithmetic_tasks(256, seed=0), "test": make_arithmetic_tasks(32, seed=1)})
