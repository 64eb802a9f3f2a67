"""Single-turn copy task: the prompt shows a short string, the model must write it back.

Scored with the built-in ``char_accuracy`` reward (share of characters in the right place).
"""

from __future__ import annotations

import random

from training.data import register_dataset

ALPHABET = "abcdef"


def make_copy_tasks(count: int, seed: int, length: int = 3) -> list[dict]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(count):
        text = "".join(rng.choice(ALPHABET) for _ in range(length))
        tasks.append({"prompt": f"{text}=", "ground_truth": text, "data_source": "copy"})
    return tasks


register_dataset("copy", lambda: {"train": make_copy_tasks(256, seed=0), "test": make_copy_tasks(64, seed=1)})
