"""Models: `build_model(cfg.model, num_classes, in_channels)`; `from_checkpoint` for a saved run."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from torch import nn

from turbotrain.checkpoint import load_model_state
from turbotrain.compression.prune import rebuild
from turbotrain.models.vision import build_model

__all__ = ["build_model", "from_checkpoint", "load_weights"]


def load_weights(model: nn.Module, ckpt: dict, path: str | Path) -> None:
    """Load a checkpoint's weights, first resizing the model if that run was channel-pruned."""
    groups = ckpt["arch"].get("conv_groups")
    if groups:
        rebuild(model, groups, ckpt["model"])
    load_model_state(model, ckpt["model"], path)


def from_checkpoint(ckpt: dict, path: str | Path) -> nn.Module:
    """The trained architecture, rebuilt from the checkpoint alone, in eval mode."""
    arch = ckpt["arch"]
    model = build_model(OmegaConf.create(arch["model"]), arch["num_classes"], arch["in_channels"])
    load_weights(model, ckpt, path)
    return model.eval()
