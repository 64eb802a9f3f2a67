"""verl's config keys, as the config sees them: a key of verl's PPO trainer config that this
trainer does not implement is refused on the other backends with the advice to use backend=verl
(registered with ``training.config.names``). verl is imported inside functions: it is optional.
"""

from __future__ import annotations

import functools
from typing import Any

from training.config import flatten
from training.config.names import register_foreign_keys
from training.utils import is_verl_available

# verl's sections that we do not have: what tells a verl key without verl installed.
VERL_ONLY_SECTIONS = ("critic", "reward_model", "custom_reward_function", "ray_init", "ray_kwargs")


@functools.lru_cache(maxsize=4)
def _verl_defaults_yaml(groups: tuple[tuple[str, str], ...] = ()) -> str:
    """verl's composed PPO trainer config, unresolved, as YAML (composing takes seconds; cache it)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("verl.trainer.config", version_base=None):
        composed = compose("ppo_trainer", overrides=[f"{key}={value}" for key, value in groups])
    return OmegaConf.to_yaml(composed)


def verl_default_config(groups: dict[str, str] | None = None):
    """A fresh copy of verl's PPO trainer config (a struct ``DictConfig``: unknown keys are refused)."""
    from omegaconf import OmegaConf

    config = OmegaConf.create(_verl_defaults_yaml(tuple(sorted((groups or {}).items()))))
    OmegaConf.set_struct(config, True)
    return config


def verl_keys(verl_config: Any = None) -> set[str]:
    """Every dotted path of verl's config, sections included."""
    from omegaconf import OmegaConf

    verl_config = verl_config if verl_config is not None else verl_default_config()
    leaves = flatten(OmegaConf.to_container(verl_config, resolve=False))
    keys = set(leaves)
    for key in leaves:
        parts = key.split(".")
        keys.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return keys


def is_verl_key(key: str) -> bool:
    """Whether verl's PPO trainer config has ``key`` (verl installed), else whether it sits in one
    of verl's sections that we do not have."""
    if is_verl_available():
        return key in verl_keys()
    return key.split(".", 1)[0] in VERL_ONLY_SECTIONS


register_foreign_keys("verl", is_verl_key)
