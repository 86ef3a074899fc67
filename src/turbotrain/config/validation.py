"""validate(cfg): every key a run will read, checked before it starts against the schema of the
option each group selects (allowed values and bounds live on the schema fields), each failure
named in one line. Hydra has already checked keys and types at compose time."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from turbotrain.config.schemas import KNOBS, NUMERICS_KNOBS, TrainerConfig, registries
from turbotrain.core.schema import ConfigError, check, check_value

log = logging.getLogger("turbotrain")


def check_group(cfg: Any, group: str) -> None:
    """The keys of one group against its selected option's schema (export checks deploy.*)."""
    node, registry = cfg[group], registries()[group]
    option = registry.of(node)
    own, group_keys = {f.name for f in dataclasses.fields(option.schema)}, registry.keys()
    for key, owners in group_keys.items():
        if key not in own and node.get(key) is not None:
            _check_foreign(group, key, node[key], registry[owners[0]].schema)
            log.warning("%s.%s is a key of %s=%s: %s=%s ignores it", group, key, group, " / ".join(owners), group, node.name)
    check({k: v for k, v in node.items() if k in own or k not in group_keys}, option.schema, group)


def _check_foreign(group: str, key: str, value: Any, owner_schema: type) -> None:
    """A key of another option of the group (it composes untyped): its type and bounds as there."""
    f = {f.name: f for f in dataclasses.fields(owner_schema)}[key]
    try:
        OmegaConf.merge(OmegaConf.structured(owner_schema), {key: value})
    except ValidationError as e:
        raise ConfigError(f"{group}.{key}={value!r}: {str(e).splitlines()[0]}") from e
    check_value(f"{group}.{key}", value, f)


def validate(cfg: Any) -> None:
    """Raise ConfigError naming the first key whose value the pipeline cannot use."""
    known = {*registries(), "trainer"}
    unknown = sorted(set(cfg.keys()) - known)
    if unknown:
        raise ConfigError(f"unknown config section {unknown[0]!r}; sections: {', '.join(sorted(known))}")
    check(cfg.trainer, TrainerConfig, "trainer")
    for group in registries():
        check_group(cfg, group)
    if cfg.data.get("resolution_scale") is not None:
        _check_resolution(cfg.data)
    unknown = sorted(set(cfg.trainer.autotune_knobs) - {*KNOBS, *NUMERICS_KNOBS})
    if unknown:
        raise ConfigError(f"trainer.autotune_knobs: unknown knob {unknown[0]!r}; allowed: {', '.join((*KNOBS, *NUMERICS_KNOBS))}")


def _check_resolution(data: Any) -> None:
    lo, hi = data.resolution_scale
    if not 0 < lo <= hi:
        raise ConfigError(f"data.resolution_scale={[lo, hi]} must be 0 < low <= high")
    if not 0 < data.progressive_start <= 1:
        raise ConfigError(f"data.progressive_start={data.progressive_start} must be in (0, 1] (a fraction of data.image_size)")
    begin, end = data.progressive_from, data.progressive_until
    if not 0 <= begin <= end <= 1:
        raise ConfigError(f"data.progressive_from={begin}, progressive_until={end}: need 0 <= from <= until <= 1")
