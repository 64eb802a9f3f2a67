"""rLLM's MCP environment and tool, written here with rLLM v0.2.1.post1's behaviour on the official
``mcp`` SDK, so that its MCP example ports by its import lines:

    from rllm.environments.tools.mcp_env import MCPConnectionManager, MCPEnvironment
        ->  from training.compat.rllm.mcp_env import MCPConnectionManager, MCPEnvironment
    from rllm.tools.mcp_tool import MCPTool  ->  from training.compat.rllm.mcp_env import MCPTool

(``from training import MCPEnvironment, MCPConnectionManager, MCPTool`` works too; the agent,
``MCPToolAgent``, is with the other library agents in ``training.compat.rllm.agents``.)

- ``MCPConnectionManager(command, args, env)`` runs one MCP server over stdio: the SDK's
  ``stdio_client`` and ``ClientSession`` live on an event loop of the manager's own thread, so that
  synchronous code (an environment's ``step`` in a worker thread) and coroutines on any other loop
  can call the server's tools; ``tool_map`` holds one ``MCPTool`` per tool.
- ``MCPEnvironment`` answers a ``ToolAgent``'s calls with the server's tools and scores the final
  answer with ``reward_fn`` (rLLM's search reward unless given). Environments that name the same
  server share one process: the first starts it, the last one closed stops it.

Failures are named: a server that cannot be started (with the end of what it wrote to stderr), a
server that goes away during a call (the episode fails with ``MCPServerError``), and a tool that
reports an error or does not answer within the timeout (``MCPToolError``; inside an episode the
model reads it as the tool's result, since calling tools well is part of what is learnt).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import shlex
import shutil
import tempfile
import threading
import weakref
from urllib.parse import urlsplit, urlunsplit
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx2
    from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, PaginatedRequestParams, TextContent
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("training.mcp_env needs the MCP SDK: pip install 'agent-trainer[mcp]' (or pip install mcp).") from exc

from training.agents.base import split_settings
from training.isolation.egress import EgressProxy, Guard
from training.isolation.jail import Jail, interpreter, refusing_programs
from training.errors import EgressRefused, MCPServerError, MCPToolError, ProgramsRefused
from training.compat.rllm.tool_env import ToolEnvironment
from training.log import logger
from training.rewards import load_reward, search_reward_fn
from training.compat.rllm.tools import Tool, ToolOutput

# rLLM waits 30 s for a server to start and for each call; so do we, by default.
DEFAULT_STARTUP_TIMEOUT_S = 30.0
DEFAULT_CALL_TIMEOUT_S = 30.0
# A URL server's HTTP requests, and how long an SSE stream may stay silent (the SDK's defaults).
DEFAULT_HTTP_TIMEOUT_S = 30.0
DEFAULT_SSE_READ_TIMEOUT_S = 300.0
TRANSPORTS = ("stdio", "sse", "streamable-http")
# The SDK's shutdown: stdin closed, 2 s to exit, SIGTERM to the process group, 2 s, SIGKILL.
_STOP_TIMEOUT_S = 10.0
_STDERR_TAIL_LINES = 15


class MCPConnectionManager:
    """One MCP server run over stdio, usable from any thread (rLLM's ``MCPConnectionManager``).

    ``mcp_server_env`` is added to the few variables the SDK passes on (``PATH``, ``HOME``, ...).
    ``start()`` launches the server, completes the MCP handshake and lists its tools into
    ``tool_map`` (name -> ``MCPTool``; a hyphenated name also under its underscore alias, as rLLM
    does, since models write ``tavily_search`` for ``tavily-search``). ``stop()`` ends the session and
    the server process (the SDK closes its stdin, then terminates its process group); it is also
    used as a context manager, and managers still running when the interpreter exits are stopped then.

    Two more ways to reach a server, for servers whose configuration is not the process's own code
    (AWorld's ``mcp_config``, ``training.compat.aworld.mcp``):

    - ``jailed=True``: the stdio server runs in the platform's jail (``training.isolation.jail``: a
      mount namespace as an unprivileged user, no network, only the environment given). It sees the
      system's programs, the interpreter and its packages, and what the command line names: the
      command's file, each argument naming an existing file or folder (relative to ``cwd``, made
      absolute) and ``cwd`` itself, all read-only; and a fresh writable folder of its own, its
      ``HOME`` and ``TMPDIR`` (removed when it stops). ``python`` (``python3``) is this interpreter.
    - ``url=...`` with ``transport="sse"`` or ``"streamable-http"``: a server reached over HTTP,
      only through the egress guard (``training.isolation.egress``): its URL is judged before the
      first connection (an internal address is refused, named) and every connection goes through an
      ``EgressProxy`` that connects only to addresses it judged, so no redirect or DNS answer reaches
      one either. ``headers`` are sent with each request; ``http_timeout`` and ``sse_read_timeout``
      (seconds) bound them.
    """

    def __init__(
        self,
        mcp_server_command: str | None = None,
        mcp_server_args: list[str] | None = None,
        mcp_server_env: dict[str, str] | None = None,
        *,
        cwd: str | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
        jailed: bool = False,
        url: str | None = None,
        transport: str = "stdio",
        headers: dict[str, str] | None = None,
        http_timeout: float | None = None,
        sse_read_timeout: float | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}.")
        if (transport == "stdio") != (url is None):
            raise ValueError("an MCP server is a command (transport='stdio') or a url (transport='sse' or 'streamable-http').")
        if url is not None and (not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname):
            raise ValueError(f"url must be an http(s) URL with a host, got {_shown_url(str(url))!r}.")
        if headers is not None and not (isinstance(headers, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise ValueError("headers must map header names to strings.")
        self.url, self.transport, self.headers = url, transport, dict(headers or {})
        self.http_timeout = http_timeout if http_timeout is not None else DEFAULT_HTTP_TIMEOUT_S
        self.sse_read_timeout = sse_read_timeout if sse_read_timeout is not None else DEFAULT_SSE_READ_TIMEOUT_S
        self.jailed = jailed
        self._workdir: str | None = None  # a jailed server's own folder
        self._proxy: EgressProxy | None = None  # a URL server's egress proxy
        if url is not None:
            mcp_server_command = mcp_server_command or "-"
        if not isinstance(mcp_server_command, str) or not mcp_server_command.strip():
            raise ValueError(f"mcp_server_command must be the server's executable, got {mcp_server_command!r}.")
        if mcp_server_args is not None and not (isinstance(mcp_server_args, (list, tuple)) and all(isinstance(a, str) for a in mcp_server_args)):
            raise ValueError(f"mcp_server_args must be a list of strings, got {mcp_server_args!r}.")
        if mcp_server_env is not None and not (isinstance(mcp_server_env, dict) and all(isinstance(v, str) for v in mcp_server_env.values())):
            raise ValueError("mcp_server_env must map variable names to strings.")
        self.mcp_server_command = mcp_server_command
        self.mcp_server_args = list(mcp_server_args or [])
        self.mcp_server_env = dict(mcp_server_env) if mcp_server_env is not None else None
        self.cwd = cwd
        self.startup_timeout = startup_timeout
        self.call_timeout = call_timeout
        self.tool_map: dict[str, MCPTool] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._serving: concurrent.futures.Future | None = None
        self._serve_task: asyncio.Task | None = None
        self._session: ClientSession | None = None
        self._stop_requested: asyncio.Event | None = None
        self._stderr: Any = None
        self._lost: str | None = None  # why the connection ended while it was wanted

    @property
    def server(self) -> str:
        """The server's command line (a URL server: its URL without credentials or query), as messages name it."""
        if self.url is not None:
            return _shown_url(self.url)
        return shlex.join([self.mcp_server_command, *self.mcp_server_args])

    @property
    def running(self) -> bool:
        """Whether the session is open and the server has not gone away."""
        return self._session is not None and self._lost is None

    def __repr__(self) -> str:
        return f"MCPConnectionManager(`{self.server}`, {'running' if self.running else 'stopped'})"

    def __enter__(self) -> "MCPConnectionManager":
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the server and list its tools; raises ``MCPServerError`` naming the command (and
        ending with what the server wrote to stderr) when it cannot be spawned, exits, or does not
        complete the handshake within ``startup_timeout`` seconds. Does nothing when running."""
        with self._lock:
            if self.running:
                return
            self._shutdown()  # what is left of a connection that was lost
            self._lost = None
            self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp {self.server}"[:60], daemon=True)
            self._thread.start()
            ready: concurrent.futures.Future = concurrent.futures.Future()
            self._serving = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
            try:
                ready.result(timeout=self.startup_timeout)
            except concurrent.futures.TimeoutError:
                tail = self._stderr_tail()
                self._shutdown()
                raise MCPServerError(f"MCP server `{self.server}` did not complete the MCP handshake within "
                                     f"{self.startup_timeout:g} s{tail}") from None
            except Exception as exc:
                tail = self._stderr_tail()
                refused = _refusal(exc, self._proxy)
                self._shutdown()
                if refused:
                    raise MCPServerError(f"MCP server `{self.server}` was not reached: {refused}") from exc
                raise MCPServerError(f"MCP server `{self.server}` failed to start: {_describe(exc)}{tail}") from exc
            _started.add(self)
            logger.info("MCP server `%s` started; tools: %s", self.server, ", ".join(self.tool_map) or "none")

    def stop(self) -> None:
        """End the session and the server process; does nothing when not running."""
        with self._lock:
            self._shutdown()
            _started.discard(self)

    async def _serve(self, ready: concurrent.futures.Future) -> None:
        """The connection's whole life in one task, as the SDK's context managers require: open,
        list the tools, report ready, wait for ``stop``, close."""
        self._serve_task = asyncio.current_task()
        self._stop_requested = asyncio.Event()
        try:
            async with self._transport() as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                self.tool_map = self._tools_by_name(await _list_all_tools(session))
                self._session = session
                ready.set_result(None)
                await self._stop_requested.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else MCPServerError(f"start cancelled ({type(exc).__name__})"))
            raise
        finally:
            self._session = None

    @contextlib.asynccontextmanager
    async def _transport(self):
        """The streams to the server: a process's stdin and stdout (in the jail when ``jailed``), or
        an HTTP connection through the egress guard."""
        if self.url is None:
            parameters = (self._jailed_parameters() if self.jailed else
                          StdioServerParameters(command=self.mcp_server_command, args=self.mcp_server_args,
                                                env=self.mcp_server_env, cwd=self.cwd))
            async with stdio_client(parameters, errlog=self._stderr) as streams:
                yield streams
            return
        guard = Guard()
        guard.check_url(self.url)  # a clear refusal before anything is sent; the proxy judges every connection again
        self._proxy = proxy = EgressProxy(guard)

        def client(headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None) -> "httpx2.AsyncClient":
            # every request through the guard's proxy, whatever the environment says (trust_env=False)
            return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, proxy=proxy.url, trust_env=False)

        try:
            if self.transport == "sse":
                async with sse_client(self.url, headers=self.headers, timeout=self.http_timeout,
                                      sse_read_timeout=self.sse_read_timeout, httpx_client_factory=client) as streams:
                    yield streams
            else:
                timeout = httpx2.Timeout(self.http_timeout, read=self.sse_read_timeout)
                async with client(headers=self.headers, timeout=timeout) as http, \
                        streamable_http_client(self.url, http_client=http) as streams:
                    yield streams
        finally:
            proxy.close()

    def _jailed_parameters(self) -> StdioServerParameters:
        """The stdio parameters that start the server in the jail (see the class doc)."""
        base = os.path.abspath(self.cwd or os.getcwd())
        command = self.mcp_server_command
        if command in ("python", "python3"):
            command = interpreter()
        elif os.sep not in command:
            found = shutil.which(command)
            if found is None:
                raise FileNotFoundError(f"the command {command!r} is not on this machine's PATH")
            command = found
        else:
            command = os.path.join(base, command)
        read_only = [command] + ([base] if self.cwd else [])
        args = []
        for arg in self.mcp_server_args:
            path = os.path.join(base, arg) if arg and not arg.startswith("-") else None
            if path is not None and os.path.exists(path):
                read_only.append(path)
                arg = os.path.abspath(path)
            args.append(arg)
        if "/" in {os.path.realpath(path) for path in read_only}:  # the whole machine is never what a server is given
            raise ValueError("a jailed server is never shown the machine's root folder ('/'): name the folders it needs")
        self._workdir = workdir = tempfile.mkdtemp(prefix="mcp-server-")
        env = {"PATH": f"{os.path.dirname(interpreter())}:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
               "LANG": "C.UTF-8", **(self.mcp_server_env or {})}
        # The jail dies with the manager's thread, which lives as long as the connection.
        jail = Jail(workdir=base if self.cwd else workdir, read_only=tuple(read_only), writable=(workdir,), env=env)
        argv = jail.command([command, *args])
        return StdioServerParameters(command=argv[0], args=argv[1:], env={})

    def _tools_by_name(self, tools: list[Any]) -> dict[str, MCPTool]:
        by_name: dict[str, MCPTool] = {}
        for tool in tools:
            wrapped = MCPTool(self, tool.name, tool.description, tool.input_schema)
            by_name[tool.name] = wrapped
            by_name.setdefault(tool.name.replace("-", "_"), wrapped)
        return by_name

    def _shutdown(self) -> None:
        """End the serving task (normally, or by cancelling a handshake still under way), then the
        loop and its thread. The caller holds ``_lock``."""
        loop, serving, thread = self._loop, self._serving, self._thread
        if loop is None:
            return
        if serving is not None and not serving.done():
            loop.call_soon_threadsafe(self._end_serving)
            done, _ = concurrent.futures.wait([serving], timeout=_STOP_TIMEOUT_S)
            if not done:
                logger.warning("MCP server `%s` did not stop within %s s; leaving it", self.server, _STOP_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=_STOP_TIMEOUT_S)
        if not loop.is_running():
            loop.close()
        if self._stderr is not None:
            self._stderr.close()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._loop = self._thread = self._serving = self._serve_task = self._stderr = self._workdir = None
        self._proxy = None
        self._session = None

    def _end_serving(self) -> None:
        if self._session is not None and self._stop_requested is not None:
            self._stop_requested.set()
        elif self._serve_task is not None:
            self._serve_task.cancel()

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            lines = self._stderr.read().splitlines()[-_STDERR_TAIL_LINES:]
        except (OSError, ValueError):
            return ""
        return "\nThe server's stderr ended with:\n" + "\n".join(lines) if lines else ""

    # -- calls --------------------------------------------------------------------------------------

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None) -> str:
        """Call tool ``name`` (its name or underscore alias) from synchronous code; its text.

        Raises ``MCPToolError`` when the tool reports an error or does not answer within
        ``timeout`` seconds (default ``call_timeout``), ``MCPServerError`` when the server is not
        running or goes away."""
        # The call's own timeout ends it; the margin only guards against a loop that no longer runs.
        return self.submit(name, arguments, timeout).result(timeout=(timeout or self.call_timeout) + _STOP_TIMEOUT_S)

    async def call_tool_async(self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None) -> str:
        """``call_tool`` from a coroutine on any event loop."""
        return await asyncio.wrap_future(self.submit(name, arguments, timeout))

    def submit(self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None) -> concurrent.futures.Future:
        """Start a call on the manager's loop; the future holds its text or its error."""
        loop = self._loop
        if loop is None or not self.running:
            failed: concurrent.futures.Future = concurrent.futures.Future()
            failed.set_exception(self._not_running(name))
            return failed
        return asyncio.run_coroutine_threadsafe(self._call(name, arguments or {}, timeout or self.call_timeout), loop)

    def execute_tool_calls(self, tool_calls: list[dict[str, Any]], timeout: float | None = None) -> dict[str, str]:
        """rLLM's form: OpenAI-style calls (``{"id", "function": {"name", "arguments"}}``) run
        concurrently; each call's id -> the text the model reads (a failed call's ``Error: ...``).
        ``MCPServerError`` is raised when the server is not running or goes away."""
        return _answer_tool_calls(tool_calls, self.tool_map, timeout or self.call_timeout)

    async def _call(self, name: str, arguments: dict[str, Any], timeout: float) -> str:
        session = self._session
        if session is None or self._lost is not None:
            raise self._not_running(name)
        tool = self.tool_map.get(name)
        server_name = tool.name if tool is not None else name
        try:
            result = await session.call_tool(server_name, arguments, read_timeout_seconds=timeout)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise MCPToolError(f"MCP tool {server_name!r} of server `{self.server}` did not answer within {timeout:g} s") from exc
            if exc.code == CONNECTION_CLOSED:
                self._lost = f"the connection closed during a call of tool {server_name!r}"
                raise MCPServerError(f"MCP server `{self.server}`: {self._lost}{self._stderr_tail()}") from exc
            raise MCPToolError(f"MCP tool {server_name!r} of server `{self.server}` failed: {exc}") from exc
        except Exception as exc:  # a result the SDK could not accept (not the protocol's shape, input requests)
            raise MCPToolError(f"MCP tool {server_name!r} of server `{self.server}` failed: {type(exc).__name__}: {exc}") from exc
        text = _content_text(result.content, result.structured_content)
        if result.is_error:
            raise MCPToolError(f"MCP tool {server_name!r} of server `{self.server}` reported an error: {text}")
        return text

    def _not_running(self, name: str) -> MCPServerError:
        why = self._lost or "not running (start() it first; stop() or MCPEnvironment.cleanup_global_resources() ends it)"
        return MCPServerError(f"MCP server `{self.server}` cannot call tool {name!r}: {why}")


class MCPTool(Tool):
    """One tool of an MCP server as a ``training.Tool`` (rLLM's ``MCPTool``): ``json`` is its OpenAI
    function schema, the server's input schema as ``parameters``; calling it calls the server
    through its connection. A tool error comes back as ``ToolOutput.error``; a server that is gone
    raises ``MCPServerError``."""

    def __init__(self, connection: MCPConnectionManager, tool_name: str, tool_description: str | None,
                 tool_schema: dict[str, Any] | None) -> None:
        self.connection = connection
        self._tool_schema = tool_schema or {"type": "object", "properties": {}}
        super().__init__(name=tool_name, description=tool_description or "")

    @property
    def json(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self._tool_schema}}

    def forward(self, **kwargs: Any) -> ToolOutput:
        try:
            return ToolOutput(name=self.name, output=self.connection.call_tool(self.name, kwargs))
        except MCPToolError as exc:
            return ToolOutput(name=self.name, error=str(exc))

    async def async_forward(self, **kwargs: Any) -> ToolOutput:
        try:
            return ToolOutput(name=self.name, output=await self.connection.call_tool_async(self.name, kwargs))
        except MCPToolError as exc:
            return ToolOutput(name=self.name, error=str(exc))

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r} of `{self.connection.server}`)"


def _answer_tool_calls(tool_calls: list[Any], tools: dict[str, MCPTool], timeout: float) -> dict[str, str]:
    """Each call's id -> the text the model reads: the tool's output, or ``Error: ...`` for a
    malformed call, an unknown tool or a tool error. The calls run concurrently, each on its
    server's connection; a server that is gone raises ``MCPServerError``."""
    answers: dict[str, str | concurrent.futures.Future] = {}
    for index, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        call_id = str(call.get("id", index)) if isinstance(call, dict) else str(index)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            answers[call_id] = ToolOutput(name="", error='a tool call needs {"function": {"name": ..., "arguments": ...}}').to_string()
            continue
        name, arguments = function["name"], _arguments(function.get("arguments"))
        tool = tools.get(name)
        if tool is None:
            answers[call_id] = ToolOutput(name=name, error=f"there is no tool {name!r}; the tools are: {', '.join(tools) or 'none'}").to_string()
        elif not isinstance(arguments, dict):
            answers[call_id] = ToolOutput(name=name, error="the arguments of a tool call must be a JSON object").to_string()
        else:
            answers[call_id] = tool.connection.submit(tool.name, arguments, timeout)
    texts: dict[str, str] = {}
    for call_id, answer in answers.items():
        if isinstance(answer, str):
            texts[call_id] = answer
            continue
        try:
            texts[call_id] = answer.result(timeout=timeout + _STOP_TIMEOUT_S)
        except MCPToolError as exc:
            logger.info("%s", exc)
            texts[call_id] = ToolOutput(name="", error=str(exc)).to_string()
    return texts


@dataclass(frozen=True)
class _ServerSpec:
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] | None = None
    cwd: str | None = None


@dataclass
class _SharedServers:
    """The servers that environments share, by command line, arguments, environment and folder:
    started by the first environment that names one, stopped when the last of them is closed."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    current: dict[_ServerSpec, MCPConnectionManager] = field(default_factory=dict)
    users: dict[MCPConnectionManager, int] = field(default_factory=dict)

    def acquire(self, spec: _ServerSpec, startup_timeout: float) -> MCPConnectionManager:
        with self.lock:
            manager = self.current.get(spec)
            if manager is None or not manager.running:  # none yet, or the last one went away
                if refusing_programs():
                    raise ProgramsRefused(f"MCP server `{spec.command}` is a program: it starts when the run starts, "
                                          "not while the run is checked")
                manager = MCPConnectionManager(spec.command, list(spec.args), dict(spec.env) if spec.env is not None else None,
                                               cwd=spec.cwd, startup_timeout=startup_timeout)
                manager.start()
                self.current[spec] = manager
            self.users[manager] = self.users.get(manager, 0) + 1
            return manager

    def release(self, manager: MCPConnectionManager) -> None:
        with self.lock:
            left = self.users.get(manager, 0) - 1
            if left > 0:
                self.users[manager] = left
                return
            self.users.pop(manager, None)
            for spec, current in list(self.current.items()):
                if current is manager:
                    del self.current[spec]
        manager.stop()

    def stop_all(self) -> None:
        with self.lock:
            managers = list(self.users) + [m for m in self.current.values() if m not in self.users]
            self.current.clear()
            self.users.clear()
        for manager in managers:
            manager.stop()


_shared = _SharedServers()


class MCPEnvironment(ToolEnvironment):
    """One task for a tool agent whose tools are an MCP server's (rLLM's ``MCPEnvironment``).

    ``mcp_server_command`` / ``mcp_server_args`` / ``mcp_server_env`` name the server (rLLM's
    names), or ``mcp_servers`` several, in the common ``{"name": {"command", "args", "env",
    "cwd"}}`` form (a tool name offered by two servers is refused). ``reset`` returns the task; each
    ``step`` runs the agent's OpenAI-style calls on the servers and answers ``{"tool_outputs": {id:
    text}}``; the episode ends and is scored as ``ToolEnvironment``'s (a ``finish`` call, a plain
    string or the ``max_steps``-th step; ``reward_fn(task, answer)``).

    ``reward_fn`` defaults to rLLM's ``search_reward_fn`` (the example this environment comes from
    answers HotpotQA questions with a search server; rLLM's own default scores every answer 0).
    ``tool_timeout`` bounds each call; ``startup_timeout`` a server's start.

    Environments naming the same server share one process, started by the first and stopped when
    the last is closed (``close``); ``MCPEnvironment.cleanup_global_resources()`` stops every server
    at once, as rLLM's scripts call it at their end.
    """

    def __init__(
        self,
        task: dict[str, Any] | None = None,
        mcp_server_command: str | None = None,
        mcp_server_args: list[str] | None = None,
        mcp_server_env: dict[str, str] | None = None,
        reward_fn: Any = None,
        max_steps: int = 10,
        mcp_servers: dict[str, dict[str, Any]] | None = None,
        tool_timeout: float = DEFAULT_CALL_TIMEOUT_S,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"MCPEnvironment max_steps must be a whole number of at least 1, got {max_steps!r}.")
        specs = _server_specs(mcp_server_command, mcp_server_args, mcp_server_env, mcp_servers)
        self.task = task
        self.reward_fn = load_reward(reward_fn if reward_fn is not None else search_reward_fn)
        self.max_steps = max_steps
        self.tool_timeout = tool_timeout
        self.step_count = 0
        self.connections: list[MCPConnectionManager] = []
        try:
            for spec in specs:
                self.connections.append(_shared.acquire(spec, startup_timeout))
            self.tool_map = self._merged_tools()
        except BaseException:
            self.close()
            raise

    def _merged_tools(self) -> dict[str, MCPTool]:
        tools: dict[str, MCPTool] = {}
        for connection in self.connections:
            for name, tool in connection.tool_map.items():
                other = tools.get(name)
                if other is not None and other.connection is not connection:
                    raise ValueError(f"MCP tool {name!r} is offered by two servers, `{other.connection.server}` and "
                                     f"`{connection.server}`: a call could not say which one it means.")
                tools[name] = tool
        return tools

    def reset(self) -> tuple[Any, dict]:
        self.step_count = 0
        return (self.task if self.task is not None else {}), {}

    def _run_calls(self, calls: list[Any]) -> dict[str, str]:
        return _answer_tool_calls(calls, self.tool_map, self.tool_timeout)

    def close(self) -> None:
        """Release this environment's servers; the last environment using one stops it."""
        connections, self.connections = self.connections, []
        for connection in connections:
            _shared.release(connection)

    @staticmethod
    def cleanup_global_resources() -> None:
        """Stop every server that environments started (rLLM's name)."""
        _shared.stop_all()

    @staticmethod
    def from_dict(env_args: dict) -> "MCPEnvironment":
        """``env_args`` is the dataset row merged with the environment's arguments: the server
        settings, ``reward_fn``, ``max_steps`` and the timeouts come out of the arguments (never the
        row: ``split_settings``); the rest is the task."""
        names = ("mcp_server_command", "mcp_server_args", "mcp_server_env", "mcp_servers", "reward_fn", "max_steps",
                 "tool_timeout", "startup_timeout")
        task, settings = split_settings(env_args, names)
        return MCPEnvironment(task=task, **settings)


def _server_specs(command: str | None, args: list[str] | None, env: dict[str, str] | None,
                  servers: dict[str, dict[str, Any]] | None) -> list[_ServerSpec]:
    if command is not None and servers is not None:
        raise ValueError("MCPEnvironment: give mcp_server_command (with its args and env) or mcp_servers, not both.")
    if servers is None:
        if command is None:
            raise ValueError("MCPEnvironment needs an MCP server: pass env_args={'mcp_server_command': ..., "
                             "'mcp_server_args': [...], 'mcp_server_env': {...}} (or mcp_servers={name: {...}}).")
        servers = {command: {"command": command, "args": args, "env": env}}
    if not isinstance(servers, dict) or not servers:
        raise ValueError(f"mcp_servers must map server names to {{'command', 'args', 'env', 'cwd'}}, got a {type(servers).__name__}.")
    specs = []
    for name, settings in servers.items():
        unknown = set(settings) - {"command", "args", "env", "cwd"} if isinstance(settings, dict) else None
        if unknown is None or unknown or not isinstance(settings.get("command"), str):
            given = sorted(settings) if isinstance(settings, dict) else type(settings).__name__
            raise ValueError(f"mcp_servers[{name!r}] must be {{'command': str, 'args': [...], 'env': {{...}}, 'cwd': str}}, "
                             f"got {given}.")
        server_env = settings.get("env")
        specs.append(_ServerSpec(settings["command"], tuple(settings.get("args") or ()),
                                 tuple(sorted(server_env.items())) if server_env is not None else None, settings.get("cwd")))
    return specs


async def _list_all_tools(session: ClientSession) -> list[Any]:
    tools, cursor = [], None
    while True:
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _content_text(content: list[Any], structured: Any) -> str:
    """What the model reads of a tool result: its text parts; other parts (images, resources) as JSON."""
    parts = [part.text if isinstance(part, TextContent) else part.model_dump_json(exclude_none=True) for part in content or []]
    if not parts and structured is not None:
        return json.dumps(structured)
    return "\n".join(parts)


def _shown_url(url: str) -> str:
    """A URL as messages name it: no credentials, query or fragment (where tokens are put)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if _port(parts) else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _port(parts: Any) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def _refusal(exc: BaseException, proxy: EgressProxy | None) -> str | None:
    """The egress guard's refusal behind a failed start, in its words, if that is what it was."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, EgressRefused):
        return str(exc)
    if proxy is not None and proxy.refusals:
        return proxy.refusals[-1]
    return None


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return {} if arguments is None else arguments


def _describe(exc: BaseException) -> str:
    """An exception in words; the SDK's task groups wrap the cause in exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return "the server closed the connection before the MCP handshake completed (did it exit?)"
    return f"{type(exc).__name__}: {exc}"


# Managers started and not yet stopped: stopped at interpreter exit, so that no server outlives a
# script that forgot stop() (the loops' threads are daemons, alive until after atexit runs).
_started: "weakref.WeakSet[MCPConnectionManager]" = weakref.WeakSet()


@atexit.register
def _stop_started_servers() -> None:
    for manager in list(_started):
        manager.stop()
