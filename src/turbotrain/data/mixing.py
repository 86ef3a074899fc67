"""Mixup and cutmix (data.mixup_alpha, data.cutmix_alpha): whole training batches mixed on their
device after the per-sample and batched augmentation, with soft targets (each row sums to 1).
torchvision's batched v2 transforms do the mixing; with both on, each batch takes one of the two
at random, as torchvision's classification references do. Their draws come from torch's global
RNG on the CPU, which checkpoints save per rank, so a resumed run mixes as the uninterrupted one."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2

from turbotrain.core.schema import ConfigError


def build_mix(data_cfg, kind: str, num_classes: int) -> Callable[[torch.Tensor, torch.Tensor], tuple] | None:
    """(images, labels) -> (mixed images, soft targets [batch, classes]), or None when both are off."""
    mixes = []
    if data_cfg.mixup_alpha:
        mixes.append(v2.MixUp(alpha=data_cfg.mixup_alpha, num_classes=num_classes))
    if data_cfg.cutmix_alpha:
        mixes.append(v2.CutMix(alpha=data_cfg.cutmix_alpha, num_classes=num_classes))
    if mixes and kind != "image":
        key = "data.mixup_alpha" if data_cfg.mixup_alpha else "data.cutmix_alpha"
        raise ConfigError(f"{key} mixes images; data={data_cfg.name} is text: set it to 0")
    if not mixes:
        return None
    return mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)
