"""AWorld's ``training.tools.register_tool`` and ``be_tool`` (docs/aworld.md): the code lives in
``training.agents.tools`` and ``training.compat.aworld.tools``."""

from training.agents.tools import *  # noqa: F401,F403
from training.compat.aworld.tools import be_tool, function_to_tool  # noqa: F401
