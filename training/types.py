"""Data classes shared by every part of the library: steps, trajectories, episodes, rewards."""

from __future__ import annotations

import enum
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any


class TerminationReason(str, enum.Enum):
    """Why an episode stopped. Stored as its string value in metrics and in the database."""

    ENV_DONE = "env_done"
    MAX_TURNS = "max_turns"
    MAX_PROMPT_LENGTH = "max_prompt_length"
    MAX_RESPONSE_LENGTH = "max_response_length"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass
class Action:
    """What an agent hands to its environment after reading the model's response."""

    action: Any


@dataclass
class Step:
    """One turn: what the model saw, what it said, and what the environment answered."""

    chat_completions: list[dict[str, str]] = field(default_factory=list)
    observation: Any = None
    model_response: str = ""
    action: Any = None
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    # Token view of this turn (filled by the rollout engine).
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class Trajectory:
    """The steps of one agent in one episode, plus its total reward."""

    name: str = "agent"
    steps: list[Step] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """One attempt at a task. A workflow returns one; the rollout engine builds one for agent+env runs.

    Token fields are what the trainer learns from: ``prompt_ids`` is the first prompt, and
    ``response_ids`` is every later token of the conversation. ``response_mask`` is 1 where the
    model produced the token and 0 where the environment did, so environment text is never trained on.
    """

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    task: Any = None
    trajectories: list[Trajectory] = field(default_factory=list)
    is_correct: bool = False
    termination_reason: TerminationReason | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def reward(self) -> float:
        """The episode's reward: the sum over its trajectories."""
        return float(sum(t.reward for t in self.trajectories))

    @property
    def num_turns(self) -> int:
        return sum(len(t.steps) for t in self.trajectories)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, used by metric sinks and the episode viewer."""
        data = asdict(self)
        data["termination_reason"] = self.termination_reason.value if self.termination_reason else None
        data["reward"] = self.reward
        data["num_turns"] = self.num_turns
        return data


@dataclass(frozen=True)
class RewardOutput:
    """What a reward function returns. A bare float is accepted too and wrapped into this."""

    reward: float
    is_correct: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
