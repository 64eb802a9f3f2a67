"""rLLM's tool API: ``Tool`` classes with a JSON schema and ``forward``/``async_forward``, their
``ToolOutput``, a registry of tools by name (``python``) and ``MultiTool``, which holds an agent's
or environment's tools and calls one by name.

rLLM code ports by its import lines (``from rllm.tools.tool_base import Tool, ToolOutput`` ->
``from training import Tool, ToolOutput``). The tool-call format the model writes is the one
``training.agents.tools`` reads (Hermes/Qwen ``<tool_call>{json}</tool_call>``), shared with the chat agents.

The ``python`` tool runs the model's code in ``training.isolation.sandbox`` (a child interpreter with
resource limits, no network, no new processes, and files only in its own temporary folder).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable

from training.isolation import jail, sandbox
from training.utils import import_object
from training.agents.tools import load_tool


@dataclass
class ToolOutput:
    """What a tool returns: its ``output`` (text, or a list or dict sent as JSON), or an ``error``."""

    name: str
    output: str | list | dict | None = None
    error: str | None = None
    metadata: dict | None = None

    def __str__(self) -> str:
        if self.error:
            return f"Error: {self.error}"
        if self.output is None:
            return ""
        if isinstance(self.output, (list, dict)):
            return json.dumps(self.output)
        return str(self.output)

    def to_string(self) -> str:
        """The text the model reads as the tool's result."""
        return str(self)


@dataclass
class CodeToolOutput(ToolOutput):
    """A code tool's result: the last expression's value (``output``), else what it printed, else its errors."""

    stdout: str | None = None
    stderr: str | None = None

    def to_string(self) -> str:
        if self.error:
            return f"Error: {self.error}" + (f"\n{self.stderr}" if self.stderr else "")
        for text in (self.output, self.stdout, self.stderr):
            if text:
                return str(text)
        return ""


class Tool:
    """A tool the model may call: its ``name``, ``description`` and ``json`` (OpenAI's function
    schema). Subclasses implement ``forward`` (or ``async_forward``) and, unless built from a
    function, the ``json`` property. ``Tool(function=fn)`` wraps a typed, documented function."""

    def __init__(self, name: str | None = None, description: str | None = None, function: Callable | None = None) -> None:
        self.name = name
        self.description = description
        self.function = function
        if function is not None:
            self._json = load_tool(function).schema
            self.name = name or self._json["function"]["name"]
            self.description = description or self._json["function"].get("description", "")
            return
        if name is None or description is None:
            raise ValueError(f"{type(self).__name__}: a tool needs a name and a description (or function=).")
        schema = self.json
        if not isinstance(schema, dict) or "function" not in schema:
            raise ValueError(
                f"tool {name!r} ({type(self).__name__}): its json property must return an OpenAI function schema "
                '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}.'
            )

    @property
    def json(self) -> dict[str, Any] | None:
        """The tool's OpenAI function schema."""
        return getattr(self, "_json", None)

    def forward(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Run the tool. A tool built from a function calls it; others override this."""
        if self.function is None:
            raise NotImplementedError(f"{type(self).__name__} must implement forward() or async_forward().")
        try:
            return ToolOutput(name=self.name or "tool", output=self.function(*args, **kwargs))
        except Exception as exc:  # the model reads what went wrong and may call again
            return ToolOutput(name=self.name or "tool", error=f"{type(exc).__name__} - {exc}")

    async def async_forward(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Run the tool from async code; by default ``forward`` in a worker thread."""
        return await asyncio.to_thread(self.forward, *args, **kwargs)

    def __call__(self, *args: Any, use_async: bool | None = None, **kwargs: Any) -> Any:
        """``forward(...)``, or the coroutine of ``async_forward(...)`` with ``use_async=True`` or
        when only ``async_forward`` is written (rLLM's routing)."""
        if use_async or (use_async is None and self._async_only()):
            return self.async_forward(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def _async_only(self) -> bool:
        cls = type(self)
        return cls.async_forward is not Tool.async_forward and cls.forward is Tool.forward and self.function is None

    def run(self, arguments: dict[str, Any]) -> ToolOutput:
        """Call the tool with the model's arguments from synchronous code (an environment's step,
        which runs in a worker thread); whatever it raises becomes an error the model reads."""
        try:
            if self._async_only():
                result = asyncio.run(self.async_forward(**arguments))
            else:
                result = self.forward(**arguments)
        except Exception as exc:
            return ToolOutput(name=self.name or "tool", error=f"{self.name} raised {type(exc).__name__}: {exc}")
        if inspect.isawaitable(result):  # a forward written as a coroutine
            result = asyncio.run(_awaited(result))
        if not isinstance(result, ToolOutput):
            result = ToolOutput(name=self.name or "tool", output=result)
        return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class PythonInterpreter(Tool):
    """rLLM's ``python`` tool: runs the model's code and answers with the value of its last
    expression, else what it printed, else its errors. Here the code always runs in the local
    sandbox (``training.isolation.sandbox``); rLLM's remote backends (E2B, Together) are not available."""

    DESCRIPTION = "Execute Python code in a sandboxed environment. Returns results and standard output/error."

    def __init__(self, name: str = "python", description: str = DESCRIPTION, backend: str = "local",
                 memory_mb: int = sandbox.DEFAULT_MEMORY_MB, **kwargs: Any) -> None:
        if backend != "local":
            raise ValueError(f"PythonInterpreter backend {backend!r} is not available here: code runs in the local sandbox (backend='local').")
        unknown = set(kwargs) - {"n_sandboxes", "api_key"}  # rLLM's remote backends' settings, unused locally
        if unknown:
            raise ValueError(f"PythonInterpreter: unknown argument(s) {sorted(unknown)}.")
        jail.require()  # no jail, no tool: refused when the agent is built, not at its first call
        self.memory_mb = memory_mb
        super().__init__(name=name, description=description)

    @property
    def json(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "Python code to execute; the value of its last line is returned."},
                        "timeout": {"type": "integer", "description": "Maximum execution time in seconds", "default": sandbox.DEFAULT_TIMEOUT_S},
                    },
                    "required": ["code"],
                },
            },
        }

    def forward(self, code: str, timeout: int = sandbox.DEFAULT_TIMEOUT_S, **kwargs: Any) -> CodeToolOutput:
        if not isinstance(code, str):
            return CodeToolOutput(name=self.name, error=f"code must be a string, got {type(code).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            timeout = sandbox.DEFAULT_TIMEOUT_S
        run = sandbox.run_python(code, timeout_s=timeout, memory_mb=self.memory_mb)
        error = f"the code was stopped: it {run.stopped}" if run.stopped else None
        return CodeToolOutput(name=self.name, output=run.result, stdout=run.stdout or None, stderr=run.stderr or None,
                              error=error, metadata={"namespaces": run.namespaces, "syscalls_filtered": run.syscalls_filtered})


class ToolRegistry:
    """Tool classes by name (rLLM's ``tool_registry``): ``ToolAgent(tools=["python"])`` looks them up here."""

    def __init__(self) -> None:
        self._tools: dict[str, type[Tool]] = {}

    def register(self, name: str, tool_cls: type[Tool]) -> None:
        if not (isinstance(tool_cls, type) and issubclass(tool_cls, Tool)):
            raise TypeError(f"tool {name!r}: a tool class must be a subclass of training.Tool, got {tool_cls!r}.")
        self._tools[name] = tool_cls

    def register_all(self, tools: dict[str, type[Tool]]) -> None:
        for name, tool_cls in tools.items():
            self.register(name, tool_cls)

    def get(self, name: str) -> type[Tool] | None:
        return self._tools.get(name)

    def instantiate(self, name: str, *args: Any, **kwargs: Any) -> Tool | None:
        tool_cls = self.get(name)
        return None if tool_cls is None else tool_cls(*args, **kwargs)

    def unregister(self, name: str) -> bool:
        return self._tools.pop(name, None) is not None

    def list_tools(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self):
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)


tool_registry = ToolRegistry()
tool_registry.register("python", PythonInterpreter)


class MultiTool(Tool):
    """An agent's or environment's tools: by registered name (``tools=["python"]``) or as a map of
    name to ``Tool`` class or its import path (``tool_map={"local_search": LocalRetrievalTool}``,
    each built with ``name=``). ``json`` lists their schemas; calling it with ``tool_name=`` runs that tool."""

    def __init__(self, tools: list[str] | None = None, tool_map: dict[str, type[Tool]] | None = None) -> None:
        if tools is not None and tool_map is not None:
            raise ValueError("give 'tools' (registered names) or 'tool_map' (name -> Tool class), not both.")
        self.tool_map: dict[str, Tool] = {}
        if tool_map is not None:
            if not isinstance(tool_map, dict):
                raise ValueError(f"tool_map must map tool names to Tool classes, got {type(tool_map).__name__}.")
            for name, tool_cls in tool_map.items():
                if isinstance(tool_cls, str):  # an import path, as a registry entry's JSON arguments hold it
                    tool_cls = import_object(tool_cls, what=f"tool_map[{name!r}]")
                if not (isinstance(tool_cls, type) and issubclass(tool_cls, Tool)):
                    raise ValueError(f"tool_map[{name!r}] must be a subclass of training.Tool, got {tool_cls!r}.")
                self.tool_map[name] = tool_cls(name=name)
        for name in tools or []:
            if name not in tool_registry:
                raise ValueError(f"tool {name!r} is not a registered tool (registered: {', '.join(tool_registry.list_tools())}); "
                                 "give tool_map={name: ToolClass} for tools of your own.")
            self.tool_map[name] = tool_registry.instantiate(name)
        self.tools = list(self.tool_map)
        self.name, self.description, self.function = "multi_tool", "the tools of an agent", None

    @property
    def json(self) -> list[dict[str, Any]]:
        return [tool.json for tool in self.tool_map.values()]

    def forward(self, *args: Any, tool_name: str, **kwargs: Any) -> ToolOutput:
        if tool_name not in self.tool_map:
            return ToolOutput(name=tool_name, error=f"there is no tool {tool_name!r}; the tools are: {', '.join(self.tool_map) or 'none'}")
        return self.tool_map[tool_name].run(kwargs)
