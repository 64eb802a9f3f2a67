"""AWorld's ``training.chat_agent`` (docs/aworld.md): the code lives in ``training.compat.aworld.agents``."""

from training.compat.aworld.agents import *  # noqa: F401,F403
