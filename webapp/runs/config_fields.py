"""The training config's keys as the run form shows them: key, default, type and doc, read from the
documented dataclasses in ``training.config`` (one source for the library, the docs and the form)."""

from __future__ import annotations

import functools
import json

from training.config import Config, flatten, valid_keys


@functools.cache
def config_fields() -> tuple[dict[str, str], ...]:
    defaults = flatten(Config().to_dict())
    return tuple(
        {"key": key, "default": _shown(defaults.get(key)), "type": str(field.type), "doc": field.metadata.get("doc", "")}
        for key, field in sorted(valid_keys().items())
    )


def _shown(value) -> str:
    """A default as one would type it after ``key=`` (YAML scalars, JSON lists)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)
