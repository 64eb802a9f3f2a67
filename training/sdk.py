"""rLLM's ``training.sdk`` (docs/rllm.md): the code lives in ``training.agents.sdk``."""

from training.agents.sdk import *  # noqa: F401,F403
from training.agents.sdk import __all__  # noqa: F401
