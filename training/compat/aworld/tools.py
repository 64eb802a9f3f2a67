"""AWorld's ``be_tool`` (``aworld.core.tool.func_to_tool``): a plain function made a tool that an
``Agent(tool_names=[...])`` names, with no docstring needed::

    @be_tool(tool_name="hello_world", tool_desc="tool use example")
    def hello_world() -> str:
        return "hello world!"

    Agent(name="hello_world_agent", system_prompt=..., tool_names=["hello_world"])

The tool is registered under ``tool_name`` (else ``name``, else the function's name), the name the
model calls it by. Its schema is built from the signature as AWorld builds it (pydantic, a
``Field(..., description=...)`` default describing its parameter); the description the model reads
is ``desc``, else ``tool_desc``, else the docstring's first paragraph, else the name. It runs as
every tool here does (``training.agents.tools``): arguments checked against the signature first,
a failure handed back to the model as the tool's result.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
from typing import Any, Callable

import pydantic

from training.agents.tools import Tool, ToolArgumentsError, arguments_model, register_tool_group, register_tool_object
from training.log import logger


def be_tool(tool_name: str | None = None, tool_desc: str | None = None, name: str | None = None,
            desc: str | None = None, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a function to register it as a tool (AWorld's ``@be_tool(...)``); returns it unchanged."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        function_to_tool(func, tool_name=tool_name, tool_desc=tool_desc, name=name, desc=desc, **kwargs)
        return func

    return decorator


def function_to_tool(func: Callable[..., Any], tool_name: str | None = None, tool_desc: str | None = None,
                     name: str | None = None, desc: str | None = None, **kwargs: Any) -> Tool:
    """Register ``func`` as a tool (AWorld's ``function_to_tool``). ValueError naming the function when
    it cannot be one: a lambda without a name, no return annotation (AWorld's rule), a name taken."""
    label = getattr(func, "__qualname__", repr(func))
    tool_name = tool_name or name or getattr(func, "__name__", None)
    if not tool_name or tool_name == "<lambda>":
        raise ValueError(f"be_tool: {label} needs a name (tool_name=...): a lambda has none.")
    if inspect.signature(func).return_annotation is inspect.Signature.empty:
        raise ValueError(f"be_tool: {label} has no return annotation; AWorld's tools declare one (preferably -> str).")
    if kwargs:
        logger.info("be_tool %s: %s accepted, no effect here", tool_name, ", ".join(sorted(kwargs)))
    model = arguments_model(func)
    if model is None:
        raise ValueError(f"be_tool: the parameters of {label} cannot be described: give each a type hint that pydantic knows.")
    parameters = model.model_json_schema()
    parameters.pop("title", None)
    for field in parameters.get("properties", {}).values():
        field.pop("title", None)
    doc = (inspect.getdoc(func) or "").split("\n\n")[0].strip()
    schema = {"type": "function", "function": {"name": tool_name, "description": desc or tool_desc or doc or tool_name,
                                               "parameters": parameters}}
    return register_tool_object(Tool(name=tool_name, fn=func, schema=schema, source=tool_name))  # named as tool_names name it


# -- AWorld's class-based tools ---------------------------------------------------------------------
# AWorld's quick-start local tool (examples/aworld_quick_start/local_tool/hello_world_tool.py):
#
#     class HelloworldAction(ToolAction):
#         HELLO_WORLD = ToolActionInfo(name="hello_world", desc="hello world.",
#                                      input_params={"goal": ParamInfo(name="goal", type="str", required=True, desc="...")})
#
#     @ActionFactory.register(name="hello_world", desc="hello world.", tool_name="hello_world")
#     class ExecuteAction(ExecutableAction):
#         async def async_act(self, action: ActionModel, **kwargs):
#             return ActionResult(content="hello world!", keep=True, is_done=True), None
#
#     @ToolFactory.register(name="hello_world", desc="hello world tool", asyn=True, supported_action=HelloworldAction)
#     class HelloWorldTool(TemplateTool): ...
#
# ``Agent(tool_names=["hello_world"])`` then offers one tool per action, named as AWorld names them,
# ``<tool>__<action>`` with the tool's registered name (``async_hello_world__hello_world`` when
# ``asyn=True``), its parameters from the action's ``ParamInfo``s. A call builds an ``ActionModel``
# and runs the action's ``ExecutableAction`` (``async_act``, else ``act``); the model reads the
# ``ActionResult``'s content (its ``error`` as the tool's error). That is what AWorld's
# ``TemplateTool`` does; a tool class with a ``do_step`` of its own (a browser, an Android device: an
# environment with state between calls) is refused when an agent names it.


class ParamInfo(pydantic.BaseModel):
    """AWorld's ``ParamInfo``: one parameter of an action."""

    model_config = pydantic.ConfigDict(extra="allow")
    name: str | None = None
    type: str = "str"
    required: bool = False
    desc: str | None = None
    default_value: Any = None


class ToolActionInfo(pydantic.BaseModel):
    """AWorld's ``ToolActionInfo``: an action's name, description and parameters."""

    model_config = pydantic.ConfigDict(extra="allow")
    name: str
    input_params: dict[str, ParamInfo] = {}
    desc: str | None = None


class ActionModel(pydantic.BaseModel):
    """AWorld's ``ActionModel``: the call an action receives (``params`` are the model's arguments)."""

    model_config = pydantic.ConfigDict(extra="allow")
    tool_name: str | None = None
    tool_call_id: str | None = None
    agent_name: str | None = None
    action_name: str | None = None
    params: dict[str, Any] = {}
    policy_info: Any = None


class ActionResult(pydantic.BaseModel):
    """AWorld's ``ActionResult``: what an action returns; the model reads ``content`` (or ``error``)."""

    model_config = pydantic.ConfigDict(extra="allow")
    is_done: bool = False
    success: bool = False
    content: Any = None
    error: str | None = None
    keep: bool = False
    action_name: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    metadata: dict[str, Any] = {}


class ToolAction(enum.Enum):
    """AWorld's ``ToolAction``: an enum whose members are ``ToolActionInfo``s."""

    @classmethod
    def get_value_by_name(cls, name: str) -> ToolActionInfo | None:
        member = cls.__members__.get(name.upper())
        return member.value if member is not None else None


class ExecutableAction:
    """AWorld's ``ExecutableAction``: ``act`` (or ``async_act``) runs one call of an action."""

    def act(self, action: ActionModel, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def async_act(self, action: ActionModel, **kwargs: Any) -> Any:
        return self.act(action, **kwargs)


class _ActionManager:
    """AWorld's ``ActionFactory``: ``register(name=..., desc=..., tool_name=...)`` on an ``ExecutableAction``."""

    def __init__(self) -> None:
        self._actions: dict[str, type] = {}
        self._desc: dict[str, str] = {}

    def register(self, name: str, desc: str = "", **kwargs: Any) -> Callable[[type], type]:
        def decorator(cls: type) -> type:
            key = (kwargs.get("tool_name") or "") + name
            self._actions[key] = cls
            self._desc[key] = desc
            return cls

        return decorator

    def get(self, tool_name: str, name: str) -> type | None:
        return self._actions.get(tool_name + name)


class ToolsManager:
    """AWorld's ``ToolFactory``: ``register(name=..., desc=..., supported_action=..., asyn=...)`` on a tool class."""

    def __init__(self) -> None:
        self._tools: dict[str, "_ClassTool"] = {}

    def register(self, name: str, desc: str = "", supported_action: type | None = None, conf_file_name: str | None = None,
                 **kwargs: Any) -> Callable[[type], type]:
        asyn = bool(kwargs.pop("asyn", False))

        def decorator(cls: type) -> type:
            registered = ("async_" if asyn else "") + name
            group = _ClassTool(registered, name, desc, supported_action, cls)
            self._tools[registered] = group
            register_tool_group(registered, group)  # an agent's tool_names may leave out the async_ prefix: load_tools
            return cls

        return decorator

    def __contains__(self, name: str) -> bool:
        return name in self._tools or f"async_{name}" in self._tools

    def __iter__(self):
        return iter(self._tools)

    def desc(self, name: str) -> str:
        tool = self._tools.get(name) or self._tools.get(f"async_{name}")
        return tool.desc if tool is not None else ""


ActionFactory = _ActionManager()
ToolFactory = ToolsManager()

_JSON_TYPES = {"str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
               "number": "number", "bool": "boolean", "boolean": "boolean", "list": "array", "array": "array",
               "dict": "object", "object": "object"}


class ToolBase:
    """AWorld's tool bases (``Tool``, ``AsyncTool``, ``TemplateTool``): the class a registered tool
    derives from. Here the actions it supports run as ``TemplateTool`` runs them."""

    def __init__(self, conf: Any = None, **kwargs: Any) -> None:
        self.conf = conf

    def name(self) -> str:
        return getattr(self.conf, "get", lambda *_: None)("name") or type(self).__name__


class BaseTool(ToolBase):
    """AWorld's ``BaseTool``."""


class AsyncBaseTool(ToolBase):
    """AWorld's ``AsyncBaseTool``."""


class AsyncTool(AsyncBaseTool):
    """AWorld's ``AsyncTool``."""


class TemplateTool(AsyncTool):
    """AWorld's ``TemplateTool`` (``aworld.tools.async_template_tool``): runs the registered actions."""


_BASES = (ToolBase, BaseTool, AsyncBaseTool, AsyncTool, TemplateTool)



class _ClassTool:
    """A registered tool class: the tools an agent naming it gets (one per action; ``expand``)."""

    def __init__(self, registered: str, name: str, desc: str, supported_action: type | None, cls: type) -> None:
        self.registered, self.name, self.desc, self.supported_action, self.cls = registered, name, desc, supported_action, cls

    def __repr__(self) -> str:
        return f"AWorld tool class {self.cls.__qualname__} ({self.registered!r})"

    def expand(self) -> list[Tool]:
        label = f"AWorld tool {self.registered!r} ({self.cls.__qualname__})"
        own_step = [k.__qualname__ for k in self.cls.__mro__ if k not in _BASES and k is not object
                    and ("do_step" in vars(k) or "step" in vars(k))]
        if own_step:
            raise ValueError(
                f"{label} has its own do_step ({own_step[0]}): a tool with state of its own between calls is not "
                "supported. Write each action as an ExecutableAction registered with ActionFactory.register(name=..., "
                "tool_name=...) on a TemplateTool, or as a function with @be_tool.")
        if self.supported_action is None or not issubclass(self.supported_action, enum.Enum):
            raise ValueError(f"{label} has no supported_action (a ToolAction enum of ToolActionInfo): it offers no action.")
        tools = []
        for member in self.supported_action:
            info = member.value
            if not isinstance(info, ToolActionInfo):
                raise ValueError(f"{label}: action {member.name} of {self.supported_action.__name__} is not a ToolActionInfo.")
            executable = ActionFactory.get(self.name, info.name) or ActionFactory.get(self.registered, info.name)
            if executable is None:
                raise ValueError(
                    f"{label}: action {info.name!r} has no ExecutableAction: register one with "
                    f"@ActionFactory.register(name={info.name!r}, tool_name={self.name!r}) (and import its module first).")
            tools.append(self._tool(info, executable))
        return tools

    def _tool(self, info: ToolActionInfo, executable: type) -> Tool:
        name = f"{self.registered}__{info.name}"
        properties, required = {}, []
        for key, param in info.input_params.items():
            kind = _JSON_TYPES.get(param.type, param.type)
            properties[key] = {"description": param.desc or key, "type": kind, **({"items": {"type": "string"}} if kind == "array" else {})}
            if param.required:
                required.append(key)
        schema = {"type": "function", "function": {"name": name, "description": info.desc or self.desc or name,
                                                   "parameters": {"type": "object", "properties": properties, "required": required}}}
        registered, params = self.registered, info.input_params

        def run(**arguments: Any) -> Any:
            problems = [f"{key}: missing" for key in required if key not in arguments]
            problems += [f"{key}: not an argument of this tool" for key in arguments if key not in params]
            if problems:
                raise ToolArgumentsError("; ".join(problems) + f" (its arguments: {', '.join(params) or 'none'})")
            action = ActionModel(tool_name=registered, action_name=info.name, params=dict(arguments))
            result = executable().async_act(action)
            return result

        return _ActionTool(name=name, fn=run, schema=schema, source=registered)


class _ActionTool(Tool):
    """One action of a class-based tool: its arguments checked against the action's parameters, the
    ``ActionResult``'s content the text the model reads."""

    def call(self, arguments: dict[str, Any]) -> str:
        if not isinstance(arguments, dict):
            raise ToolArgumentsError("the arguments of a tool call must be a JSON object")
        result = asyncio.run(_first(self.fn(**arguments)))
        if isinstance(result, tuple):  # AWorld's (ActionResult, info)
            result = result[0] if result else None
        if isinstance(result, list):  # several results: the first, as AWorld's TemplateTool reads them
            result = result[0] if result else None
        if isinstance(result, ActionResult):
            if result.error:
                raise RuntimeError(result.error)
            result = result.content
        return result if isinstance(result, str) else json.dumps(result, default=str)


async def _first(awaitable: Any) -> Any:
    return await awaitable if inspect.isawaitable(awaitable) else awaitable
