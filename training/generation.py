"""The documented path ``training.generation.ModelClient`` (docs/rllm.md): the code lives in ``training.rollouts.generation``."""

from training.rollouts.generation import *  # noqa: F401,F403
