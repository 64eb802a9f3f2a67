"""Name tables that other floors own and register here, so that the config knows no backend.

A backend or a dialect that has names of its own registers them when its module is imported
(``training/__init__.py`` imports every built-in one):

- ``register_undotted_names``: the translation of keys without a dot, which are another library's
  names (TRL's ``GRPOConfig`` names, ``training.backends.trl.names``); ours all have a dot.
- ``register_foreign_keys``: whether a key is a setting that one backend alone implements (verl's
  config keys, ``training.backends.verl.names``), so that an unknown key is explained, not just refused,
  and what such a key does elsewhere: nothing (a setting of where or how fast that backend trains,
  said and recorded), or it is not given at all (a null the other framework fills in later).
- ``register_value_check``: a check of one of our keys whose valid values a higher floor knows
  (``trainer.logger``'s names, ``training.tracking.trackers``).

A second registration of the same table refuses, naming both owners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# (flat, merged so far, origin, ignored) -> flat with the dialect's names replaced by our keys; origin
# collects our key -> the name that set it, ignored the names without effect -> (value, why)
UndottedNames = Callable[[dict[str, Any], dict[str, Any], dict[str, str], dict[str, tuple[Any, str]]], dict[str, Any]]

_undotted: list[UndottedNames] = []
_foreign: dict[str, Callable[[str], bool]] = {}
# (key, value, every key given) -> what it does on the other backends, or None (refused there)
ForeignEffect = Callable[[str, Any, dict[str, Any]], "Elsewhere | None"]
_foreign_effects: dict[str, ForeignEffect] = {}
_value_checks: dict[str, Callable[[Any], str | None]] = {}


def _refuse_duplicate(table: str, old: Callable, new: Callable) -> None:
    if old is not new:
        raise ValueError(f"{table} is registered already by {old.__module__}.{old.__qualname__}; "
                         f"{new.__module__}.{new.__qualname__} cannot replace it.")


def register_undotted_names(translate: UndottedNames) -> UndottedNames:
    """Keys without a dot are translated by ``translate`` (one dialect may own them)."""
    if _undotted:
        _refuse_duplicate("the translation of keys without a dot", _undotted[0], translate)
        return translate
    _undotted.append(translate)
    return translate


@dataclass(frozen=True)
class Elsewhere:
    """What a foreign key does away from its backend: ``not_given`` (a null left for the other
    framework to fill in: nothing was asked) or ``no_effect`` (accepted, said and recorded), with why."""

    kind: str  # "not_given" or "no_effect"
    why: str


def register_foreign_keys(owner: str, has_key: Callable[[str], bool], elsewhere: ForeignEffect | None = None) -> Callable[[str], bool]:
    """``has_key(key)`` says whether ``key`` is a setting of the backend ``owner`` alone;
    ``elsewhere(key, value, given)`` what one changes on the other backends (None: it is refused)."""
    if owner in _foreign:
        _refuse_duplicate(f"{owner}'s keys", _foreign[owner], has_key)
    _foreign[owner] = has_key
    if elsewhere is not None:
        _foreign_effects[owner] = elsewhere
    return has_key


def register_value_check(key: str, check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """``check(value)`` says what is wrong with ``key``'s value, or None."""
    if key in _value_checks:
        _refuse_duplicate(f"the check of {key}", _value_checks[key], check)
    _value_checks[key] = check
    return check


def translate_undotted(
    flat: dict[str, Any], merged: dict[str, Any], origin: dict[str, str], ignored: dict[str, tuple[Any, str]],
) -> dict[str, Any]:
    """``flat`` with the registered dialect's names replaced by our keys (unchanged when none is)."""
    for translate in _undotted:
        flat = translate(flat, merged, origin, ignored)
    return flat


def foreign_owner(key: str) -> str | None:
    """The backend whose setting ``key`` is, or None."""
    return next((owner for owner, has_key in _foreign.items() if has_key(key)), None)


def foreign_elsewhere(key: str, value: Any, given: dict[str, Any]) -> Elsewhere | None:
    """What ``key`` (another backend's setting, set to ``value`` among ``given``) does here, or None
    when it must be refused."""
    for elsewhere in _foreign_effects.values():
        effect = elsewhere(key, value, given)
        if effect is not None:
            return effect
    return None


def value_problem(key: str, value: Any) -> str | None:
    """What the registered check of ``key`` finds wrong with ``value``, or None."""
    check = _value_checks.get(key)
    return check(value) if check is not None else None
