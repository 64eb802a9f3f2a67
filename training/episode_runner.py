"""The documented path ``training.episode_runner.EpisodeRunner`` (docs/rllm.md): the code lives in ``training.rollouts.episode_runner``."""

from training.rollouts.episode_runner import *  # noqa: F401,F403
