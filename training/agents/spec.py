"""What an ``AgentTrainer`` is given as its agent: an ``AgentSpec`` (a BaseAgent and a BaseEnv, a
Workflow, an rLLM-style run function or AgentFlow), checked and resolved, and recorded by import path."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from training.agents.base import BaseAgent, BaseEnv, _resolve_class
from training.agents.flow import check_agent_flow
from training.agents.workflow import Workflow
from training.utils import import_object


AgentRunFunc = Callable[..., Any]


@dataclass
class AgentSpec:
    """Which code plays the agent, in one of three forms (exactly one must be given):

    - ``workflow_class`` (+ ``workflow_args``),
    - ``agent_class`` and ``env_class`` (+ ``agent_args``, ``env_args``),
    - ``agent_run_func``: a black-box function returning a reward, in either form:
      rLLM's ``fn(**task)``, which reaches the model through the OpenAI-compatible endpoint the
      trainer serves (``training.sdk.get_chat_client()``, or parameters named ``base_url`` /
      ``client``); or ``fn(task, model)`` (first parameter named ``task``, no ``**kwargs``) with
      our ``ModelClient``. See ``run_func_style``.
    - ``agent_flow`` and ``evaluator``: rLLM's AgentFlow API (its main branch; ``training.agents.flow``):
      ``flow(task, config)`` calls the model through ``config.base_url``, the endpoint the trainer
      serves, and the evaluator's ``EvalOutput`` gives the reward.
    - or none of them: a plain single-turn task where the dataset's prompt goes to the model
      and the reward function scores the answer.

    Classes and functions may be given as objects or as import paths (``package.module.Name``
    or ``path/to/file.py:Name``).
    """

    workflow_class: type | str | None = None
    workflow_args: dict[str, Any] = field(default_factory=dict)
    agent_class: type | str | None = None
    env_class: type | str | None = None
    agent_args: dict[str, Any] = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)
    agent_run_func: AgentRunFunc | str | None = None
    agent_flow: Any = None
    evaluator: Any = None

    @property
    def kind(self) -> str:
        """One of ``workflow``, ``agent_env``, ``run_func``, ``agent_flow`` or ``single_turn``."""
        if self.agent_flow is not None:
            return "agent_flow"
        if self.workflow_class is not None:
            return "workflow"
        if self.agent_class is not None or self.env_class is not None:
            return "agent_env"
        if self.agent_run_func is not None:
            return "run_func"
        return "single_turn"

    @property
    def run_func_style(self) -> str | None:
        """``"task_model"`` for ``fn(task, model)``, ``"kwargs"`` for rLLM's ``fn(**task)``, None
        without a run function. ``fn(task, model)`` is recognised by its first parameter, named
        ``task``, and the absence of ``**kwargs``; every other function is called rLLM's way."""
        func = self.agent_run_func
        if func is None or isinstance(func, str):
            return None
        try:
            params = list(inspect.signature(func).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature
            return "kwargs"
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if any(p.kind == p.VAR_KEYWORD for p in params) or len(positional) < 2 or positional[0].name != "task":
            return "kwargs"
        return "task_model"

    @property
    def uses_endpoint(self) -> bool:
        """Whether the agent reaches the model through the OpenAI-compatible endpoint the trainer
        serves (rLLM's ``fn(**task)`` run functions and AgentFlows)."""
        return self.run_func_style == "kwargs" or self.kind == "agent_flow"

    @property
    def is_multi_turn(self) -> bool:
        return self.kind != "single_turn"

    def validate(self) -> "AgentSpec":
        """Import every named class, check it has the right base, and return a resolved copy.

        Raises ValueError with what to fix.
        """
        given = [
            name
            for name, on in (
                ("workflow_class", self.workflow_class is not None),
                ("agent_class/env_class", self.agent_class is not None or self.env_class is not None),
                ("agent_run_func", self.agent_run_func is not None),
                ("agent_flow", self.agent_flow is not None),
            )
            if on
        ]
        if len(given) > 1:
            raise ValueError(f"Give only one way to run the agent, not {' and '.join(given)}.")
        resolved = AgentSpec(**{f.name: getattr(self, f.name) for f in fields(self)})
        if self.kind == "agent_env":
            if self.agent_class is None or self.env_class is None:
                missing = "env_class" if self.env_class is None else "agent_class"
                raise ValueError(f"agent_class and env_class go together: {missing} is missing.")
            resolved.agent_class = _resolve_class(self.agent_class, BaseAgent, "agent_class")
            resolved.env_class = _resolve_class(self.env_class, BaseEnv, "env_class")
        elif self.kind == "workflow":
            resolved.workflow_class = _resolve_class(self.workflow_class, Workflow, "workflow_class")
        elif self.kind == "run_func":
            func = self.agent_run_func
            if isinstance(func, str):
                func = import_object(func, what="agent_run_func")
            if not callable(func):
                raise ValueError(f"agent_run_func must be callable, got {type(func).__name__}.")
            resolved.agent_run_func = func
        elif self.kind == "agent_flow":
            flow, scorer = (import_object(v, what=n) if isinstance(v, str) else v
                            for v, n in ((self.agent_flow, "agent_flow"), (self.evaluator, "evaluator")))
            check_agent_flow(flow, scorer)
            resolved.agent_flow, resolved.evaluator = flow, scorer
        if self.evaluator is not None and self.kind != "agent_flow":
            raise ValueError("evaluator scores the episodes of an agent_flow; give agent_flow= too, or use reward_func=.")
        for name in ("workflow_args", "agent_args", "env_args"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be a dict of keyword arguments, got {type(getattr(self, name)).__name__}.")
        return resolved

    @property
    def label(self) -> str:
        """What runs, in words for messages: ``workflow pkg.SolverJudgeWorkflow``, ``agent_run_func ...``."""
        if self.kind == "workflow":
            return f"workflow {by_import_path(self.workflow_class)}"
        if self.kind == "agent_env":
            return f"agent {by_import_path(self.agent_class)} with environment {by_import_path(self.env_class)}"
        if self.kind == "run_func":
            return f"agent_run_func {by_import_path(self.agent_run_func)}"
        if self.kind == "agent_flow":
            return f"agent_flow {by_import_path(self.agent_flow)}"
        return "the single-turn prompt"

    def describe(self) -> dict[str, Any]:
        """A JSON- and YAML-friendly description for config.yaml and the database: classes and
        functions (also inside ``*_args``, as rLLM's ``env_args={"reward_fn": fn}``) by import path."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == {}:
                continue
            out[f.name] = by_import_path(value)
        return out

    def with_config_args(self, config: Any) -> "AgentSpec":
        """This spec with the config's ``rllm.agent.agent_args``, ``rllm.env.env_args`` and
        ``rllm.workflow.workflow_args`` merged under its own (the spec's values win)."""
        rllm = config.rllm
        merged = {
            "agent_args": {**rllm.agent.agent_args, **self.agent_args},
            "env_args": {**rllm.env.env_args, **self.env_args},
            "workflow_args": {**rllm.workflow.workflow_args, **self.workflow_args},
        }
        if all(merged[name] == getattr(self, name) for name in merged):
            return self
        return replace(self, **merged)

    @classmethod
    def coerce(cls, agent: Any) -> "AgentSpec":
        """Accept an AgentSpec, a dict of its fields, a YAML/JSON file path, or an import path to a
        Workflow or BaseAgent class; return an AgentSpec."""
        if agent is None:
            return cls()
        if isinstance(agent, cls):
            return agent
        if isinstance(agent, dict):
            unknown = set(agent) - {f.name for f in fields(cls)}
            if unknown:
                raise ValueError(
                    f"Unknown agent field(s) {sorted(unknown)}; expected some of {[f.name for f in fields(cls)]}. "
                    "An agent is given as those fields (our agent spec), as AWorld's agent YAML (an 'agents:' "
                    "section of name: {system_prompt, llm_config, tool_names}, or one agent's own fields: "
                    "name, desc, system_prompt, conf, tool_names), or as an Agent."
                )
            return cls(**agent)
        if isinstance(agent, type):
            if issubclass(agent, Workflow):
                return cls(workflow_class=agent)
            raise ValueError(
                f"{agent.__name__} is not a Workflow; pass agent_class= and env_class= for a BaseAgent."
            )
        if agent == "virtual":  # AWorld's TRL trainer: no agent, the dataset's prompts go to the model
            return cls()
        if isinstance(agent, (str, Path)):
            text = str(agent)
            if text.endswith((".yaml", ".yml", ".json")):
                path = Path(text)
                if not path.is_file():
                    raise ValueError(f"Agent config file {text} does not exist.")
                import yaml

                data = json.loads(path.read_text()) if text.endswith(".json") else yaml.safe_load(path.read_text())
                if not isinstance(data, dict):
                    raise ValueError(f"Agent config file {text} must hold a mapping of AgentSpec fields.")
                return cls.coerce(data)
            return cls.coerce(import_object(text, what="agent"))
        raise ValueError(f"Cannot use {type(agent).__name__} as an agent; give an AgentSpec, a dict or a path.")


# Keys whose values are credentials (rLLM's MCP example passes its search API key in env_args'
# mcp_server_env): never written to config.yaml or the database.
_CREDENTIAL_KEY = re.compile(r"(^|[_-])((api|access|secret|private)[_-]?key|token|secret|password|credentials?)$", re.IGNORECASE)


def by_import_path(value: Any) -> Any:
    """``value`` with every class and function replaced by its import path (``module.Name``);
    other objects that YAML cannot hold by their type's path and ``repr``; the values of
    credential-like keys (``TAVILY_API_KEY``, ``token``, ...) as ``<redacted>``."""
    if isinstance(value, dict):
        return {str(k): "<redacted>" if _CREDENTIAL_KEY.search(str(k)) and isinstance(v, str) else by_import_path(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [by_import_path(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    return f"{type(value).__module__}.{type(value).__qualname__}: {value!r}"[:300]
