"""Config schemas: ConfigError, and `setting(...)`, a dataclass field that carries its default and
its allowed values. `check` reads them back, so each option's schema validates its own keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from turbotrain.core.errors import UserError


class ConfigError(UserError, ValueError):
    """A config value is outside what the pipeline supports; the message names the key."""


# (low, high, low inclusive, high inclusive); None: unbounded above
POSITIVE, NON_NEGATIVE = (0, None, False, False), (0, None, True, False)
UNIT_OPEN, UNIT_HALF_OPEN, UNIT_CLOSED = (0, 1, False, False), (0, 1, True, False), (0, 1, True, True)


def setting(
    default: Any = dataclasses.MISSING,
    *,
    bound: tuple | None = None,
    choices: tuple | None = None,
    factory=None,
    numeric: bool | None = None,
):
    """A schema field. `bound` applies to a number or to each item of a list; a null value (where
    the type allows it) means "the default" and is not checked. `numeric`: whether a change alters
    what a resumed run computes, so that resuming with a new value is refused (None: its group's
    rule, train/resume.py)."""
    metadata = {"bound": bound, "choices": choices, "numeric": numeric}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _inside(value: float, bound: tuple) -> bool:
    low, high, low_in, high_in = bound
    above = value >= low if low_in else value > low
    return above and (high is None or (value <= high if high_in else value < high))


def describe(bound: tuple) -> str:
    low, high, low_in, high_in = bound
    if high is None:
        return f"must be {'>=' if low_in else '>'} {low}"
    return f"must be in {'[' if low_in else '('}{low}, {high}{']' if high_in else ')'}"


def check(node: Any, schema: type, prefix: str) -> None:
    """Raise ConfigError naming the first key of `node` that `schema` does not know or allow."""
    known = {f.name: f for f in dataclasses.fields(schema)}
    unknown = sorted(set(node) - set(known))
    if unknown:  # Hydra's `+key=value` appends even to structured configs
        raise ConfigError(f"unknown key {prefix}.{unknown[0]}; known keys: {', '.join(sorted(known))}")
    for name, f in known.items():
        check_value(f"{prefix}.{name}", node[name], f)


def check_value(key: str, value: Any, f: dataclasses.Field) -> None:
    """Raise ConfigError when `value` is outside what schema field `f` allows."""
    choices, bound = f.metadata.get("choices"), f.metadata.get("bound")
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    if choices is not None and not all(v in choices for v in values):
        raise ConfigError(f"{key}={value!r} is not supported; allowed: {', '.join(choices)}")
    if bound is not None and value is not None and not all(v is not None and _inside(v, bound) for v in values):
        raise ConfigError(f"{key}={value!r} {describe(bound)}")
