"""rLLM's ``training.mcp_env`` (docs/rllm.md): the code lives in ``training.compat.rllm.mcp_env``."""

from training.compat.rllm.mcp_env import *  # noqa: F401,F403
