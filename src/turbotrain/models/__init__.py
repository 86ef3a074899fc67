"""Models: `build_for(cfg, ...)` picks image (torchvision, small_cnn) or text (transformers);
`from_checkpoint` rebuilds a saved run's exact architecture."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from torch import nn

from turbotrain.checkpoint import load_model_state
from turbotrain.compression.prune import rebuild
from turbotrain.models.vision import build_model

__all__ = ["build_model", "build_for", "build_tokenizer_for", "from_checkpoint", "load_weights"]
TEXT_MODELS = ("minilm", "hf", "bert_tiny")


def build_tokenizer_for(model_cfg, max_length: int):
    """The tokenizer of a text model; None for image models."""
    if model_cfg.name not in TEXT_MODELS:
        return None
    from turbotrain.models.text import build_tokenizer  # transformers loads only for text runs

    return build_tokenizer(model_cfg, max_length)


def build_for(model_cfg, data, tokenizer, max_length: int) -> nn.Module:
    if data.kind == "text":
        from turbotrain.models.text import build_text_model

        return build_text_model(model_cfg, data.num_classes, max_length, len(tokenizer))
    return build_model(model_cfg, data.num_classes, data.in_channels)


def load_weights(model: nn.Module, ckpt: dict, path: str | Path) -> None:
    """Load a checkpoint's weights, first giving the model that run's compressed structure."""
    arch = ckpt["arch"]
    if arch.get("lowrank"):
        from turbotrain.compression.lowrank import restructure

        restructure(model, arch["lowrank"])
    if arch.get("conv_groups"):
        rebuild(model, arch["conv_groups"], ckpt["model"])
    load_model_state(model, ckpt["model"], path)


def from_checkpoint(ckpt: dict, path: str | Path) -> nn.Module:
    """The trained architecture, rebuilt from the checkpoint alone, in eval mode."""
    arch = ckpt["arch"]
    model_cfg = OmegaConf.create(arch["model"])
    if arch["kind"] == "text":
        from turbotrain.attention import apply_attention
        from turbotrain.models.text import build_text_model

        model = build_text_model(model_cfg, arch["num_classes"], arch["max_length"], arch["vocab_size"])
        apply_attention(model, OmegaConf.create({**arch["attention"], "checkpointing": False}))
    else:
        model = build_model(model_cfg, arch["num_classes"], arch["in_channels"])
    load_weights(model, ckpt, path)
    return model.eval()
