"""Train black-box agents (rLLM's SDK convention): ``agent_run_func=fn`` called as ``fn(**task)``,
reaching the model through an OpenAI-compatible endpoint the trainer serves during the run.

``get_chat_client()`` / ``get_chat_client_async()`` give a ready ``openai`` client for the running
episode; ``current_base_url()`` its URL for any other OpenAI-compatible client; ``session()`` and
``@trajectory`` group the calls into ``TrajectoryView``s a function may return. The server itself
(``training.rollouts.chat_endpoint.ChatEndpoint``) is started by the trainer.
"""

from training.agents.sdk.client import current_base_url, get_chat_client, get_chat_client_async
from training.agents.sdk.session import Session, StepView, TrajectoryView, session, trajectory

__all__ = [
    "Session",
    "StepView",
    "TrajectoryView",
    "current_base_url",
    "get_chat_client",
    "get_chat_client_async",
    "session",
    "trajectory",
]
