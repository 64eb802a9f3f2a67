"""AWorld's ``training.tools.register_tool`` (docs/aworld.md): the code lives in ``training.agents.tools``."""

from training.agents.tools import *  # noqa: F401,F403
