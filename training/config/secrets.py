"""Secrets by name: an agent's or environment's arguments say which secret, never its value.

An argument written ``{"$secret": "SEARCH_API_KEY"}`` (anywhere in ``agent_args``, ``env_args`` or
``workflow_args``: an MCP server's ``mcp_server_env`` entry, a tool's key) stands for the value of
the variable ``SEARCH_API_KEY`` in the environment of the process that trains. The value is put in
only when the agent or environment is built (``resolve``), so it is in no config file, registry
row, run page or error message: those hold the reference, which names the secret and nothing more.

A run's check (``training.platform.probe``) has no secret in its jail: there each reference stands for a
placeholder (``use_placeholders``), since the check builds nothing that would send it anywhere.
"""

from __future__ import annotations

import os
from typing import Any
from training.errors import MissingSecret

REFERENCE_KEY = "$secret"

_placeholders = False


def reference(value: Any) -> str | None:
    """The secret's name when ``value`` is a reference (``{"$secret": NAME}``), else None."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(REFERENCE_KEY), str):
        return value[REFERENCE_KEY]
    return None


def use_placeholders() -> None:
    """In this process, references resolve to ``<secret NAME>`` (a run check's child)."""
    global _placeholders
    _placeholders = True


def resolve(value: Any) -> Any:
    """``value`` with every reference replaced by its secret, read from this process's environment.
    Raises ``MissingSecret`` naming the secret (never a value) when one is not set."""
    name = reference(value)
    if name is not None:
        if _placeholders:
            return f"<secret {name}>"
        secret = os.environ.get(name)
        if secret is None:
            raise MissingSecret(
                f"secret {name!r} is not set where this run trains: an administrator sets the variable {name} "
                "in the workers' environment.")
        return secret
    if isinstance(value, dict):
        return {key: resolve(item) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item) for item in value]
    if isinstance(value, tuple):
        return tuple(resolve(item) for item in value)
    return value
