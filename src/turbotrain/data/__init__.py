"""Data: `build_data(cfg.data, tokenizer)` -> DataBundle (datasets, classes, how to batch)."""

from __future__ import annotations

from turbotrain.config import ConfigError
from turbotrain.data.vision import BUILDERS, DataBundle

__all__ = ["DataBundle", "build_data", "TEXT_DATA"]
TEXT_DATA = ("wordnet", "text_files", "hf_hub")


def build_data(data_cfg, tokenizer=None) -> DataBundle:
    if data_cfg.name in TEXT_DATA:
        if tokenizer is None:
            raise ConfigError(f"data={data_cfg.name} is text: pick a text model (model=minilm, hf or bert_tiny)")
        from turbotrain.data.text import build_text  # transformers/datasets load only for text runs

        return build_text(data_cfg, tokenizer)
    if tokenizer is not None:
        raise ConfigError(f"data={data_cfg.name} is images: pick an image model, not a text one")
    builder = BUILDERS.get(data_cfg.name)
    if builder is None:
        allowed = ", ".join([*BUILDERS, *TEXT_DATA])
        raise ConfigError(f"data.name={data_cfg.name!r} is not supported; allowed: {allowed}")
    return builder(data_cfg)
