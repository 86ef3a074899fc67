"""Data: `build_data(cfg.data, tokenizer)` -> DataBundle (datasets, classes, how to batch)."""

from turbotrain.data import arrow, folder, tars, text, vision  # each registers its options in DATA
from turbotrain.data.bundle import DATA, DataBundle, DataCommon, build_data

__all__ = ["DATA", "DataBundle", "DataCommon", "arrow", "build_data", "folder", "tars", "text", "vision"]
