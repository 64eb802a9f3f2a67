"""Python functions as tools a chat agent may call, and the tool-call format the model writes.

A tool is a plain (or async) Python function with type hints and a docstring whose ``Args:``
section describes each argument: ``transformers.utils.get_json_schema`` turns it into the
OpenAI-style schema the model reads. Tools are named by import path (``pkg.mod.fn`` or
``path/to/file.py:fn``) or registered by name with :func:`register_tool` (or, schema and all, with
:func:`register_tool_object`, as AWorld's ``be_tool`` does).

Before a tool runs, the model's arguments are checked against the function's signature and type
hints (pydantic, in its lax mode: ``"3"`` is 3 for an ``int``); arguments that do not fit raise
:class:`ToolArgumentsError`, which the environment hands back to the model as the tool's result.

The model calls tools in the Hermes format that Qwen and most open chat models are trained on::

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call>
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, get_type_hints

import pydantic
from pydantic.fields import FieldInfo

from training.utils import import_object

_TOOLS: dict[str, "Callable[..., Any] | Tool"] = {}

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's signature (missing, unknown or of the wrong type)."""


@dataclass(frozen=True)
class Tool:
    """One callable tool: its name as the model sees it, its schema, and where it came from."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    source: str

    def call(self, arguments: dict[str, Any]) -> str:
        """Run the tool on arguments checked against its signature (``ToolArgumentsError`` when they do
        not fit); the result as the text the model reads. The tool's own exceptions propagate."""
        result = self.fn(**checked_arguments(self.fn, arguments))
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return result if isinstance(result, str) else json.dumps(result, default=str)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def register_tool(name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a tool under ``name`` (default: the function's name)."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        key = name or fn.__name__
        known = _TOOLS.get(key)
        if known is not None and (known.fn if isinstance(known, Tool) else known) is not fn:
            raise ValueError(f"a tool named {key!r} is already registered ({_TOOLS[key]!r}); choose another name.")
        _TOOLS[key] = fn
        return fn

    return decorator


def register_tool_object(tool: "Tool") -> "Tool":
    """Register a tool with its own schema under ``tool.name`` (refusing another one of that name)."""
    known = _TOOLS.get(tool.name)
    if known is not None and (known.fn if isinstance(known, Tool) else known) is not tool.fn:
        raise ValueError(f"a tool named {tool.name!r} is already registered ({known!r}); choose another name.")
    _TOOLS[tool.name] = tool
    return tool


def register_tool_group(name: str, group: Any) -> None:
    """Register under ``name`` an object whose ``expand()`` gives the tools that name stands for
    (AWorld's class-based tools: one tool per action), or raises ValueError saying why it cannot."""
    known = _TOOLS.get(name)
    if known is not None and known is not group and not getattr(known, "expand", None):
        raise ValueError(f"a tool named {name!r} is already registered ({known!r}); choose another name.")
    _TOOLS[name] = group


def registered_tools() -> list[str]:
    return sorted(_TOOLS)


@functools.lru_cache(maxsize=512)
def arguments_model(fn: Callable[..., Any]) -> type[pydantic.BaseModel] | None:
    """A pydantic model of ``fn``'s keyword arguments (a pydantic ``Field`` default gives its default and
    description, as AWorld's tools write them), or None when its type hints cannot be read."""
    try:
        hints = get_type_hints(fn)
        signature = inspect.signature(fn)
    except Exception:  # a forward reference that does not resolve, a builtin without a signature
        return None
    fields: dict[str, Any] = {}
    extra = "forbid"
    for name, parameter in signature.parameters.items():
        if parameter.kind == parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        if parameter.kind == parameter.VAR_POSITIONAL:
            continue
        annotation = hints.get(name, Any)
        default = parameter.default
        if isinstance(default, FieldInfo):
            fields[name] = (annotation, default)
        else:
            fields[name] = (annotation, ... if default is parameter.empty else default)
    config = pydantic.ConfigDict(extra=extra, arbitrary_types_allowed=True)
    try:
        return pydantic.create_model(f"{getattr(fn, '__name__', 'tool')}_arguments", __config__=config, **fields)
    except Exception:  # an annotation pydantic cannot build a validator for
        return None


def checked_arguments(fn: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` validated against ``fn``'s signature and hints, ready to pass as keywords."""
    try:
        model = arguments_model(fn)
    except TypeError:  # an unhashable callable: not cached
        model = arguments_model.__wrapped__(fn)
    if model is None:
        try:
            inspect.signature(fn).bind(**arguments)
        except TypeError as exc:
            raise ToolArgumentsError(str(exc)) from None
        except ValueError:  # no signature to check against: the call itself will say
            pass
        return arguments
    try:
        validated = model.model_validate(arguments)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {_said(e)}" for e in exc.errors())
        expected = ", ".join(f"{name}{'' if field.is_required() else ' (optional)'}" for name, field in model.model_fields.items())
        raise ToolArgumentsError(f"{problems} (its arguments: {expected or 'none'})") from None
    values = {name: getattr(validated, name) for name in model.model_fields}
    for name, given in arguments.items():  # what the model wrote, where checking only confirmed it (2, not 2.0)
        if name in values and _equal(given, values[name]):
            values[name] = given
    return {**values, **(validated.model_extra or {})}


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an object whose == does not answer a bool
        return False


def _said(error: dict[str, Any]) -> str:
    if error["type"] == "missing":
        return "missing"
    if error["type"] == "extra_forbidden":
        return "not an argument of this tool"
    return f"{error['msg']}, got {error['input']!r}"


def load_tool(spec: str | Callable[..., Any]) -> Tool:
    """A tool from a function, a registered name or an import path. Raises ValueError naming the tool."""
    if callable(spec):
        fn, source = spec, f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', spec)}"
    elif isinstance(spec, str) and isinstance(_TOOLS.get(spec), Tool):
        return _TOOLS[spec]
    elif isinstance(spec, str) and spec in _TOOLS:
        fn, source = _TOOLS[spec], spec
    elif isinstance(spec, str) and ("." in spec or ":" in spec):
        fn, source = import_object(spec, what="tool"), spec
    else:
        known = ", ".join(registered_tools()) or "none"
        raise ValueError(
            f"tool {spec!r} is neither a registered tool (registered: {known}) nor an import path "
            f"such as 'pkg.module.fn' or 'path/to/file.py:fn'."
        )
    if not callable(fn) or isinstance(fn, type):
        raise ValueError(f"tool {source!r} is a {type(fn).__name__}, not a function.")
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # transformers raises its own TypeError/ValueError subclasses
        raise ValueError(
            f"tool {source!r}: {exc}. The model reads each tool's description: give the function type "
            f"hints and a docstring with an 'Args:' section describing every argument."
        ) from exc
    return Tool(name=schema["function"]["name"], fn=fn, schema=schema, source=source)


def load_tools(specs: list[Any]) -> list[Tool]:
    """Tools in order, refusing two with the same name (the model could not tell them apart)."""
    tools: list[Tool] = []
    for spec in specs:
        group = _TOOLS.get(spec) if isinstance(spec, str) else None
        # AWorld's rule: a name also selects the async tool class registered as async_<name> (ToolFactory's asyn=True)
        prefixed = _TOOLS.get(f"async_{spec}") if isinstance(spec, str) else None
        if hasattr(group, "expand"):
            tools.extend(group.expand())
        elif group is not None or not hasattr(prefixed, "expand"):
            tools.append(load_tool(spec))
        if hasattr(prefixed, "expand"):
            tools.extend(prefixed.expand())
    seen: dict[str, str] = {}
    for tool in tools:
        if tool.name in seen:
            raise ValueError(f"tools {seen[tool.name]!r} and {tool.source!r} are both named {tool.name!r}; rename one.")
        seen[tool.name] = tool.source
    return tools


def tools_prompt(schemas: list[dict[str, Any]]) -> str:
    """The text that tells the model which tools it has and how to call them."""
    listed = "\n".join(json.dumps(schema, sort_keys=True) for schema in schemas)
    return (
        "# Tools\n\n"
        "You may call the functions below to help answer. Their signatures, inside <tools></tools>:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "To call one, write a JSON object with its name and arguments inside <tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
        "When you have the answer, reply without a tool call."
    )


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote. ``error`` says why it cannot be run (bad JSON, no name)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order (none: a final answer)."""
    calls = []
    for body in _TOOL_CALL.findall(text):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall("", {}, f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(ToolCall("", {}, 'a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append(ToolCall(payload["name"], {}, "the arguments of a tool call must be a JSON object"))
            continue
        calls.append(ToolCall(payload["name"], arguments))
    return calls
