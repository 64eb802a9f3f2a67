"""AWorld's MCP servers for its ``Agent(mcp_config=..., mcp_servers=[...])``::

    mcp_config = {"mcpServers": {
        "GorillaFileSystem": {"type": "stdio", "command": "python", "args": ["mcp_tools/gorilla_file_system.py"]},
        "simple-calculator": {"type": "sse", "url": "https://calc.example.com/sse", "timeout": 5, "sse_read_timeout": 300},
    }}
    Agent(name=..., mcp_servers=["GorillaFileSystem"], mcp_config=mcp_config)

As in AWorld, only the servers ``mcp_servers`` names are used (a name that ``mcpServers`` lacks is
refused here), an entry with ``disabled: true`` is left out, an entry without ``type`` is a stdio
server, and each tool is offered to the model as ``<server>__<tool>`` (AWorld's
``mcp_tool_desc_transform``), with the server's description and input schema.

The entries are data: checked when the ``Agent`` is built (nothing is started then), started by the
trainer (``start``) and stopped when training, inference or a failed construction ends (``stop``).
Through rLLM's ``MCPConnectionManager`` (one MCP client for the whole library):

- a stdio server runs in the platform's jail (``jailed=True``: an unprivileged user, no network, only
  the ``env`` given, read-only views of what its command line names and a writable folder of its own);
- a URL server (``sse``, ``streamable-http``) is reached only through the egress guard: an internal
  address (loopback, private, link-local such as 169.254.169.254) is refused unless an
  administrator allows its host in ``EGRESS_ALLOWED_HOSTS``.

A server that cannot be started is named, with what it wrote to stderr (``MCPServerError``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from training.agents.tools import Tool
from training.log import logger

# AWorld's entry fields (aworld/mcp_client/utils.py): the ones used here, and the ones accepted with no effect.
STDIO_FIELDS = {"type", "command", "args", "env", "cwd", "disabled"}
URL_FIELDS = {"type", "url", "headers", "timeout", "sse_read_timeout", "disabled"}
NO_EFFECT_FIELDS = {"client_session_timeout_seconds", "encoding", "encoding_error_handler", "description", "desc"}
MAX_SERVERS = 16
MAX_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ServerEntry:
    """One ``mcpServers`` entry, checked."""

    name: str
    type: str  # stdio, sse, streamable-http
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float | None = None
    sse_read_timeout: float | None = None

    def describe(self) -> dict[str, Any]:
        """For config.yaml: what the entry runs, the values of ``env`` and ``headers`` left out
        (they hold keys and tokens), and a URL without credentials or query."""
        from training.compat.rllm.mcp_env import _shown_url

        if self.type == "stdio":
            return {"type": "stdio", "command": self.command, "args": list(self.args),
                    "env": sorted(name for name, _ in self.env), **({"cwd": self.cwd} if self.cwd else {})}
        return {"type": self.type, "url": _shown_url(self.url or ""), "headers": sorted(name for name, _ in self.headers)}


def parse_mcp_config(mcp_servers: Any, mcp_config: Any) -> list[ServerEntry]:
    """The servers an agent uses: those of ``mcp_config['mcpServers']`` that ``mcp_servers`` names
    (any iterable of names, as AWorld's BFCL example passes ``dict.keys()``). ValueError naming the
    field and the server when an entry is not AWorld's form."""
    if mcp_config is None or mcp_config == {}:
        if mcp_servers:
            raise ValueError(f"mcp_servers names {sorted(map(str, mcp_servers))} but there is no mcp_config: give "
                             "mcp_config={'mcpServers': {name: {'command': ..., 'args': [...]} or {'type': 'sse', 'url': ...}}}.")
        return []
    if not isinstance(mcp_config, dict) or not isinstance(mcp_config.get("mcpServers"), dict):
        raise ValueError("mcp_config must be {'mcpServers': {name: entry}} (AWorld's form), got "
                         f"{sorted(mcp_config) if isinstance(mcp_config, dict) else type(mcp_config).__name__}.")
    servers = mcp_config["mcpServers"]
    if isinstance(mcp_servers, (str, bytes)) or (mcp_servers is not None and not hasattr(mcp_servers, "__iter__")):
        raise ValueError(f"mcp_servers must be a list of server names, got {mcp_servers!r}.")
    names = list(mcp_servers or [])
    if not names:
        logger.warning("mcp_config is given without mcp_servers: as in AWorld, no server is used (name them in mcp_servers)")
        return []
    missing = [name for name in names if name not in servers]
    if missing:
        raise ValueError(f"mcp_servers names {missing}, which mcp_config['mcpServers'] does not have (it has: "
                         f"{', '.join(map(str, servers)) or 'none'}).")
    if len(names) > MAX_SERVERS:
        raise ValueError(f"mcp_servers names {len(names)} servers; at most {MAX_SERVERS}.")
    entries = []
    for name in dict.fromkeys(names):
        entry = _entry(str(name), servers[name])
        if entry is not None:
            entries.append(entry)
    return entries


def _entry(name: str, fields: Any) -> ServerEntry | None:
    where = f"mcp_config['mcpServers'][{name!r}]"
    if not isinstance(fields, dict):
        raise ValueError(f"{where} must be a mapping, got {type(fields).__name__}.")
    if fields.get("disabled"):
        logger.info("MCP server %r is disabled in mcp_config: not used", name)
        return None
    kind = fields.get("type") or "stdio"
    if kind not in ("stdio", "sse", "streamable-http"):
        hint = " (AWorld's function_tool and api servers are not supported: give Python functions in tool_names)" \
            if kind in ("function_tool", "api") else ""
        raise ValueError(f"{where}: type {kind!r} is not one of stdio, sse, streamable-http{hint}.")
    known = STDIO_FIELDS if kind == "stdio" else URL_FIELDS
    unknown = sorted(set(fields) - known - NO_EFFECT_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown} for a {kind} server; its fields are {sorted(known)}.")
    ignored = sorted(set(fields) & NO_EFFECT_FIELDS)
    if ignored:
        logger.info("MCP server %r: %s accepted, no effect here", name, ", ".join(ignored))
    if kind == "stdio":
        command, args, env, cwd = fields.get("command"), fields.get("args") or [], fields.get("env") or {}, fields.get("cwd")
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"{where}: a stdio server needs 'command' (its executable), got {command!r}.")
        if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"{where}: 'args' must be a list of strings.")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in env.items()):
            raise ValueError(f"{where}: 'env' must map variable names to strings.")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"{where}: 'cwd' must be a folder's path.")
        return ServerEntry(name, "stdio", command=command, args=tuple(args), cwd=cwd,
                           env=tuple(sorted((k, str(v)) for k, v in env.items())))
    url, headers = fields.get("url"), fields.get("headers") or {}
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}: a {kind} server needs 'url', an http(s) URL.")
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError(f"{where}: 'headers' must map header names to strings.")
    timeouts = {}
    for key in ("timeout", "sse_read_timeout"):
        value = fields.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT_S):
            raise ValueError(f"{where}: {key!r} must be a number of seconds from 0 to {MAX_TIMEOUT_S:g}, got {value!r}.")
        timeouts[key] = float(value) if value is not None else None
    return ServerEntry(name, kind, url=url, headers=tuple(sorted(headers.items())), **timeouts)


@dataclass(frozen=True)
class MCPServerTool(Tool):
    """One tool of a running MCP server, as the chat agent offers it (``<server>__<tool>``): a call
    goes to the server (its arguments are checked there, against the tool's input schema); a tool
    error is raised as ``MCPToolError``, which the environment hands back to the model."""

    server_tool: str = ""
    servers: "MCPServers | None" = None

    def call(self, arguments: dict[str, Any]) -> str:
        if not isinstance(arguments, dict):
            raise TypeError("the arguments of a tool call must be a JSON object")
        return self.servers.call(self.source, self.server_tool, arguments)


class MCPServers:
    """The servers of one agent: started together (``start``: a failure stops those already started
    and names the server), their tools as ``MCPServerTool``, stopped together (``stop``)."""

    def __init__(self, entries: list[ServerEntry], agent: str = "agent") -> None:
        self.entries = entries
        self.agent = agent
        self._managers: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.tools: list[MCPServerTool] = []
        self.listed = False  # whether the tools were listed (the servers ran at least once)

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def running(self) -> bool:
        return bool(self._managers) and all(manager.running for manager in self._managers.values())

    def start(self) -> None:
        """Start every server (in the jail, or through the egress guard) and list their tools;
        ``MCPServerError`` naming the agent, the server and its stderr when one fails."""
        from training.compat.rllm.mcp_env import MCPConnectionManager
        from training.errors import MCPServerError

        with self._lock:
            if self.running:
                return
            tools: list[MCPServerTool] = []
            try:
                for entry in self.entries:
                    manager = self._managers.get(entry.name)
                    if manager is None:
                        if entry.type == "stdio":
                            manager = MCPConnectionManager(entry.command, list(entry.args), dict(entry.env), cwd=entry.cwd, jailed=True)
                        else:
                            manager = MCPConnectionManager(url=entry.url, transport=entry.type, headers=dict(entry.headers),
                                                           http_timeout=entry.timeout, sse_read_timeout=entry.sse_read_timeout)
                        self._managers[entry.name] = manager
                    try:
                        manager.start()
                    except MCPServerError as exc:
                        raise MCPServerError(f"agent {self.agent!r}: MCP server {entry.name!r} (mcp_config): {exc}") from exc
                    for tool_name, tool in manager.tool_map.items():
                        if tool_name != tool.name:
                            continue  # rLLM's underscore alias of a hyphenated name: AWorld offers the name itself
                        name = f"{entry.name}__{tool.name}"
                        schema = {"type": "function", "function": {"name": name, "description": tool.description or name,
                                                                   "parameters": tool.json["function"]["parameters"]}}
                        tools.append(MCPServerTool(name=name, fn=_no_direct_call, schema=schema, source=entry.name,
                                                   server_tool=tool.name, servers=self))
            except BaseException:
                self._stop_locked()
                raise
            if not self.listed:
                self.tools = tools
                self.listed = True
            elif [t.name for t in tools] != [t.name for t in self.tools]:
                logger.warning("agent %r: its MCP servers now offer %s; the model was given %s when the trainer was built",
                               self.agent, ", ".join(t.name for t in tools), ", ".join(t.name for t in self.tools))

    def call(self, server: str, tool: str, arguments: dict[str, Any]) -> str:
        manager = self._managers.get(server)
        if manager is None:
            from training.errors import MCPServerError

            raise MCPServerError(f"MCP server {server!r} is not running (it runs from the trainer's construction to the end of training)")
        return manager.call_tool(tool, arguments)

    def stop(self) -> None:
        """Stop every server; does nothing when none runs."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        managers, self._managers = self._managers, {}
        for manager in managers.values():
            manager.stop()

    def describe(self) -> dict[str, Any]:
        return {entry.name: entry.describe() for entry in self.entries}


def _no_direct_call(**arguments: Any) -> Any:  # pragma: no cover - MCPServerTool.call goes to the server
    raise RuntimeError("an MCP server's tool is called through its server")
