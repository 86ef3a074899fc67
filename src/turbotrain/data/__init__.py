"""Data: `build_data(cfg.data)` -> DataBundle (datasets, num_classes, channels, normalization)."""

from __future__ import annotations

from turbotrain.config import ConfigError
from turbotrain.data.vision import BUILDERS, DataBundle

__all__ = ["DataBundle", "build_data"]


def build_data(data_cfg) -> DataBundle:
    builder = BUILDERS.get(data_cfg.name)
    if builder is None:
        raise ConfigError(f"data.name={data_cfg.name!r} is not supported; allowed: {', '.join(BUILDERS)}")
    return builder(data_cfg)
