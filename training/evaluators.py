"""rLLM's ``training.evaluators`` (docs/rllm.md): the code lives in ``training.compat.rllm.evaluators``."""

from training.compat.rllm.evaluators import *  # noqa: F401,F403
