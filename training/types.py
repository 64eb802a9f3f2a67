"""Data classes shared by every part of the library: steps, trajectories, episodes, rewards.

They carry the fields of rLLM v0.2.1.post1 and those its main branch added (``rllm.types``):
``Task``, ``TrajectoryGroup``, ``AgentConfig`` (the config an ``AgentFlow`` is called with; not
``training.AgentConfig``, which is AWorld's agent config), the ``AgentFlow`` and ``Evaluator``
protocols and the evaluator's ``EvalOutput`` / ``Signal``.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class TerminationReason(str, enum.Enum):
    """Why an episode stopped. Stored as its string value in metrics and in the database.

    rLLM's names (``MAX_TURNS_EXCEEDED``, ``MAX_PROMPT_LENGTH_EXCEEDED``,
    ``MAX_RESPONSE_LENGTH_EXCEEDED``) are aliases of the shorter ones: the same members.
    """

    ENV_DONE = "env_done"
    MAX_TURNS = "max_turns"
    MAX_PROMPT_LENGTH = "max_prompt_length"
    MAX_RESPONSE_LENGTH = "max_response_length"
    TIMEOUT = "timeout"
    ERROR = "error"
    UNKNOWN = "unknown"
    MAX_TURNS_EXCEEDED = "max_turns"
    MAX_PROMPT_LENGTH_EXCEEDED = "max_prompt_length"
    MAX_RESPONSE_LENGTH_EXCEEDED = "max_response_length"

    @classmethod
    def _missing_(cls, value: object) -> "TerminationReason | None":
        # rLLM stores "max_turns_exceeded" etc.; read those back as the same members.
        if isinstance(value, str) and value.endswith("_exceeded"):
            return cls(value[: -len("_exceeded")])
        return None


@dataclass
class ModelOutput:
    """One model call as rLLM's rollout engines return it: the text, split into ``reasoning``
    (inside ``<think>...</think>``) and ``content``, with the exact token ids and logprobs."""

    text: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    multi_modal_inputs: dict[str, list] | None = None
    logprobs: list[float] | None = None
    prompt_length: int = 0
    completion_length: int = 0
    finish_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tool_calls"] = None if self.tool_calls is None else [_plain(call) for call in self.tool_calls]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelOutput":
        return cls(**{f.name: data.get(f.name, f.default) for f in fields(cls)})


@dataclass
class Action:
    """What an agent hands to its environment after reading the model's response."""

    action: Any = None


@dataclass
class Step:
    """One turn: what the model saw, what it said, and what the environment answered.

    The fields are rLLM's, but for ``next_observation``. Token fields are filled by the rollout
    engine, or taken from ``model_output`` when a workflow builds its steps from
    ``get_model_response`` results.
    """

    chat_completions: list[dict[str, str]] = field(default_factory=list)
    observation: Any = None
    thought: str = ""
    action: Any = None
    model_response: str = ""
    model_output: ModelOutput | None = None
    reward: float = 0.0
    done: bool = False
    mc_return: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # rLLM's main branch: an id, what the step was given and produced (harnesses, evaluation),
    # ``metadata`` (the same dict as ``info``), and training payloads.
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    input: Any = None
    output: Any = None
    metadata: dict[str, Any] | None = None
    advantage: list[float] | float | None = None
    weight_version: int | None = None
    routing_matrices: list[str] | None = None
    # What the environment answered this step's action, recorded by the turn loop that called
    # ``env.step``. Agents keep their own ``observation``: rLLM's the one they acted on, others the
    # reply; only this field says which text the environment sent back (the episode viewer's).
    next_observation: Any = None

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "metadata"}
        data["action"] = self.action.action if isinstance(self.action, Action) else _plain(self.action)
        data["model_output"] = self.model_output.to_dict() if self.model_output is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Step":
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if values.get("model_output") is not None:
            values["model_output"] = ModelOutput.from_dict(values["model_output"])
        return cls(**values)


@dataclass
class Trajectory:
    """The steps of one agent in one episode, plus its total reward. ``uid`` tells trajectories
    apart; ``name`` says which role produced it (``solver``, ``judge``): trajectories of one
    name are compared with each other when advantages are computed."""

    name: str = "agent"
    steps: list[Step] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    task: Any = None
    # rLLM's main branch: the function's arguments and return value (SDK), the evaluator's named
    # signals, and ``metadata`` (the same dict as ``info``).
    input: dict | None = None
    output: Any = None
    signals: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None

    @property
    def result(self) -> Any:
        """rLLM's older name for ``output``."""
        return self.output

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "name": self.name,
            "task": _without_images(self.task),
            "steps": [step.to_dict() for step in self.steps],
            "reward": float(self.reward),
            "info": self.info,
            "signals": dict(self.signals),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        return cls(
            uid=data.get("uid") or str(uuid.uuid4()),
            name=data.get("name", "agent"),
            task=data.get("task"),
            steps=[Step.from_dict(step) for step in data.get("steps", [])],
            reward=data.get("reward", 0.0),
            info=data.get("info", data.get("metadata") or {}),
            signals=data.get("signals") or {},
        )

    def is_cumulative(self) -> bool:
        """True when each step's chat_completions begins with the previous step's: the whole
        trajectory is one growing conversation."""
        for previous, step in zip(self.steps, self.steps[1:]):
            before = previous.chat_completions
            if step.chat_completions[: len(before)] != before:
                return False
        return True


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
    # rLLM's main branch: the gateway session of an AgentFlow episode, what the flow hands its
    # evaluator (``artifacts["answer"]``, ...), and ``metadata`` (the same dict as ``info``).
    session_id: str | None = None
    artifacts: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None

    @property
    def reward(self) -> float:
        """The episode's reward: the sum over its trajectories."""
        return float(sum(t.reward for t in self.trajectories))

    @property
    def num_turns(self) -> int:
        return sum(len(t.steps) for t in self.trajectories)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, used by metric sinks and the episode viewer."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "metadata"}
        data["task"] = _without_images(self.task)
        data["trajectories"] = [t.to_dict() for t in self.trajectories]
        data["termination_reason"] = self.termination_reason.value if self.termination_reason else None
        data["reward"] = self.reward
        data["num_turns"] = self.num_turns
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Episode":
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["trajectories"] = [Trajectory.from_dict(t) for t in data.get("trajectories", [])]
        reason = data.get("termination_reason")
        values["termination_reason"] = TerminationReason(reason) if reason else TerminationReason.UNKNOWN
        return cls(**values)


def _metadata_is_info(cls: type) -> None:
    """rLLM's main branch renamed ``info`` to ``metadata`` and kept ``info`` as an alias: here both
    names are one dict. ``metadata=`` given to the constructor becomes ``info``."""

    def get(self: Any) -> dict[str, Any]:
        return self.info

    def set_(self: Any, value: dict[str, Any] | None) -> None:
        if value is not None:  # None: the constructor's default, info stays as given
            self.info = value

    cls.metadata = property(get, set_, doc="rLLM's main-branch name of ``info`` (the same dict).")


for _cls in (Step, Trajectory, Episode):
    _metadata_is_info(_cls)


def _without_images(task: Any) -> Any:
    """Tasks without their image payloads (large, not JSON), as rLLM logs them."""
    if isinstance(task, dict):
        return {k: v for k, v in task.items() if k not in ("image", "images")}
    return task


def _plain(value: Any) -> Any:
    """Dataclasses (tool calls, actions) as dicts; everything else as it is."""
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


@dataclass(frozen=True)
class RewardOutput:
    """What a reward function returns. A bare float is accepted too and wrapped into this."""

    reward: float
    is_correct: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Task:
    """rLLM's ``Task`` (main branch): one problem an ``AgentFlow`` is run on. For dataset rows,
    ``metadata`` is the row and ``instruction`` its question; ``dataset_dir`` / ``sub_dir`` locate
    a task's own files where a dataset keeps them in a directory per task."""

    id: str
    instruction: str | list[dict]
    metadata: dict[str, Any] = field(default_factory=dict)
    dataset_dir: Path = field(default_factory=Path)
    sub_dir: Path | None = None

    @property
    def task_dir(self) -> Path:
        return self.dataset_dir / self.sub_dir if self.sub_dir else self.dataset_dir


@dataclass
class TrajectoryGroup:
    """rLLM's ``TrajectoryGroup`` (main branch): trajectories whose rewards are compared with each
    other when advantages are computed. ``group_id`` is ``"<task id>:<role>"``."""

    trajectories: list[Trajectory]
    group_id: str = ""
    metadata: list[dict] = field(default_factory=list)
    weight_version: int = 0

    @property
    def group_role(self) -> str:
        return self.group_id.split(":")[1] if ":" in self.group_id[:-1] else "all_groups"

    @property
    def task_id(self) -> str:
        return self.group_id.split(":")[0]


@dataclass
class AgentConfig:
    """What rLLM's ``AgentFlow`` is called with (``rllm.types.AgentConfig``): the episode's
    OpenAI-compatible ``base_url`` and the ``model`` name to send. ``training.AgentConfig`` is a
    different class, AWorld's agent config (``training.compat.aworld.agents``)."""

    base_url: str
    model: str
    session_uid: str
    metadata: dict = field(default_factory=dict)
    is_validation: bool = False
    sampling_params: dict = field(default_factory=dict)


@dataclass
class Signal:
    """One named score an evaluator reports beside the reward (``accuracy``, ``solver_acc``)."""

    name: str
    value: float
    metadata: dict = field(default_factory=dict)


@dataclass
class EvalOutput:
    """What rLLM's evaluators return (``rllm.eval.types.EvalOutput``)."""

    reward: float
    is_correct: bool
    signals: list[Signal] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)


@runtime_checkable
class AgentFlow(Protocol):
    """rLLM's agent program: ``run(task, config)`` (or ``async arun``) returns an ``Episode``, a
    ``Trajectory`` or None. ``training.rollout`` turns a function into one."""

    def run(self, task: Any, config: AgentConfig) -> Episode | Trajectory | None: ...


@runtime_checkable
class Evaluator(Protocol):
    """rLLM's scorer of an AgentFlow's episode: ``evaluate(task, episode) -> EvalOutput``.
    ``training.evaluator`` turns a function into one."""

    def evaluate(self, task: Any, episode: Episode) -> EvalOutput: ...
