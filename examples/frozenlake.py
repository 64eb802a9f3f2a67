"""A small grid world in the spirit of FrozenLake: observation in, one action character out per turn.

The board is 3x3: ``P`` is the player, ``G`` the goal, ``H`` a hole, ``.`` ice. Each turn the
agent sees the board (rows joined by ``/``, then ``>``) and answers one of ``L R U D``.
An answer that is not an action leaves the player where it is. Rewards are shaped so that an
episode's total is 1.0 when it reaches the goal, 0.0 when it falls into the hole, and 0.05 per
valid move when it runs out of turns: a fresh model first learns the action alphabet, then the
way to the goal.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from training import BaseAgent, BaseEnv, Step, Trajectory
from training.data import register_dataset
from training.types import Action

MOVES = {"L": (0, -1), "R": (0, 1), "U": (-1, 0), "D": (1, 0)}
SIZE = 3
STEP_BONUS = 0.05


class FrozenLakeEnv(BaseEnv):
    def __init__(self, board: str, start: int) -> None:
        self.cells = list(board)
        self.start = start
        self.position = start
        self.paid = 0.0  # shaping paid so far, taken back at the end so totals are 1.0 or 0.0

    @staticmethod
    def from_dict(info: dict) -> "FrozenLakeEnv":
        return FrozenLakeEnv(board=info["board"], start=int(info["start"]))

    def reset(self) -> tuple[str, dict]:
        self.position = self.start
        self.paid = 0.0
        return self.render(), {}

    def step(self, action: Any) -> tuple[str, float, bool, dict]:
        if action not in MOVES:
            return self.render(), 0.0, False, {"valid": False}
        row, col = divmod(self.position, SIZE)
        d_row, d_col = MOVES[action]
        row, col = min(max(row + d_row, 0), SIZE - 1), min(max(col + d_col, 0), SIZE - 1)
        self.position = row * SIZE + col
        cell = self.cells[self.position]
        if cell == "G":
            return self.render(), 1.0 - self.paid, True, {"valid": True, "is_correct": True}
        if cell == "H":
            return self.render(), -self.paid, True, {"valid": True, "is_correct": False}
        self.paid += STEP_BONUS
        return self.render(), STEP_BONUS, False, {"valid": True}

    def render(self) -> str:
        cells = list(self.cells)
        cells[self.position] = "P"
        rows = ["".join(cells[r * SIZE:(r + 1) * SIZE]) for r in range(SIZE)]
        return "/".join(rows) + ">"


class FrozenLakeAgent(BaseAgent):
    """Shows the board as the user message and reads the first character of the reply as the move."""

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


def make_boards(count: int, seed: int) -> list[dict]:
    """Random solvable 3x3 boards with one hole, each with a start cell."""
    rng = random.Random(seed)
    boards: list[dict] = []
    while len(boards) < count:
        cells = ["."] * (SIZE * SIZE)
        goal, hole, start = rng.sample(range(SIZE * SIZE), 3)
        cells[goal], cells[hole] = "G", "H"
        board = "".join(cells)
        if _solvable(board, start):
            boards.append({"board": board, "start": start, "data_source": "frozenlake"})
    return boards


def _solvable(board: str, start: int) -> bool:
    seen, queue = {start}, deque([start])
    while queue:
        position = queue.popleft()
        if board[position] == "G":
            return True
        row, col = divmod(position, SIZE)
        for d_row, d_col in MOVES.values():
            r, c = row + d_row, col + d_col
            nxt = r * SIZE + c
            if 0 <= r < SIZE and 0 <= c < SIZE and nxt not in seen and board[nxt] != "H":
                seen.add(nxt)
                queue.append(nxt)
    return False


register_dataset("frozenlake", lambda: {"train": make_boards(256, seed=0), "test": make_boards(64, seed=1)})
