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

import inspect
from typing import Any, Callable

from training.agents.tools import Tool, arguments_model, register_tool_object
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
