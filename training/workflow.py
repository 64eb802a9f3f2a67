"""rLLM's module path ``training.workflow`` (``from training.workflow import Workflow``): the code lives in ``training.agents.workflow``."""

from training.agents.workflow import *  # noqa: F401,F403
