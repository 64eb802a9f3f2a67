"""How a black-box ``agent_run_func`` reaches the model: rLLM's ``get_chat_client`` and the episode's URL.

While the trainer runs an episode of ``fn(**task)``, ``current_base_url()`` is that episode's
OpenAI-compatible endpoint, and the calls of a ``get_chat_client()`` client go there. rLLM's SDK
examples name their proxy's address (``http://localhost:4000/v1``): inside an episode that address
is replaced by the episode's own, so their code runs with only the imports changed. Outside an
episode the clients call the ``base_url`` given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from training.types import Step

# Sent with each call by the clients made here: the uids of the ``session()`` blocks the call is
# made in, so the endpoint can tag the recorded call for ``session.steps``.
SESSIONS_HEADER = "X-Training-Sessions"


@dataclass(frozen=True)
class EpisodeContext:
    """What code running inside an episode can reach: its endpoint URL and its recorded calls."""

    base_url: str
    calls: list[Step]


_EPISODE: ContextVar[EpisodeContext | None] = ContextVar("training_sdk_episode", default=None)
_ACTIVE_SESSIONS: ContextVar[tuple[str, ...]] = ContextVar("training_sdk_sessions", default=())


def current_base_url() -> str | None:
    """The running episode's endpoint (``http://127.0.0.1:<port>/sessions/<id>/v1``), else None.

    Hand it to any OpenAI-compatible client (``openai.OpenAI(base_url=..., api_key="EMPTY")``,
    LangChain's ``ChatOpenAI(base_url=...)``) to have its calls trained on.
    """
    episode = _EPISODE.get()
    return episode.base_url if episode is not None else None


def current_episode() -> EpisodeContext | None:
    return _EPISODE.get()


@contextlib.contextmanager
def in_episode(base_url: str, calls: list[Step]) -> Iterator[None]:
    """Run the block as part of an episode (the rollout engine wraps each ``fn(**task)`` in this)."""
    token = _EPISODE.set(EpisodeContext(base_url, calls))
    try:
        yield
    finally:
        _EPISODE.reset(token)


@contextlib.contextmanager
def active_session(uid: str) -> Iterator[None]:
    """Tag the block's model calls with ``uid`` too (``training.agents.sdk.session`` enters this)."""
    token = _ACTIVE_SESSIONS.set(_ACTIVE_SESSIONS.get() + (uid,))
    try:
        yield
    finally:
        _ACTIVE_SESSIONS.reset(token)


def get_chat_client(provider: str = "openai", *, use_proxy: bool = True, **kwargs: Any):
    """rLLM's ``get_chat_client``: an ``openai.OpenAI`` client whose calls the trainer records.

    Every call it makes inside an episode goes to that episode's endpoint, whatever ``base_url``
    says and wherever the client was made (``use_proxy=False`` makes a plain client: its calls go
    to ``base_url`` and are not trained on). Other keyword arguments go to ``openai.OpenAI``.
    """
    import openai

    return openai.OpenAI(**_client_kwargs(provider, use_proxy, kwargs, openai.DefaultHttpxClient, _route_to_episode))


def get_chat_client_async(provider: str = "openai", *, use_proxy: bool = True, **kwargs: Any):
    """``get_chat_client`` for async code: an ``openai.AsyncOpenAI`` client."""
    import openai

    return openai.AsyncOpenAI(
        **_client_kwargs(provider, use_proxy, kwargs, openai.DefaultAsyncHttpxClient, _route_to_episode_async)
    )


def _client_kwargs(
    provider: str, use_proxy: bool, kwargs: dict[str, Any], http_client: Any, hook: Any
) -> dict[str, Any]:
    if provider.lower() != "openai":
        raise ValueError(f"Unsupported chat provider {provider!r}; only 'openai' is supported.")
    if not use_proxy:
        return kwargs
    episode_url = current_base_url()
    if episode_url is not None:
        kwargs = {**kwargs, "base_url": episode_url}
        kwargs.setdefault("api_key", "EMPTY")  # the endpoint needs none; openai's client insists on one
    # Inside an episode the endpoint is plain HTTP on loopback: no TLS context to build, which
    # costs ~0.2 s per client (rLLM's examples make a client per episode).
    kwargs.setdefault("http_client", http_client(verify=episode_url is None, event_hooks={"request": [hook]}))
    return kwargs


def _route_to_episode(request: Any) -> None:
    """httpx request hook, run in the caller's context: a call made inside an episode goes to that
    episode's endpoint (whatever the client was made with, as rLLM's proxy routing does), tagged
    with the caller's open ``session()`` uids."""
    episode = _EPISODE.get()
    if episode is None:
        return
    path = request.url.path
    cut = path.rfind("/v1/")
    if cut >= 0:
        request.url = request.url.__class__(episode.base_url + path[cut + 3 :], params=request.url.params)
        request.headers["Host"] = request.url.netloc.decode("ascii")
    uids = _ACTIVE_SESSIONS.get()
    if uids:
        request.headers[SESSIONS_HEADER] = ",".join(uids)


async def _route_to_episode_async(request: Any) -> None:
    _route_to_episode(request)
