"""Training resolution per batch: fixed, dynamic (random scale per batch) or progressive (small
first, then a ramp to full size, Composer-style). Applied on the device after loading, so the
input pipeline decodes and augments at one size; evaluation always runs at the nominal size.

Sizes are multiples of `resolution_step` (CPU and GPU kernels favour such sizes: on our 2-core
CPU a 48 px resnet18 batch costs as much as a 64 px one). A target size between two multiples is
rounded stochastically, so the expected size follows the schedule even on a coarse grid: during
the progressive ramp the share of full-size batches grows linearly instead of the whole run
switching size at one step. The size of step k depends only on (seed, k), so resumed runs see the
same sizes. README "Training resolution" says when this pays off (scale-augmented recipes)."""

from __future__ import annotations

import logging
import math
import random

import torch
from torch import nn
from torch.nn import functional as F

from turbotrain.core.seeds import derived_seed

log = logging.getLogger("turbotrain")


class Resolution:
    def __init__(self, data_cfg, nominal: int, total_steps: int, seed: int):
        self.mode, self.nominal, self.total, self.seed = data_cfg.resolution, nominal, max(1, total_steps), seed
        self.lo, self.hi = data_cfg.resolution_scale
        self.multiple = data_cfg.resolution_step
        self.start = data_cfg.progressive_start
        self.ramp = data_cfg.progressive_from, data_cfg.progressive_until  # bounds: validation.py

    def scale(self, step: int, rng: random.Random) -> float:
        if self.mode == "dynamic":
            return rng.uniform(self.lo, self.hi)
        t, (begin, end) = step / self.total, self.ramp
        if t >= end:
            return 1.0
        if t <= begin:
            return self.start
        return self.start + (1 - self.start) * (t - begin) / (end - begin)

    def size(self, step: int) -> int:
        if self.mode == "fixed":
            return self.nominal
        rng = random.Random(derived_seed(self.seed, step))
        units = self.nominal * self.scale(step, rng) / self.multiple
        below = math.floor(units)
        units = below + (rng.random() < units - below)  # stochastic rounding: E[size] follows the schedule
        return max(self.multiple, units * self.multiple)

    def smallest_size(self) -> int:
        low = {"dynamic": self.lo, "progressive": self.start}.get(self.mode, 1.0)
        return max(self.multiple, math.floor(self.nominal * low / self.multiple + 1e-9) * self.multiple)  # 1e-9: 96 * (2/3) is 64

    def __call__(self, images: torch.Tensor, step: int) -> torch.Tensor:
        size = self.size(step)
        if size == images.shape[-1] or images.ndim != 4:
            return images
        antialias = size < images.shape[-1]
        out = F.interpolate(images, size=(size, size), mode="bilinear", antialias=antialias, align_corners=False)
        cl = images.is_contiguous(memory_format=torch.channels_last)
        return out.contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)


def smallest_feature_map(model: nn.Module, channels: int, size: int) -> int:
    """Side of the smallest map any Conv2d of `model` produces for a `size` px input (one
    forward on zeros, in eval mode so BatchNorm accepts a batch of one)."""
    sides: list[int] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sides.append(min(out.shape[-2:])))
        for m in model.modules()
        if isinstance(m, nn.Conv2d)
    ]
    training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, channels, size, size))
    finally:
        model.train(training)
        for h in hooks:
            h.remove()
    return min(sides, default=size)


def warn_if_maps_collapse(model: nn.Module, channels: int, resolution: Resolution, model_name: str) -> None:
    """At 1x1 maps a 3x3 kernel trains only its centre tap: features learnt there do not carry
    over to full size (resnet18 at 32 px, README "Training resolution")."""
    size = resolution.smallest_size()
    side = smallest_feature_map(model, channels, size)
    if side < 2:
        log.warning(
            "data.resolution=%s trains some batches at %d px, where %s's smallest feature map is %dx%d and its "
            "kernels learn little that carries over to %d px: raise data.progressive_start / data.resolution_scale",
            resolution.mode,
            size,
            model_name,
            side,
            side,
            resolution.nominal,
        )
