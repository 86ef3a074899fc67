"""Models: `build_for(cfg, ...)` picks image (torchvision, small_cnn) or text (transformers);
`from_checkpoint` rebuilds a saved run's exact architecture."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from torch import nn

from turbotrain.checkpoint import CheckpointError, load_model_state
from turbotrain.compression.prune import rebuild
from turbotrain.models.vision import build_model

__all__ = ["build_model", "build_for", "build_tokenizer_for", "describe", "from_checkpoint", "load_weights"]
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


def describe(cfg, data, model: nn.Module) -> dict:
    """What a checkpoint needs to rebuild `model` without the run's code paths: plain values only."""
    from turbotrain.compression import lowrank, prune

    arch = {
        "kind": data.kind,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "num_classes": data.num_classes,
        "in_channels": data.in_channels,
        "image_size": data.image_size,
        "mean": data.mean,
        "std": data.std,
        "class_names": data.class_names,
        "conv_groups": prune.structure(model) or None,  # pruned shapes are read off the state dict
        "lowrank": lowrank.spec(model) or None,
    }
    if data.kind == "text":
        from turbotrain.models.text import model_path  # transformers: text runs only

        arch.update(
            max_length=cfg.data.max_length,
            vocab_size=model.config.vocab_size,
            attention=OmegaConf.to_container(cfg.attention, resolve=True),
            tokenizer=model_path(cfg.model),
        )
    return arch


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
    if "arch" not in ckpt:
        raise CheckpointError(f"checkpoint {path} has no arch entry: it was not written by a turbotrain run")
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
