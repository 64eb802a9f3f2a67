"""An OpenAI-compatible chat endpoint that serves the policy being trained to black-box agents.

The trainer starts one ``ChatEndpoint`` on loopback (a port the OS picks) for the length of a run.
Each episode of an ``agent_run_func`` gets a session: its own base URL,
``http://127.0.0.1:<port>/sessions/<id>/v1``, whose ``/chat/completions`` calls generate with the
rollout engine's generator through that episode's ``ModelClient``. The client records every call's
prompt ids, completion ids and logprobs, so the calls become the episode's trainable tokens.

A request's ``tools`` are described to the model in the Hermes ``<tool_call>`` format that chat
agents use, and the calls it writes come back as OpenAI ``tool_calls``.

Session ids are random 128-bit tokens, so a process that finds the port cannot add calls to
another's episodes. Sampling follows the run's config (``actor_rollout_ref.rollout.temperature``
and ``top_p``): a request's ``temperature``/``top_p`` are ignored, so that the recorded logprobs are
the ones the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from training.rollouts.generation import GenerationOutput, ModelClient
from training.log import logger
from training.agents.sdk.client import SESSIONS_HEADER
from training.agents.sdk.session import CALL_ID, SESSION_UIDS
from training.agents.tools import parse_tool_calls, tools_prompt
from training.errors import RequestError

_START_TIMEOUT_S = 10.0
# The HTTP clients that the openai library uses log every request at INFO: one line per model
# call of every episode. Their lines about this endpoint are dropped while it serves.
_CLIENT_LOGGERS = ("httpx", "httpx2")


class _QuietClientLog(logging.Filter):
    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def filter(self, record: logging.LogRecord) -> bool:
        return self.marker not in record.getMessage()


@dataclass
class EndpointSession:
    """One episode's door to the model: its base URL and the client that records its calls."""

    id: str
    base_url: str
    client: ModelClient
    loop: asyncio.AbstractEventLoop
    replies: dict[str, str] = field(default_factory=dict)  # tool call id -> the model's text that made it
    # The generator's own failure (not a bad request): the rollout re-raises it after the episode.
    model_failure: BaseException | None = field(default=None, repr=False)


class ChatEndpoint:
    """``/v1/chat/completions`` and ``/v1/models`` over the run's policy, on ``127.0.0.1``.

    Use as a context manager (or ``start()``/``close()``); open one ``session()`` per episode.
    """

    def __init__(self, model_name: str = "policy", tokenizer: Any = None) -> None:
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.port: int | None = None
        self._sessions: dict[str, EndpointSession] = {}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._quiet: logging.Filter | None = None

    # -- lifetime ----------------------------------------------------------------------------
    def start(self) -> "ChatEndpoint":
        if self._server is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="chat-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"The chat endpoint for agent_run_func did not start on 127.0.0.1:{self.port}.")
            time.sleep(0.01)
        self._quiet = _QuietClientLog(f"127.0.0.1:{self.port}/sessions/")
        for name in _CLIENT_LOGGERS:
            logging.getLogger(name).addFilter(self._quiet)
        logger.info("chat endpoint for agent_run_func or agent_flow serving on %s", self.base_url)
        return self

    def close(self) -> None:
        if self._server is None:
            return
        for name in _CLIENT_LOGGERS:
            logging.getLogger(name).removeFilter(self._quiet)
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=_START_TIMEOUT_S)
        self._server = self._thread = None
        self._sessions.clear()

    def __enter__(self) -> "ChatEndpoint":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """The endpoint's root (``/v1/models`` answers there; chat needs a session's URL)."""
        if self.port is None:
            raise RuntimeError("The chat endpoint is not started.")
        return f"http://127.0.0.1:{self.port}/v1"

    @contextlib.contextmanager
    def session(self, client: ModelClient, loop: asyncio.AbstractEventLoop) -> Iterator[EndpointSession]:
        """Route one episode's calls to ``client`` (run on ``loop``) until the block ends."""
        if self.port is None:
            raise RuntimeError("The chat endpoint is not started.")
        session_id = secrets.token_hex(16)
        url = f"http://127.0.0.1:{self.port}/sessions/{session_id}/v1"
        session = EndpointSession(session_id, url, client, loop)
        self._sessions[session_id] = session
        try:
            yield session
        finally:
            del self._sessions[session_id]

    # -- HTTP ----------------------------------------------------------------------------------
    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/sessions/{session}/v1/models", self._models, methods=["GET"]),
                Route("/sessions/{session}/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/chat/completions", self._no_session, methods=["POST"]),
            ]
        )

    async def _models(self, request: Request) -> JSONResponse:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "training"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _no_session(self, request: Request) -> JSONResponse:
        return _error(
            404,
            "This endpoint answers an episode's calls only: use the base_url the trainer hands to "
            "agent_run_func (or get_chat_client()), which names the episode's session.",
        )

    async def _chat_completions(self, request: Request) -> JSONResponse:
        session = self._sessions.get(request.path_params["session"])
        if session is None:
            return _error(404, "Unknown session: the episode this base_url belongs to has ended.")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "The request body is not JSON.")
        try:
            messages, max_tokens = _parse_request(body, session.replies)
        except RequestError as exc:
            return _error(400, str(exc))
        uids = [uid for uid in request.headers.get(SESSIONS_HEADER, "").split(",") if uid]
        call = _recorded_call(session.client, messages, max_tokens, uids)
        future = asyncio.run_coroutine_threadsafe(call, session.loop)
        try:
            output = await asyncio.wrap_future(future)
        except Exception as exc:  # the generator failed: the rollout stops on it after the episode
            session.model_failure = exc
            return _error(500, f"Generation failed: {type(exc).__name__}: {exc}", kind="server_error")
        return JSONResponse(self._completion(body, output, session))

    def _completion(self, body: dict, output: GenerationOutput, session: EndpointSession) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": output.text}
        finish_reason = output.finish_reason
        calls = parse_tool_calls(output.text) if body.get("tools") else []
        if calls and not any(call.error for call in calls):
            tool_calls = []
            for call in calls:
                call_id = f"call_{secrets.token_hex(8)}"
                session.replies[call_id] = output.text  # re-sent later: rendered as the model wrote it
                tool_calls.append({"id": call_id, "type": "function",
                                   "function": {"name": call.name, "arguments": json.dumps(call.arguments)}})
            message = {"role": "assistant", "content": output.text.split("<tool_call>")[0].strip() or None,
                       "tool_calls": tool_calls}
            finish_reason = "tool_calls"
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": self._logprobs(output) if body.get("logprobs") else None,
            # vLLM's names for the exact tokens (its ``return_token_ids``), for clients that train on them.
            "token_ids": list(output.completion_ids),
        }
        prompt, completion = len(output.prompt_ids), len(output.completion_ids)
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            "prompt_token_ids": list(output.prompt_ids),
        }

    def _logprobs(self, output: GenerationOutput) -> dict[str, Any]:
        content = []
        for token_id, logprob in zip(output.completion_ids, output.logprobs):
            token = self.tokenizer.decode([token_id]) if self.tokenizer is not None else str(token_id)
            content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
        return {"content": content}


async def _recorded_call(client: ModelClient, messages: list[dict], max_tokens: int | None, uids: list[str]):
    """One call through the episode's client, its recorded step tagged with an id and the
    caller's ``session()`` uids (for ``session.steps`` and returned ``TrajectoryView``s)."""
    output = await client.chat(messages, max_tokens)
    step = client.steps[-1]  # appended just before chat() returned, with no await in between
    step.info[CALL_ID], step.info[SESSION_UIDS] = secrets.token_hex(8), uids
    return output


def _parse_request(body: Any, replies: dict[str, str]) -> tuple[list[dict[str, str]], int | None]:
    """The messages (as the model reads them) and token limit of a chat request, or a RequestError
    saying what is wrong. ``replies``: the model's own text of the tool calls issued so far."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    if body.get("stream"):
        raise RequestError("stream=true is not supported by the training endpoint; leave stream out.")
    if body.get("n", 1) != 1:
        raise RequestError(f"n={body.get('n')} is not supported: ask for one completion per call (n=1).")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects.")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{index}] must be an object with a role.")
        content = _text_of(message.get("content"), index)
        if message["role"] == "assistant" and message.get("tool_calls"):
            content = _tool_call_text(message["tool_calls"], content, replies, index)
        parsed.append({"role": message["role"], "content": content})
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(tool, dict) and tool.get("type") == "function" for tool in tools):
            raise RequestError("tools must be a list of {type: function, function: {name, parameters}} objects.")
        described = tools_prompt(tools)  # the Hermes <tool_call> format that chat agents use too
        if parsed[0]["role"] == "system":
            parsed[0]["content"] = f"{parsed[0]['content']}\n\n{described}" if parsed[0]["content"] else described
        else:
            parsed.insert(0, {"role": "system", "content": described})
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise RequestError(f"max_tokens must be a positive integer, got {limit!r}.")
    return parsed, limit


def _tool_call_text(tool_calls: Any, content: str, replies: dict[str, str], index: int) -> str:
    """An assistant turn with tool calls as the model reads it: the model's own text when the calls
    came from this endpoint (so the conversation stays one token sequence), else Hermes tags."""
    if not isinstance(tool_calls, list) or not all(isinstance(call, dict) for call in tool_calls):
        raise RequestError(f"messages[{index}].tool_calls must be a list of objects.")
    known = {replies.get(call.get("id")) for call in tool_calls}
    if len(known) == 1 and None not in known:
        return known.pop()
    parts = [content] if content else []
    for call in tool_calls:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, json.JSONDecodeError) as exc:
            raise RequestError(f"messages[{index}].tool_calls: arguments must be a JSON string ({exc}).") from exc
        parts.append(f"<tool_call>\n{json.dumps({'name': function.get('name'), 'arguments': arguments})}\n</tool_call>")
    return "\n".join(parts)


def _text_of(content: Any, index: int) -> str:
    """A message's text: a string, or the text parts of OpenAI's content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"messages[{index}]: only text content parts are supported, not {kind!r}.")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise RequestError(f"messages[{index}].content must be a string or a list of text parts.")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """OpenAI's error shape, which its client turns into ``openai.BadRequestError`` etc."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status_code=status)


def chat_endpoint_for(spec: Any, tokenizer: Any, model_name: str = "policy") -> contextlib.AbstractContextManager:
    """The run's endpoint when ``spec``'s agent calls the model through it (an rLLM-style
    ``fn(**task)`` or an AgentFlow), else a context of None."""
    if not getattr(spec, "uses_endpoint", False):
        return contextlib.nullcontext(None)
    return ChatEndpoint(model_name=model_name, tokenizer=tokenizer)
