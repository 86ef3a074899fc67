"""A trained model's architecture record (saved in every checkpoint as `arch`), and the way back:
rebuilding the exact architecture, compressed modules included, from a checkpoint alone."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from torch import nn

from turbotrain.compression import record_structure, restore_structure
from turbotrain.core.checkpoint import CheckpointError, load_model_state
from turbotrain.models.attention.options import apply_attention
from turbotrain.models.catalog import MODELS, Shape


def architecture(cfg, data, model: nn.Module) -> dict:
    """What a checkpoint needs to rebuild `model` without the run's code paths: plain values only."""
    arch = {
        "kind": data.kind,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "num_classes": data.num_classes,
        "in_channels": data.in_channels,
        "image_size": data.image_size,
        "mean": data.mean,
        "std": data.std,
        "class_names": data.class_names,
        **record_structure(model),
    }
    if data.kind == "text":
        arch.update(
            max_length=cfg.data.max_length,
            vocab_size=model.config.vocab_size,
            attention=OmegaConf.to_container(cfg.attention, resolve=True),
            tokenizer=MODELS.of(cfg.model).traits["source"](cfg.model),
        )
    return arch


def load_weights(model: nn.Module, ckpt: dict, path: str | Path, averaged: bool = False) -> None:
    """Load a checkpoint's weights, first giving the model that run's compressed structure.
    `averaged`: the weight average (trainer.ema_decay) where the run kept one, the weights its
    metrics describe; else the trained weights (what a resume continues)."""
    weights = ckpt["ema"]["weights"] if averaged and ckpt.get("ema") else ckpt["model"]
    restore_structure(model, ckpt["arch"], weights)
    load_model_state(model, weights, path)


def from_checkpoint(ckpt: dict, path: str | Path) -> nn.Module:
    """The trained architecture, rebuilt from the checkpoint alone, in eval mode, with the weights
    its metrics describe (the weight average where the run kept one)."""
    if "arch" not in ckpt:
        raise CheckpointError(f"checkpoint {path} has no arch entry: it was not written by a turbotrain run")
    arch = ckpt["arch"]
    model_cfg = OmegaConf.create(arch["model"])
    shape = Shape(arch["num_classes"], arch["in_channels"], arch.get("max_length", 0), arch.get("vocab_size", 0))
    model = MODELS.check_fits(model_cfg, arch["kind"]).build(model_cfg, shape)
    if arch["kind"] == "text":
        apply_attention(model, OmegaConf.create({**arch["attention"], "checkpointing": False}))
    load_weights(model, ckpt, path, averaged=True)
    return model.eval()
