"""FrozenLake, as in Gym's non-slippery 4x4 lake: observation in, one action character out per turn.

The lake (``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal)::

    SFFF
    FHFH
    FFFH
    HFFG

Each task starts the player on a different frozen cell. Each turn the agent sees the player's
cell as ``<row><col>>`` (``21>`` is row 2, column 1) and answers one of ``L R U D``. An answer
that is not an action leaves the player where it is.

An episode's reward is 1.0 when it reaches the goal and 0.0 when it falls into a hole. When it
runs out of turns it earns up to 0.5 for the way it made towards the goal (shortest path
around the holes), so a fresh model gets a signal long before it first reaches the goal. The
reward is paid as it is earned (each step pays the change), so the steps add up to the total.
"""

from __future__ import annotations

import random
from collections import deque
from functools import lru_cache
from typing import Any

from training import BaseAgent, BaseEnv, Step, Trajectory
from training.data import register_dataset
from training.types import Action

LAKE = ("SFFF", "FHFH", "FFFH", "HFFG")
MOVES = {"L": (0, -1), "R": (0, 1), "U": (-1, 0), "D": (1, 0)}
PROGRESS_WEIGHT = 0.5


class FrozenLakeEnv(BaseEnv):
    def __init__(self, start: tuple[int, int], lake: tuple[str, ...] = LAKE) -> None:
        self.lake = lake
        self.start = start
        self.position = start
        self.paid = 0.0  # reward paid so far; each step pays the change of the episode's total

    @staticmethod
    def from_dict(info: dict) -> "FrozenLakeEnv":
        lake = tuple(info["lake"].split("/")) if info.get("lake") else LAKE
        return FrozenLakeEnv(start=(int(info["start_row"]), int(info["start_col"])), lake=lake)

    def reset(self) -> tuple[str, dict]:
        self.position = self.start
        self.paid = 0.0
        return self.render(), {}

    def step(self, action: Any) -> tuple[str, float, bool, dict]:
        if action not in MOVES:
            return self.render(), 0.0, False, {"valid": False}
        d_row, d_col = MOVES[action]
        row = min(max(self.position[0] + d_row, 0), len(self.lake) - 1)
        col = min(max(self.position[1] + d_col, 0), len(self.lake[0]) - 1)
        self.position = (row, col)
        cell = self.lake[row][col]
        done = cell in "GH"
        if done:
            total = 1.0 if cell == "G" else 0.0
        else:
            distances = goal_distances(self.lake)
            start_distance = distances[self.start]
            total = PROGRESS_WEIGHT * max(0.0, 1 - distances[self.position] / start_distance)
        reward, self.paid = total - self.paid, total
        info = {"valid": True, "is_correct": cell == "G"} if done else {"valid": True}
        return self.render(), reward, done, info

    def render(self) -> str:
        return f"{self.position[0]}{self.position[1]}>"


class FrozenLakeAgent(BaseAgent):
    """Shows the observation as the user message and reads the first character of the reply as the move."""

    def __init__(self) -> None:
        self._trajectory = Trajectory(name="frozenlake")
        self._messages: list[dict[str, str]] = []

    @property
    def chat_completions(self) -> list[dict[str, str]]:
        return self._messages

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory

    def reset(self) -> None:
        self._trajectory = Trajectory(name="frozenlake")
        self._messages = []

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
        if self._trajectory.steps:
            last = self._trajectory.steps[-1]
            last.reward, last.done, last.info = reward, done, info
        if not done:
            self._messages.append({"role": "user", "content": observation})
            self._trajectory.steps.append(Step(observation=observation))

    def update_from_model(self, response: str, **kwargs: Any) -> Action:
        move = response.strip()[:1].upper()
        self._messages.append({"role": "assistant", "content": response})
        step = self._trajectory.steps[-1]
        step.model_response, step.action = response, move
        step.chat_completions = list(self._messages)
        return Action(action=move)


@lru_cache(maxsize=32)
def goal_distances(lake: tuple[str, ...]) -> dict[tuple[int, int], int]:
    """Moves from each cell to the goal, around the holes (breadth-first from the goal)."""
    goal = next((r, c) for r, line in enumerate(lake) for c, cell in enumerate(line) if cell == "G")
    distances, queue = {goal: 0}, deque([goal])
    while queue:
        row, col = queue.popleft()
        for d_row, d_col in MOVES.values():
            cell = (row + d_row, col + d_col)
            if 0 <= cell[0] < len(lake) and 0 <= cell[1] < len(lake[0]) and cell not in distances and lake[cell[0]][cell[1]] != "H":
                distances[cell] = distances[(row, col)] + 1
                queue.append(cell)
    return distances


def make_tasks(count: int, seed: int, lake: tuple[str, ...] = LAKE) -> list[dict]:
    """``count`` tasks, each starting on a random frozen cell of ``lake``."""
    starts = [(r, c) for r, line in enumerate(lake) for c, cell in enumerate(line) if cell in "SF"]
    rng = random.Random(seed)
    return [
        {"start_row": row, "start_col": col, "lake": "/".join(lake), "data_source": "frozenlake"}
        for row, col in (rng.choice(starts) for _ in range(count))
    ]


register_dataset("frozenlake", lambda: {"train": make_tasks(256, seed=0), "test": make_tasks(64, seed=1)})
