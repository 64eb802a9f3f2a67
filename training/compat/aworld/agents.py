"""AWorld's agents: a chat agent with a system prompt, a model config and Python tools.

The same agent can be written three ways, as AWorld users write it:

- as AWorld's agent YAML (``load_agents_from_yaml``; ``${ENV}`` and ``${vars.KEY}`` are filled in)::

      agents:
        calculator:
          system_prompt: "You are a careful calculator."
          llm_config: {llm_model_name: Qwen/Qwen2.5-0.5B-Instruct, llm_temperature: 0.8}
          tool_names: [examples.arithmetic.add, examples.arithmetic.multiply]

- as objects: ``Agent(name="calculator", system_prompt=..., tool_names=[...], conf=AgentConfig(...))``,
- or as the same mapping in a dict (what the platform's registry hands over).

Training runs it as an agent plus an environment (``ToolChatAgent``, ``ToolEnvironment``): the
environment's first observation is the task's prompt; every model reply with ``<tool_call>``
blocks has its tools run and their results fed back as ``tool`` messages (tokens the model is not
trained on); the first reply without a tool call is the answer, scored by the reward function.

Training keys the agent sets (model, temperature, turns) are defaults under the run's config:
the config wins where both say something, and each one applied is logged.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from training.agents.base import BaseAgent, BaseEnv

from training.agents.spec import AgentSpec
from training.isolation.jail import refusing_programs
from training.log import logger
from training.compat.aworld.mcp import MCPServers, parse_mcp_config
from training.agents.tools import Tool, ToolArgumentsError, ToolCall, load_tools, parse_tool_calls, tools_prompt
from training.types import Action, Step, Trajectory

# llm_config fields that set training keys (as defaults under the run's config).
MODEL_CONFIG_KEYS = {
    "llm_model_name": "actor_rollout_ref.model.path",
    "llm_temperature": "actor_rollout_ref.rollout.temperature",
    # sampling fields AWorld's agent configs carry (AgentConfig(top_k=80)); verl's names for them
    "top_k": "actor_rollout_ref.rollout.top_k",
    "top_p": "actor_rollout_ref.rollout.top_p",
}
# What an API client needs. Here the policy being trained answers, so these do nothing.
MODEL_CLIENT_FIELDS = {
    "llm_provider", "llm_base_url", "llm_api_key", "llm_client_type", "llm_sync_enabled", "llm_async_enabled",
    "llm_stream_call", "max_retries", "max_model_len", "model_type", "params", "ext_config", "llm_response_parser",
    "context_cache",
}
AGENT_CONFIG_KEYS = {"max_steps": "rllm.agent.max_steps"}
# AWorld runtime settings (memory, recording, vision, ...) that have no part in training.
AGENT_RUNTIME_FIELDS = {
    "memory_config", "need_reset", "use_vision", "max_input_tokens", "max_actions_per_step", "system_prompt_template",
    "working_dir", "enable_recording", "use_tools_in_prompt", "exit_on_failure", "human_tools", "skill_configs",
    "ptc_tools", "concurrent_batch_size", "meta_learning_config", "self_evolve_config", "ext",
    "llm_compression_config", "optimization_config",
}
# Agent arguments this trainer cannot honour, with why (refused when set).
AGENT_REFUSED = {
    "agent_names": "handing off to other agents is not supported; train one agent",
    "black_tool_actions": "tool blacklists are not supported; list only the tools the agent may call",
    "sandbox": "sandboxes are not supported; tools run in the training process",
    "model_output_parser": "custom output parsers are not supported; tool calls are read in the Hermes <tool_call> format",
    "tool_aggregate_func": "custom tool aggregation is not supported; each call's result goes back as its own message",
    "enable_subagent": "sub-agents are not supported; train one agent",
    "subagent_search_paths": "sub-agents are not supported; train one agent",
    "event_handler_name": "custom event handlers are not supported",
}
# Agent arguments about AWorld's runtime (retries, events, resets) that training has no use for.
AGENT_RUNTIME_ARGS = {
    "wait_tool_result", "need_reset", "step_reset", "use_tools_in_prompt", "event_driven", "llm_max_attempts",
    "llm_retry_delay", "task", "skill_configs", "feedback_tool_result",
}


class _Coercible:
    """``coerce``: an instance as it is, None as the defaults, a mapping as keyword arguments."""

    _given_as = "a mapping of its fields"

    @classmethod
    def coerce(cls, value: Any) -> Any:
        if isinstance(value, cls):
            return value
        if value is None:
            return cls()
        if isinstance(value, dict):
            return cls(**value)
        raise ValueError(f"{cls._given_as}, got {type(value).__name__}.")


class ModelConfig(_Coercible):
    """AWorld's ``ModelConfig`` (the ``llm_config`` of an agent). ``llm_model_name`` and
    ``llm_temperature`` set the model and sampling temperature under the run's config (``top_k``
    and ``top_p``, as AWorld's configs carry them, the rollout's top-k and top-p); the API
    client fields (provider, URL, key) are accepted and do nothing, since the trained policy answers."""

    _given_as = "llm_config must be a mapping of AWorld ModelConfig fields"

    def __init__(self, **fields: Any) -> None:
        unknown = sorted(set(fields) - set(MODEL_CONFIG_KEYS) - MODEL_CLIENT_FIELDS)
        if unknown:
            raise ValueError(_unknown("llm_config", unknown, set(MODEL_CONFIG_KEYS) | MODEL_CLIENT_FIELDS))
        name, temperature = fields.get("llm_model_name"), fields.get("llm_temperature")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"llm_config.llm_model_name must be a model id or directory, got {name!r}.")
        if isinstance(temperature, str):  # from an environment variable, as AWorld's examples read it (pydantic's coercion)
            try:
                temperature = fields["llm_temperature"] = float(temperature)
            except ValueError:
                pass
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0):
            raise ValueError(f"llm_config.llm_temperature must be a number of at least 0, got {temperature!r}.")
        self.fields = dict(fields)
        if temperature == 0:
            # AWorld's examples ask for greedy answers (BFCL: LLM_TEMPERATURE 0.0); training samples, or every
            # episode of a group would be the same and none would teach anything.
            logger.info("llm_config.llm_temperature=0 (greedy) has no effect on training: episodes are sampled at "
                        "actor_rollout_ref.rollout.temperature; greedy is the validation's default (val_kwargs)")
            del self.fields["llm_temperature"]
        self.llm_model_name: str | None = name
        self.llm_temperature: float = float(temperature) if temperature is not None else 1.0

    def training_keys(self) -> dict[str, Any]:
        return {MODEL_CONFIG_KEYS[name]: value for name, value in self.fields.items() if name in MODEL_CONFIG_KEYS}


class AgentConfig(_Coercible):
    """AWorld's ``AgentConfig``: ``llm_config`` (or its fields given directly, as AWorld allows),
    ``max_steps`` (turns per episode) and ``system_prompt``. AWorld's runtime settings (memory,
    recording, ...) are accepted and do nothing; any other field is refused, named."""

    _given_as = "conf must be an AgentConfig or a mapping of its fields"

    def __init__(self, llm_config: Any = None, max_steps: int | None = None, system_prompt: str | None = None, **fields: Any) -> None:
        model_fields = {k: v for k, v in fields.items() if k in MODEL_CONFIG_KEYS or k in MODEL_CLIENT_FIELDS}
        unknown = sorted(set(fields) - set(model_fields) - AGENT_RUNTIME_FIELDS)
        if unknown:
            known = {"llm_config", "max_steps", "system_prompt"} | AGENT_RUNTIME_FIELDS | set(MODEL_CONFIG_KEYS) | MODEL_CLIENT_FIELDS
            hint = ""
            if "temperature" in unknown:
                hint = " The sampling temperature is llm_temperature (actor_rollout_ref.rollout.temperature)."
            raise ValueError(_unknown("agent config", unknown, known) + hint)
        base = ModelConfig.coerce(llm_config)
        self.llm_config = ModelConfig(**{**base.fields, **model_fields}) if model_fields else base
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"agent config max_steps must be a whole number of at least 1, got {max_steps!r}.")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"agent config system_prompt must be text, got {type(system_prompt).__name__}.")
        self.max_steps = max_steps
        self.system_prompt = system_prompt

    def training_keys(self) -> dict[str, Any]:
        keys = self.llm_config.training_keys()
        if self.max_steps is not None:
            keys[AGENT_CONFIG_KEYS["max_steps"]] = self.max_steps
        return keys


class Agent:
    """A chat agent as AWorld's ``Agent`` takes it: ``name``, ``conf`` (an ``AgentConfig``),
    ``desc``, ``system_prompt`` and ``tool_names`` (tools by registered name or import path; also
    accepted as ``tools``, functions included). Every problem raises ValueError starting with
    ``agent '<name>':``."""

    def __init__(
        self,
        name: str,
        conf: AgentConfig | dict | None = None,
        desc: str | None = None,
        agent_id: str | None = None,
        *,
        system_prompt: str | None = None,
        tool_names: list[Any] | None = None,
        tools: list[Any] | None = None,
        llm_config: ModelConfig | dict | None = None,
        mcp_servers: Any = None,
        mcp_config: dict | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"agent: name must be a non-empty string, got {name!r}.")
        self.name = name
        self.agent_id = agent_id or name
        try:
            self.desc = desc or name
            self.conf = AgentConfig.coerce(conf)
            if llm_config is not None:  # AWorld's YAML puts llm_config next to system_prompt
                merged = {**self.conf.llm_config.fields, **ModelConfig.coerce(llm_config).fields}
                self.conf.llm_config = ModelConfig(**merged)
            prompt = system_prompt if system_prompt is not None else (self.conf.system_prompt or "")
            if not isinstance(prompt, str):
                raise ValueError(f"system_prompt must be text, got {type(prompt).__name__}.")
            self.system_prompt = prompt
            self.tool_specs = _as_list(tool_names, "tool_names") + _as_list(tools, "tools")
            self.tools: list[Tool] = load_tools(self.tool_specs)
            _check_arguments(kwargs)
            self.mcp = MCPServers(parse_mcp_config(mcp_servers, mcp_config), agent=name)
        except ValueError as exc:
            raise ValueError(f"agent {name!r}: {exc}") from exc

    def training_keys(self) -> dict[str, Any]:
        """Training config keys this agent sets (defaults under the run's config)."""
        return self.conf.training_keys()

    @property
    def all_tools(self) -> list[Tool]:
        """Its tools: the Python ones, then its MCP servers' (``<server>__<tool>``), once they were started."""
        return [*self.tools, *self.mcp.tools]

    def start_servers(self) -> None:
        """Start its MCP servers (``training.compat.aworld.mcp``) and list their tools, unless they run.
        Where this process refuses new programs (the platform's check of a run) they are not started:
        the run starts them. ``MCPServerError`` names a server that cannot be started."""
        if not self.mcp or self.mcp.running:
            return
        if refusing_programs():
            logger.info("agent %r: its MCP servers (%s) start when the run starts, not while it is checked",
                        self.name, ", ".join(e.name for e in self.mcp.entries))
            return
        self.mcp.start()
        names = [tool.name for tool in self.all_tools]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            self.mcp.stop()
            raise ValueError(f"agent {self.name!r}: tool name(s) {twice} are offered twice; the model could not tell them apart.")

    def stop_servers(self) -> None:
        """Stop its MCP servers (started again by ``start_servers``)."""
        if self.mcp:
            self.mcp.stop()

    def to_spec(self, reward_fn: Any = None, prompt_key: str = "prompt") -> AgentSpec:
        """The agent-plus-environment pair that the rollout engine runs."""
        tools = self.all_tools
        return AgentSpec(
            agent_class=ToolChatAgent,
            env_class=ToolEnvironment.bind(tools, reward_fn, prompt_key),
            agent_args={"name": self.name, "system_prompt": self.system_prompt, "tool_schemas": [t.schema for t in tools]},
        )

    def describe(self) -> dict[str, Any]:
        """JSON-friendly, for config.yaml: the agent as its YAML would write it."""
        return {
            "kind": "chat",
            "name": self.name,
            "system_prompt": self.system_prompt,
            "tool_names": list(dict.fromkeys(t.source for t in self.tools)),
            "llm_config": {k: v for k, v in self.conf.llm_config.fields.items() if k != "llm_api_key"},
            **({"max_steps": self.conf.max_steps} if self.conf.max_steps is not None else {}),
            **({"mcp_servers": self.mcp.describe()} if self.mcp else {}),
        }

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, tools={[t.name for t in self.tools]})"


def _as_list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of tools, got {type(value).__name__} {value!r}.")
    return list(value)


def _check_arguments(kwargs: dict[str, Any]) -> None:
    for key, value in kwargs.items():
        if key in AGENT_REFUSED:
            if value:
                raise ValueError(f"{key}: {AGENT_REFUSED[key]}.")
        elif key == "feedback_tool_result" and value is False:
            raise ValueError("feedback_tool_result: tool results always go back to the model here; leave it true.")
        elif key not in AGENT_RUNTIME_ARGS:
            known = {"name", "conf", "desc", "agent_id", "system_prompt", "tool_names", "tools", "llm_config", "mcp_servers", "mcp_config"}
            raise ValueError(_unknown(None, [key], known | set(AGENT_REFUSED) | AGENT_RUNTIME_ARGS))


def _unknown(what: str | None, names: list[str], known: set[str]) -> str:
    close = [difflib.get_close_matches(name, sorted(known), n=1) for name in names]
    hints = [f"{name!r} (did you mean {match[0]!r}?)" if match else repr(name) for name, match in zip(names, close)]
    prefix = f"{what}: " if what else ""
    return f"{prefix}unknown field(s) {', '.join(hints)}; known fields: {', '.join(sorted(known))}."


# -- loading -----------------------------------------------------------------------------------

_ENV = re.compile(r"\$\{([^}.]+)\}")
_VAR = re.compile(r"\$\{vars\.([A-Za-z0-9_]+)\}")


def _substitute(value: Any, variables: dict[str, Any], environ: bool) -> Any:
    """``${vars.KEY}`` from the YAML's ``vars`` (a whole-string placeholder keeps the value's type)
    and, for files only, ``${ENV_VAR}`` from the environment (left as it is when unset)."""
    if isinstance(value, dict):
        return {k: _substitute(v, variables, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, variables, environ) for v in value]
    if not isinstance(value, str):
        return value
    whole = _VAR.fullmatch(value)
    if whole and whole.group(1) in variables:
        return variables[whole.group(1)]
    value = _VAR.sub(lambda m: str(variables[m.group(1)]) if m.group(1) in variables else m.group(0), value)
    if environ:
        value = _ENV.sub(lambda m: os.environ.get(m.group(1), m.group(0)), value)
    return value


def load_agents_from_dict(agents_conf: dict[str, Any]) -> dict[str, Agent]:
    """AWorld's ``agents:`` mapping (name -> fields) as ``Agent`` objects, in order."""
    if not isinstance(agents_conf, dict):
        raise ValueError(f"agent: 'agents' must be a mapping of agent name to its fields, got {type(agents_conf).__name__}.")
    agents = {}
    for name, fields in agents_conf.items():
        if not isinstance(fields, dict):
            raise ValueError(f"agent {name!r}: its fields must be a mapping, got {type(fields).__name__}.")
        arguments = {k: v for k, v in fields.items() if k not in ("name", "config")}
        if "config" in fields and "conf" not in fields:  # AWorld's YAML calls the AgentConfig 'config'
            arguments["conf"] = fields["config"]
        agents[name] = Agent(name=name, **arguments)
    return agents


def load_agents_from_yaml(path: str | Path) -> dict[str, Agent]:
    """The agents of an AWorld agent YAML file (``vars``, ``agents``, optional ``swarm``)."""
    return load_agents_from_dict(_agents_section(_read_yaml(Path(path)), environ=True, source=str(path)))


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise ValueError(f"agent: agent YAML {path} does not exist.")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"agent: agent YAML {path} is not valid YAML: {exc}") from exc


def _agents_section(document: Any, environ: bool, source: str) -> dict[str, Any]:
    if not isinstance(document, dict) or "agents" not in document:
        raise ValueError(f"agent: {source} must be a mapping with an 'agents:' section (AWorld's agent YAML).")
    unknown = sorted(set(document) - {"vars", "agents", "swarm"})
    if unknown:
        raise ValueError(f"agent: {source} has unknown top-level key(s) {unknown}; AWorld's agent YAML has vars, agents and swarm.")
    variables = document.get("vars") or {}
    if not isinstance(variables, dict):
        raise ValueError(f"agent: 'vars' in {source} must be a mapping.")
    agents = _substitute(copy.deepcopy(document["agents"]), variables, environ)
    if not agents:
        raise ValueError(f"agent: {source} defines no agents under 'agents:'.")
    return agents


_SPEC_FIELDS = {"workflow_class", "agent_class", "env_class", "agent_run_func", "agent_flow", "evaluator"}


def chat_agent_from(agent: Any) -> Agent | None:
    """The chat agent that ``agent`` describes (an ``Agent``; a YAML path holding AWorld's ``agents:``
    section or one agent's own fields, ``name`` with ``system_prompt``, ``conf``, ...; or a dict with an
    ``agents:`` section), or None when it describes another kind of agent.

    Of several agents, the first is trained, as AWorld's own trainers do (a swarm is not trained whole).
    """
    if isinstance(agent, Agent):
        return agent
    if isinstance(agent, dict) and "agents" in agent:
        agents = load_agents_from_dict(_agents_section(agent, environ=False, source="the agent mapping"))
    elif isinstance(agent, (str, Path)) and str(agent).endswith((".yaml", ".yml")):
        document = _read_yaml(Path(agent))
        if isinstance(document, dict) and "agents" not in document and "name" in document and not _SPEC_FIELDS & set(document):
            # One agent's own fields (name, desc, system_prompt, conf, ...): AWorld's trainers build
            # Agent(**load_config(path)) from such a file.
            return Agent(**document)
        if not (isinstance(document, dict) and "agents" in document):
            return None  # an AgentSpec YAML (workflow_class, agent_class, ...)
        agents = load_agents_from_dict(_agents_section(document, environ=True, source=str(agent)))
    else:
        return None
    first = next(iter(agents.values()))
    if len(agents) > 1:
        logger.warning("the agent config defines %d agents (%s); training the first, %r", len(agents), ", ".join(agents), first.name)
    return first


# -- the agent and environment that run it -----------------------------------------------------


class ToolChatAgent(BaseAgent):
    """The conversation of a chat agent: system prompt (with its tools described), the task,
    and then the model's replies and the tools' results in turn."""

    def __init__(self, name: str = "agent", system_prompt: str = "", tool_schemas: list[dict] | None = None) -> None:
        self.name = name
        parts = [part for part in (system_prompt, tools_prompt(tool_schemas) if tool_schemas else "") if part]
        self.system_text = "\n\n".join(parts)
        self.reset()

    def reset(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_text}] if self.system_text else []
        self._trajectory = Trajectory(name=self.name)

    @property
    def chat_completions(self) -> list[dict[str, Any]]:
        return self.messages

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory

    def update_from_env(self, observation: Any, reward: float, done: bool, info: dict, **kwargs: Any) -> None:
        if self._trajectory.steps:
            step = self._trajectory.steps[-1]
            step.observation, step.reward, step.done, step.info = observation, reward, done, dict(info or {})
        if done or observation is None:
            return
        if isinstance(observation, str):
            self.messages.append({"role": "user", "content": observation})
        else:  # chat messages: the task's prompt in chat form, or the tools' results
            self.messages.extend(dict(message) for message in observation)

    def update_from_model(self, response: str, **kwargs: Any) -> Action:
        self.messages.append({"role": "assistant", "content": response})
        calls = parse_tool_calls(response)
        action = {"tool_calls": [asdict(call) for call in calls]} if calls else {"answer": response}
        self._trajectory.steps.append(Step(chat_completions=list(self.messages), model_response=response, action=action))
        return Action(action)


class ToolEnvironment(BaseEnv):
    """One task for a chat agent: its prompt first, then the tools' results for each reply with
    tool calls; the first reply without one ends the episode, scored by the reward function.

    A tool that raises, an unknown tool or a malformed call is answered with an error message
    the model reads (as a tool result), not an episode error: learning to call tools well is
    part of the task. ``bind`` makes a subclass holding the tools, the reward and the prompt key.
    """

    tools: dict[str, Tool] = {}
    reward_fn: Any = None
    prompt_key: str = "prompt"

    def __init__(self, task: dict) -> None:
        self.task = task

    @classmethod
    def bind(cls, tools: list[Tool], reward_fn: Any, prompt_key: str) -> type["ToolEnvironment"]:
        attributes = {
            "tools": {tool.name: tool for tool in tools}, "reward_fn": reward_fn, "prompt_key": prompt_key,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
        }
        return type(cls.__name__, (cls,), attributes)

    @classmethod
    def from_dict(cls, info: dict) -> "ToolEnvironment":
        return cls(dict(info))

    def reset(self) -> tuple[Any, dict]:
        if self.prompt_key not in self.task:
            raise KeyError(f"the task has no {self.prompt_key!r} field (data.prompt_key); its fields are {sorted(self.task)}")
        return self.task[self.prompt_key], {}

    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        if isinstance(action, dict) and "tool_calls" in action:
            results = [self._run(ToolCall(**call)) for call in action["tool_calls"]]
            return results, 0.0, False, {"tool_calls": len(results)}
        answer = action.get("answer", "") if isinstance(action, dict) else str(action)
        if self.reward_fn is None:
            return None, 0.0, True, {}
        scored = self.reward_fn(self.task, answer)
        return None, scored.reward, True, {"is_correct": scored.is_correct}

    def _run(self, call: ToolCall) -> dict[str, Any]:
        if call.error is not None:
            content = f"Error: {call.error}."
        elif call.name not in self.tools:
            content = f"Error: there is no tool {call.name!r}; the tools are: {', '.join(self.tools) or 'none'}."
        else:
            try:
                content = self.tools[call.name].call(call.arguments)
            except ToolArgumentsError as exc:
                content = f"Error: the arguments of {call.name} do not fit: {exc}"
            except Exception as exc:  # a tool's own failure is the model's to read and recover from
                content = f"Error: {call.name} raised {type(exc).__name__}: {exc}"
        return {"role": "tool", "name": call.name, "content": content}
